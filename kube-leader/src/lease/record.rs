//! The leader election record kept in a Lease, as client-go reads and writes it.

use std::time::{Duration, SystemTime};

use std::collections::BTreeMap;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};

use crate::{
    leadership::LossReason,
    lock::{FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION},
};

/// The election record of a Lease (client-go's `LeaderElectionRecord`).
///
/// Parsing is total: null or missing fields, written by anybody, give `None` or 0 rather than an
/// error, exactly as client-go's `LeaseSpecToLeaderElectionRecord` treats them.
///
/// To write one, start from [`Default`] (nobody holds it) and set the fields: the struct may
/// gain fields in a minor release.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseRecord {
    /// The holder; `None` when empty or missing (a released or never-held lease).
    pub holder: Option<String>,
    /// The holder's advertised lease duration (`leaseDurationSeconds`); `None` if missing or not
    /// positive.
    pub lease_duration: Option<Duration>,
    /// When the holder acquired the lease (its wall clock; informational only).
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed (its wall clock; informational only, never used for expiry).
    pub renew_time: Option<Timestamp>,
    /// How many times the holder changed (`leaseTransitions`); 0 if missing or negative.
    pub transitions: u32,
}

// === impl LeaseRecord ===

impl LeaseRecord {
    /// Reads the record of a Lease.
    pub fn from_lease(lease: &Lease) -> Self {
        lease.spec.as_ref().map(Self::from_spec).unwrap_or_default()
    }

    /// Reads the record of a Lease spec.
    pub fn from_spec(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            lease_duration: spec
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.unsigned_abs().into())),
            acquire_time: spec.acquire_time.as_ref().and_then(kubernetes_time),
            renew_time: spec.renew_time.as_ref().and_then(kubernetes_time),
            transitions: spec
                .lease_transitions
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(0),
        }
    }

    /// Writes the record into a Lease spec, keeping fields this crate does not manage.
    pub fn write_to(&self, spec: &mut LeaseSpec, lease_duration_seconds: i32) {
        spec.holder_identity = Some(self.holder.clone().unwrap_or_default());
        spec.lease_duration_seconds = Some(lease_duration_seconds);
        spec.acquire_time = self.acquire_time.map(MicroTime);
        spec.renew_time = self.renew_time.map(MicroTime);
        spec.lease_transitions = Some(i32::try_from(self.transitions).unwrap_or(i32::MAX));
    }

    /// Whether `identity` holds this record.
    pub fn is_held_by(&self, identity: &str) -> bool {
        self.holder.as_deref() == Some(identity)
    }

    /// `acquire_time` as a `SystemTime`.
    pub fn acquired_at(&self) -> Option<SystemTime> {
        self.acquire_time.map(SystemTime::from)
    }

    /// `renew_time` as a `SystemTime`.
    pub fn renewed_at(&self) -> Option<SystemTime> {
        self.renew_time.map(SystemTime::from)
    }
}

/// Which candidate process wrote a Lease's record: `<instance id> <renewTime>`, written by
/// every kube-leader write of the record (acquire and renew) beside the client-go fields.
///
/// A candidate's identity names it to others, but two processes can share one (a copied
/// `--identity`, two containers of one Pod, host names under `hostNetwork`). The instance id is
/// random per candidate, so a candidate tells its own writes from a twin's; the renewTime ties
/// the annotation to the record it was written with, so a client-go process with the same
/// identity (which keeps annotations it does not know) is told apart too.
pub const INSTANCE_ANNOTATION: &str = "kube-leader.io/instance";

/// Marks `lease` as written by `instance` for `record` (see [`INSTANCE_ANNOTATION`]).
pub(crate) fn set_writer(lease: &mut Lease, instance: &str, record: &LeaseRecord) {
    let a = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match record.renew_time {
        Some(t) if record.holder.is_some() => {
            a.insert(INSTANCE_ANNOTATION.to_string(), format!("{instance} {t}"));
        }
        _ => {
            a.remove(INSTANCE_ANNOTATION);
        }
    }
}

