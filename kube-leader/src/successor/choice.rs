//! The successor a leader that steps down names: the youngest live registration.

use k8s_openapi::{
    api::coordination::v1::Lease,
    jiff::{SignedDuration, Timestamp},
};

/// The youngest live registration's identity among `registrations`, other than `me`, at `now`.
/// A registration without a duration (a candidate with a Pod) is live while it exists; one with
/// a duration (a candidate without a Pod) for that long after its last renewal, by the wall
/// clock (three heartbeats, which absorbs clock skew of seconds). Ties go to the greater
/// identity, so that every leader's choice is the same.
pub(crate) fn youngest<'a>(
    registrations: impl IntoIterator<Item = &'a Lease>,
    me: &str,
    now: Timestamp,
) -> Option<String> {
    registrations
        .into_iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter_map(|r| {
            let spec = r.spec.as_ref()?;
            let identity = spec
                .holder_identity
                .as_deref()
                .filter(|i| !i.is_empty() && *i != me)?;
            if let Some(seconds) = spec.lease_duration_seconds {
                let renewed = spec.renew_time.as_ref()?.0;
                let live = SignedDuration::from_secs(i64::from(seconds));
                if renewed.checked_add(live).ok()? < now {
                    return None;
                }
            }
            let since = spec
                .acquire_time
                .as_ref()
                .map(|t| t.0)
                .or_else(|| r.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
            Some((since, identity))
        })
        .max()
        .map(|(_, identity)| identity.to_string())
}
