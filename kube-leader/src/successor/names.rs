//! The names a registration goes by (its object name and label value) and the preferred-holder
//! annotation's value.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::PREFERRED_HOLDER_ANNOTATION;

/// The name of `identity`'s registration for the lock `lock` of `kind`.
pub(crate) fn registration_name(lock: &str, kind: &str, identity: &str) -> String {
    // A DNS-1123 subdomain of at most 253 characters: the lock's name (one already) cut short
    // enough, and a hash that tells identities (and lock kinds) apart.
    let hash = fnv1a(&[kind.as_bytes(), b"/", identity.as_bytes()]);
    let prefix: String = lock.chars().take(253 - 11 - 16).collect();
    let prefix = prefix.trim_end_matches(['.', '-']);
    format!("{prefix}-candidate-{hash:016x}")
}

/// A label value for the lock's name: itself if it is one, else a hash.
pub(super) fn label_value(lock: &str) -> String {
    let valid = lock.len() <= 63
        && lock
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && lock.starts_with(|c: char| c.is_ascii_alphanumeric())
        && lock.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        lock.to_string()
    } else {
        format!("h-{:016x}", fnv1a(&[lock.as_bytes()]))
    }
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The annotation value naming `identity` as the successor of a release written at `released`.
pub(crate) fn preferred_value(released: Timestamp, identity: &str) -> String {
    format!("{} {identity}", truncate_micros(released))
}

/// The successor `annotations` prefer for the release written at `released` (see
/// [`PREFERRED_HOLDER_ANNOTATION`]); `None` if they name none, or name one for another release.
pub(crate) fn preferred_for(
    annotations: Option<&BTreeMap<String, String>>,
    released: Option<Timestamp>,
) -> Option<String> {
    let value = annotations?.get(PREFERRED_HOLDER_ANNOTATION)?;
    let (at, identity) = value.split_once(' ')?;
    let at: Timestamp = at.parse().ok()?;
    (Some(at) == released.map(truncate_micros) && !identity.is_empty()).then(|| identity.to_string())
}

/// `t` at microsecond precision (a Lease's `MicroTime`).
pub(super) fn truncate_micros(t: Timestamp) -> Timestamp {
    let nanos = t.as_nanosecond();
    Timestamp::from_nanosecond(nanos - nanos.rem_euclid(1_000)).unwrap_or(t)
}