/// Whether `instance` wrote `lease`'s record (`record`, read from it): the annotation names
/// the instance and the renewTime the record has.
pub(crate) fn written_by(lease: &Lease, record: &LeaseRecord, instance: &str) -> bool {
    let Some(value) = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTANCE_ANNOTATION))
    else {
        return false;
    };
    let Some((id, time)) = value.split_once(' ') else {
        return false;
    };
    id == instance && record.renew_time.is_some() && time.parse::<Timestamp>().ok() == record.renew_time
}

/// Who owns a Lease's record, as seen by a candidate that holds (or held) a term on it. The
/// single-Lease keeper and every shard ask "is this term still mine" here, and only here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Held by this identity and written by this process (its instance id): still this term's.
    Mine,
    /// Held by this identity but written by another process: two candidates share the identity.
    Twin,
    /// Held by another identity, or by nobody (`""`: released).
    Other(String),
}

impl Owner {
    /// Who owns `lease` (whose record is `record`), as seen by the candidate `identity` in the
    /// process `instance` (see [`written_by`]).
    pub(crate) fn of(lease: &Lease, record: &LeaseRecord, identity: &str, instance: &str) -> Self {
        if !record.is_held_by(identity) {
            Owner::Other(record.holder.clone().unwrap_or_default())
        } else if written_by(lease, record, instance) {
            Owner::Mine
        } else {
            Owner::Twin
        }
    }

    /// Why a term of `identity` on this record is over; `None` while it is still [`Mine`](Self::Mine).
    pub(crate) fn loss(self, identity: &str) -> Option<LossReason> {
        match self {
            Owner::Mine => None,
            Owner::Twin => Some(LossReason::DuplicateIdentity {
                identity: identity.to_string(),
            }),
            Owner::Other(holder) => Some(LossReason::OtherHolder { holder }),
        }
    }
}

