//! The names and labels of a shard set's Leases: the basement that the candidate and its
//! engine share (it imports neither).

use super::balance;
#[cfg(test)]
use crate::lock;

/// The label every Lease of a set carries, with the set's name: the one list/watch selects it.
pub const SHARDS_LABEL: &str = "kube-leader.io/shards";
/// The label telling a shard Lease (`shard`) from a membership Lease (`member`).
pub const ROLE_LABEL: &str = "kube-leader.io/shard-role";
/// The annotation of a membership Lease telling the number of shards its candidate was
/// started with. A candidate that sees a live member with another count fails with
/// [`Error::ShardCountMismatch`](crate::Error::ShardCountMismatch) if that member joined the set before it, and ignores it
/// otherwise (that member fails). Candidates of earlier releases neither write nor read it.
pub const SHARD_COUNT_ANNOTATION: &str = "kube-leader.io/shard-count";

/// The membership Lease of `identity` in the set `name`: `<name>-member-<identity, made a valid
/// name>-<hash>`, so that two identities never share one and nothing is `<name>-<digits>`.
pub fn member_lease_name(name: &str, identity: &str) -> String {
    let mut clean: String = identity
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    clean.truncate(40);
    let clean = clean.trim_matches('-');
    let hash = balance::preference(identity, 0) as u32;
    if clean.is_empty() {
        format!("{name}-member-{hash:08x}")
    } else {
        format!("{name}-member-{clean}-{hash:08x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lease_names_are_valid_and_never_shard_names() {
        for id in ["pod-a", "Pod_A.example", "", "---", &"x".repeat(300), "ä"] {
            let n = member_lease_name("ctl", id);
            lock::validate_name(&n).unwrap_or_else(|e| panic!("{id:?}: {e}"));
            assert!(n.starts_with("ctl-member-"), "{n}");
        }
        assert_ne!(member_lease_name("ctl", "a_b"), member_lease_name("ctl", "a.b"));
    }
}
