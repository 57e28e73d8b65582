//! Fair shares: how many shards each live candidate holds, and which ones it prefers.
//!
//! Every candidate computes the same quotas from the same membership: with M shards and N live
//! candidates sorted by identity, the first `M mod N` hold `⌈M/N⌉` and the others `⌊M/N⌋`, so
//! the quotas add up to exactly M and no two differ by more than one. Which shards a candidate
//! takes or hands over follows a preference that differs per candidate (rendezvous hashing), so
//! that candidates racing for free shards mostly go for different ones, and a candidate keeps
//! the same shards across rebalances as far as it can.

/// The number of shards `me` should hold, out of `shards`, when `members` (sorted, deduplicated,
/// containing `me`) are the live candidates.
pub(crate) fn quota(shards: u32, members: &[String], me: &str) -> u32 {
    let n = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
    let rank = members.iter().position(|m| m == me).unwrap_or(members.len());
    let rank = u32::try_from(rank).unwrap_or(u32::MAX);
    shards / n + u32::from(rank < shards % n)
}

/// How much `identity` prefers shard `index` (greater: more): a hash of both, the same on
/// every machine and release.
pub(crate) fn preference(identity: &str, index: u32) -> u64 {
    // FNV-1a over the identity and the index, then SplitMix64's finaliser to spread the bits.
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for b in identity.bytes().chain(index.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// What to do to reach the quota.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Held shards to hand over (least preferred first).
    pub(crate) release: Vec<u32>,
    /// Free shards to take (most preferred first).
    pub(crate) acquire: Vec<u32>,
}

/// The plan of `identity`, holding (or acquiring) `held`, with `free` shards takeable now.
pub(crate) fn plan(identity: &str, quota: u32, held: &[u32], free: &[u32]) -> Plan {
    let quota = quota as usize;
    let mut plan = Plan::default();
    if held.len() > quota {
        let mut by_pref: Vec<u32> = held.to_vec();
        by_pref.sort_by_key(|i| (preference(identity, *i), *i));
        by_pref.truncate(held.len() - quota);
        plan.release = by_pref;
    } else if held.len() < quota {
        let mut by_pref: Vec<u32> = free.to_vec();
        by_pref.sort_by_key(|i| std::cmp::Reverse((preference(identity, *i), *i)));
        by_pref.truncate(quota - held.len());
        plan.acquire = by_pref;
    }
    plan
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn members(n: usize) -> Vec<String> {
        let mut m: Vec<String> = (0..n).map(|i| format!("replica-{i}")).collect();
        m.sort();
        m
    }

    #[test]
    fn quotas_add_up_and_differ_by_at_most_one() {
        for shards in [0, 1, 2, 7, 64, 100, 1000] {
            for n in 1..=12 {
                let m = members(n);
                let q: Vec<u32> = m.iter().map(|me| quota(shards, &m, me)).collect();
                assert_eq!(
                    q.iter().sum::<u32>(),
                    shards,
                    "{shards} shards, {n} members: {q:?}"
                );
                let (min, max) = (q.iter().min().unwrap(), q.iter().max().unwrap());
                assert!(max - min <= 1, "{q:?}");
                assert_eq!(*max, shards.div_ceil(n as u32));
            }
        }
    }

    #[test]
    fn a_candidate_missing_from_its_own_view_takes_the_small_share() {
        let m = members(3);
        assert_eq!(quota(100, &m, "stranger"), 33);
        assert_eq!(quota(100, &[], "me"), 100);
    }

    #[test]
    fn preferences_differ_between_candidates() {
        let a: Vec<u32> = {
            let mut v: Vec<u32> = (0..100).collect();
            v.sort_by_key(|i| preference("a", *i));
            v
        };
        let b: Vec<u32> = {
            let mut v: Vec<u32> = (0..100).collect();
            v.sort_by_key(|i| preference("b", *i));
            v
        };
        assert_ne!(a, b);
        // Stable: the same on every call (and machine).
        assert_eq!(preference("a", 7), preference("a", 7));
    }

    #[test]
    fn surplus_is_released_and_deficit_taken() {
        let p = plan("a", 2, &[1, 2, 3, 4], &[]);
        assert_eq!(p.release.len(), 2);
        assert!(p.acquire.is_empty());
        let p = plan("a", 3, &[1], &[5, 6, 7, 8]);
        assert_eq!(p.acquire.len(), 2);
        assert!(p.release.is_empty());
        assert_eq!(plan("a", 1, &[1], &[2]), Plan::default());
    }

    /// A model of the protocol: each round every candidate, from the same membership, hands
    /// over its surplus and takes free shards it prefers (one wins each contested shard). It
    /// converges to quotas within one of fair, after start, a join and a crash.
    #[test]
    fn candidates_converge_to_fair_shares() {
        let shards = 100;
        let mut holder: BTreeMap<u32, String> = BTreeMap::new();
        let run = |live: &[String], holder: &mut BTreeMap<u32, String>| {
            for _round in 0..10 {
                for me in live {
                    let q = quota(shards, live, me);
                    let held: Vec<u32> = holder.iter().filter(|(_, h)| *h == me).map(|(i, _)| *i).collect();
                    let free: Vec<u32> = (0..shards).filter(|i| !holder.contains_key(i)).collect();
                    let p = plan(me, q, &held, &free);
                    for i in p.release {
                        holder.remove(&i);
                    }
                    for i in p.acquire {
                        holder.entry(i).or_insert_with(|| me.clone());
                    }
                }
            }
            let counts: Vec<usize> = live
                .iter()
                .map(|me| holder.values().filter(|h| *h == me).count())
                .collect();
            assert_eq!(counts.iter().sum::<usize>(), shards as usize, "{counts:?}");
            let fair = shards as f64 / live.len() as f64;
            assert!(
                counts.iter().all(|c| (*c as f64 - fair).abs() < 1.0),
                "{counts:?} vs fair {fair}"
            );
        };
        let mut live = members(2);
        run(&live, &mut holder);
        live = members(3); // a join
        run(&live, &mut holder);
        let dead = live.remove(1); // a crash: its shards expire
        holder.retain(|_, h| *h != dead);
        run(&live, &mut holder);
    }
}