/// A new random instance id: 64 bits, hex.
pub(crate) fn new_instance_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The fencing token a kube-leader holder stored in its Lease (annotations
/// [`FENCING_TOKEN_ANNOTATION`] and [`HOLDER_ANNOTATION`]), if they name the holder of
/// `record` (the Lease's own record).
///
/// A kube-leader leader writes them with its first renewal (its token is the `resourceVersion`
/// of the write that made it leader, so it cannot be in that write); a takeover clears them. A
/// client-go holder keeps whatever annotations it found, so they count only while the holder
/// they name is the holder of the record.
pub(crate) fn stored_fencing_token(lease: &Lease, record: &LeaseRecord) -> Option<u64> {
    let annotations = lease.metadata.annotations.as_ref()?;
    let holder = record.holder.as_deref()?;
    if annotations.get(HOLDER_ANNOTATION).map(String::as_str) != Some(holder) {
        return None;
    }
    annotations.get(FENCING_TOKEN_ANNOTATION)?.trim().parse().ok()
}

/// The successor a released `lease` (its record: `record`) prefers, if any.
pub(crate) fn preferred_in(lease: &Lease, record: &LeaseRecord) -> Option<String> {
    if record.holder.is_some() {
        return None;
    }
    crate::successor::preferred_for(lease.metadata.annotations.as_ref(), record.renew_time)
}

/// Names `successor` as the one the release written at `released` prefers, or (`None`) clears
/// the preference.
pub(crate) fn set_preferred(lease: &mut Lease, successor: Option<(&str, Timestamp)>) {
    use crate::successor::{preferred_value, PREFERRED_HOLDER_ANNOTATION};
    match successor {
        Some((identity, released)) => {
            let a = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            a.insert(
                PREFERRED_HOLDER_ANNOTATION.to_string(),
                preferred_value(released, identity),
            );
        }
        None => {
            if let Some(a) = lease.metadata.annotations.as_mut() {
                a.remove(PREFERRED_HOLDER_ANNOTATION);
            }
        }
    }
}

/// Sets (`Some((holder, token))`) or clears (`None`) the fencing-token annotations of a Lease,
/// keeping every other annotation.
pub(crate) fn set_fencing_token(lease: &mut Lease, token: Option<(&str, u64)>) {
    match token {
        Some((holder, token)) => {
            let a = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            a.insert(HOLDER_ANNOTATION.to_string(), holder.to_string());
            a.insert(FENCING_TOKEN_ANNOTATION.to_string(), token.to_string());
        }
        None => {
            if let Some(a) = lease.metadata.annotations.as_mut() {
                a.remove(HOLDER_ANNOTATION);
                a.remove(FENCING_TOKEN_ANNOTATION);
            }
        }
    }
}

/// A time as Kubernetes can hold it, or `None`. RFC 3339 has four-digit years, so the earliest
/// is 0000-01-01T00:00:00Z; `MicroTime` also parses earlier ones (signed six-digit years, which
/// no API server writes) but would write them back in a form nobody can read: they count as
/// missing. (Later ones than year 9999 do not parse at all.)
fn kubernetes_time(t: &MicroTime) -> Option<Timestamp> {
    /// 0000-01-01T00:00:00Z in Unix seconds.
    const EARLIEST: i64 = -62_167_219_200;
    (t.0.as_second() >= EARLIEST).then_some(t.0)
}

/// The wall-clock time now, at the microsecond precision of a `MicroTime`.
pub(crate) fn now_micro() -> Timestamp {
    let now = Timestamp::now();
    let micros = now.as_microsecond();
    Timestamp::from_microsecond(micros).unwrap_or(now)
}

/// The one place a term's writes are assembled (the single-Lease keeper's and every shard's).
///
/// The renewal of a held term: `record` with `renewTime` `wall_now` (the wall clock, as
/// [`now_micro`] reads it), written into a copy of `lease` with the term's fencing token and
/// this writer's instance. Returns the object to send and the record it carries.
pub(crate) fn renewal_write(
    lease: &Lease,
    record: &LeaseRecord,
    lease_duration_seconds: i32,
    holder: &str,
    fencing_token: u64,
    instance: &str,
    wall_now: Timestamp,
) -> (Lease, LeaseRecord) {
    let mut record = record.clone();
    record.renew_time = Some(wall_now);
    let mut lease = lease.clone();
    record.write_to(
        lease.spec.get_or_insert_with(LeaseSpec::default),
        lease_duration_seconds,
    );
    // Free: renewals write the whole object anyway.
    set_fencing_token(&mut lease, Some((holder, fencing_token)));
    set_writer(&mut lease, instance, &record);
    (lease, record)
}

/// The release of a term: no holder, a one-second duration (client-go's release), no fencing
/// token, the count of transitions kept, and the preferred successor (`None`: none) with the
/// release time `wall_now` (the wall clock, as [`now_micro`] reads it). Returns the object to
/// send and the record it carries.
pub(crate) fn release_write(
    lease: &Lease,
    transitions: u32,
    instance: &str,
    successor: Option<&str>,
    wall_now: Timestamp,
) -> (Lease, LeaseRecord) {
    let now = wall_now;
    let record = LeaseRecord {
        holder: None,
        lease_duration: Some(std::time::Duration::from_secs(1)),
        acquire_time: Some(now),
        renew_time: Some(now),
        transitions,
    };
    let mut lease = lease.clone();
    record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), 1);
    set_fencing_token(&mut lease, None);
    set_preferred(&mut lease, successor.map(|s| (s, now)));
    set_writer(&mut lease, instance, &record);
    (lease, record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record held by "me", renewed now, and a Lease holding it (no writer yet).
    fn held_by_me() -> (LeaseRecord, Lease) {
        let record = LeaseRecord {
            holder: Some("me".into()),
            lease_duration: Some(Duration::from_secs(15)),
            renew_time: Some(now_micro()),
            ..Default::default()
        };
        let mut l = Lease::default();
        record.write_to(l.spec.get_or_insert_with(LeaseSpec::default), 15);
        (record, l)
    }

    #[test]
    fn the_writer_is_told_by_instance_and_renew_time() {
        let (record, mut l) = held_by_me();
        assert!(!written_by(&l, &record, "a"), "no annotation: nobody's");
        set_writer(&mut l, "a", &record);
        assert!(written_by(&l, &record, "a"));
        assert!(!written_by(&l, &record, "b"), "another instance");
        // Round trip through the API's JSON, as a watch delivers it.
        let back: Lease = serde_json::from_value(serde_json::to_value(&l).unwrap()).unwrap();
        assert!(written_by(&back, &LeaseRecord::from_lease(&back), "a"));
        // A twin renewing under the same identity keeps the annotation but not the renewTime.
        let mut renewed = record.clone();
        renewed.renew_time =
            Some(Timestamp::from_microsecond(record.renew_time.unwrap().as_microsecond() + 1).unwrap());
        assert!(!written_by(&l, &renewed, "a"));
        // A release clears it.
        set_writer(&mut l, "a", &LeaseRecord::default());
        assert!(!written_by(&l, &record, "a"));
    }

    #[test]
    fn whose_a_record_is_mine_a_twins_or_another_holders() {
        let (record, mut l) = held_by_me();
        set_writer(&mut l, "a", &record);
        assert_eq!(Owner::of(&l, &record, "me", "a"), Owner::Mine);
        assert_eq!(Owner::of(&l, &record, "me", "a").loss("me"), None);
        // The same identity, another process: both must not lead.
        assert_eq!(Owner::of(&l, &record, "me", "b"), Owner::Twin);
        assert_eq!(
            Owner::Twin.loss("me"),
            Some(LossReason::DuplicateIdentity {
                identity: "me".into()
            })
        );
        assert_eq!(
            Owner::of(&l, &record, "you", "a"),
            Owner::Other("me".into()),
            "held by another identity, whoever wrote it"
        );
        let released = LeaseRecord {
            holder: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(Owner::of(&l, &released, "me", "a"), Owner::Other(String::new()));
        assert_eq!(
            Owner::Other("x".into()).loss("me"),
            Some(LossReason::OtherHolder { holder: "x".into() })
        );
    }

    fn lease(json: serde_json::Value) -> Lease {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l", "namespace": "n"},
            "spec": json,
        }))
        .unwrap()
    }

    #[test]
    fn client_go_record() {
        let l = lease(serde_json::json!({
            "holderIdentity": "go-1", "leaseDurationSeconds": 15,
            "acquireTime": "2026-11-29T22:00:00.123456Z", "renewTime": "2026-11-29T22:00:10.000001Z",
            "leaseTransitions": 4
        }));
        let r = LeaseRecord::from_lease(&l);
        assert_eq!(r.holder.as_deref(), Some("go-1"));
        assert_eq!(r.lease_duration, Some(Duration::from_secs(15)));
        assert_eq!(r.transitions, 4);
        assert_eq!(r.acquire_time.unwrap().to_string(), "2026-11-29T22:00:00.123456Z");
        assert!(r.is_held_by("go-1"));
    }

    #[test]
    fn fencing_token_annotations_count_for_the_holder_they_name() {
        let mut l = lease(serde_json::json!({"holderIdentity": "me"}));
        assert_eq!(stored_fencing_token(&l, &LeaseRecord::from_lease(&l)), None);
        set_fencing_token(&mut l, Some(("me", 42)));
        assert_eq!(stored_fencing_token(&l, &LeaseRecord::from_lease(&l)), Some(42));
        // A client-go takeover keeps the annotations: they name somebody else then.
        l.spec.as_mut().unwrap().holder_identity = Some("go-1".into());
        assert_eq!(stored_fencing_token(&l, &LeaseRecord::from_lease(&l)), None);
        l.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert_eq!(stored_fencing_token(&l, &LeaseRecord::from_lease(&l)), None);
        l.spec.as_mut().unwrap().holder_identity = Some("me".into());
        l.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(FENCING_TOKEN_ANNOTATION.into(), "not a number".into());
        assert_eq!(stored_fencing_token(&l, &LeaseRecord::from_lease(&l)), None);
        l.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("other".into(), "kept".into());
        set_fencing_token(&mut l, None);
        let a = l.metadata.annotations.as_ref().unwrap();
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a["other"], "kept");
    }

    #[test]
    fn null_and_missing_fields() {
        for spec in [
            serde_json::json!({}),
            serde_json::json!({"holderIdentity": null, "leaseDurationSeconds": null,
                               "acquireTime": null, "renewTime": null, "leaseTransitions": null}),
            serde_json::json!({"holderIdentity": "", "leaseDurationSeconds": 0, "leaseTransitions": -3}),
        ] {
            let r = LeaseRecord::from_lease(&lease(spec));
            assert_eq!(r, LeaseRecord::default());
        }
        let no_spec: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"}
        }))
        .unwrap();
        assert_eq!(LeaseRecord::from_lease(&no_spec), LeaseRecord::default());
    }

    /// Found by `tests/props.rs`: a year before 0000 parses, but was written back as
    /// `-001-01-01T00:00:00.000000Z`, which neither an API server nor this crate can read.
    #[test]
    fn times_kubernetes_cannot_hold_count_as_missing() {
        let r = LeaseRecord::from_lease(&lease(serde_json::json!({
            "holderIdentity": "x", "acquireTime": "-000001-01-01T00:00:00Z", "renewTime": "0000-01-01T00:00:00Z"
        })));
        assert_eq!(r.acquire_time, None);
        assert_eq!(r.renew_time.unwrap().to_string(), "0000-01-01T00:00:00Z");
        let mut spec = LeaseSpec::default();
        r.write_to(&mut spec, 0);
        let text = serde_json::to_string(&spec).unwrap();
        let back: LeaseSpec = serde_json::from_str(&text).unwrap();
        assert_eq!(LeaseRecord::from_spec(&back), r);
        assert!(r.renewed_at().is_some());
    }

    /// Other odd values an API server may hold: out-of-range numbers and leap seconds.
    #[test]
    fn odd_numbers_and_times() {
        let r = LeaseRecord::from_lease(&lease(serde_json::json!({
            "leaseDurationSeconds": i32::MAX, "leaseTransitions": i32::MAX,
            "renewTime": "2016-12-31T23:59:60Z", "acquireTime": "2026-01-01T00:00:00+14:00"
        })));
        assert_eq!(r.lease_duration, Some(Duration::from_secs(i32::MAX as u64)));
        assert_eq!(r.transitions, i32::MAX as u32);
        assert_eq!(r.renew_time.unwrap().to_string(), "2016-12-31T23:59:59Z");
        assert_eq!(r.acquire_time.unwrap().to_string(), "2025-12-31T10:00:00Z");
        // Outside int32: the Lease itself does not deserialise (a typed serde error).
        let too_big =
            serde_json::json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 1u64 << 40}});
        assert!(serde_json::from_value::<Lease>(too_big).is_err());
    }

    #[test]
    fn round_trip_keeps_unmanaged_fields() {
        let mut spec = LeaseSpec {
            strategy: Some("Custom".into()),
            ..Default::default()
        };
        let rec = LeaseRecord {
            holder: Some("me".into()),
            lease_duration: Some(Duration::from_secs(2)),
            acquire_time: Some(now_micro()),
            renew_time: Some(now_micro()),
            transitions: 7,
        };
        rec.write_to(&mut spec, 2);
        assert_eq!(spec.strategy.as_deref(), Some("Custom"));
        assert_eq!(LeaseRecord::from_spec(&spec), rec);
        // A released record writes an empty holder, as client-go does.
        let mut released = rec.clone();
        released.holder = None;
        released.write_to(&mut spec, 1);
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
    }
}

/// Fuzzing of the fencing-token annotations of a Lease (issue 5).
#[cfg(test)]
mod props {
    use proptest::{option, prelude::*};

    use super::*;

    proptest! {
        #![proptest_config(crate::proptest_config(256))]

        #[test]
        fn stored_tokens_count_only_for_the_holder_they_name(
            spec_holder in option::of(prop_oneof![Just("me".to_string()), ".{0,6}"]),
            annotated in option::of(prop_oneof![Just("me".to_string()), ".{0,6}"]),
            token in option::of(prop_oneof![any::<u64>().prop_map(|n| n.to_string()), " ?[0-9]{1,22} ?", ".{0,8}"]),
        ) {
            let mut lease = Lease {
                spec: Some(LeaseSpec { holder_identity: spec_holder.clone(), ..LeaseSpec::default() }),
                ..Lease::default()
            };
            let mut a = BTreeMap::new();
            if let Some(h) = &annotated {
                a.insert(HOLDER_ANNOTATION.to_string(), h.clone());
            }
            if let Some(t) = &token {
                a.insert(FENCING_TOKEN_ANNOTATION.to_string(), t.clone());
            }
            lease.metadata.annotations = Some(a);
            let expected = match (&spec_holder, &annotated) {
                (Some(h), Some(a)) if !h.is_empty() && h == a => {
                    token.as_deref().and_then(|t| t.trim().parse::<u64>().ok())
                }
                _ => None,
            };
            prop_assert_eq!(stored_fencing_token(&lease, &LeaseRecord::from_lease(&lease)), expected);
        }
    }
}
