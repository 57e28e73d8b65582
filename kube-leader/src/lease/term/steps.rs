//! The decision steps of a Lease candidate, recorded for trace checking (issue 43).
//!
//! The campaign and the keeper report each step they take (what they passed to the decision
//! code, and what came out) as a `tracing` event of target `kube_leader::step` at level `TRACE`, with a
//! field `kind` and a field `step`: the step as JSON. The JSON is built only when a subscriber
//! listens to that target; otherwise a step costs one check of the callsite's interest.
//!
//! Instants are nanoseconds of the process's monotonic clock since a base taken at the first
//! step (negative before it); wall times are RFC 3339. The replayer (`src/model/trace.rs`)
//! decodes them with the functions here.

use std::sync::OnceLock;

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::{
    api::Failure,
    lease::{
        config::LeaseConfig,
        decide::{Absent, Decision, Observed},
        record::LeaseRecord,
        term::{Every, Step, Term},
    },
};

/// Records a write about to be sent (`op`: `create`, or `replace` whose precondition is
/// `lease`'s resourceVersion).
pub(crate) fn emit_write(op: &str, lease: &Lease, r: &LeaseRecord) {
    emit(
        "write",
        || json!({"op": op, "precondition": rv(lease), "lease": self::lease(lease), "record": record(r)}),
    );
}

/// Records the answer to a write of the campaign sent at `sent`.
pub(crate) fn emit_answer(sent: Instant, a: &Result<Lease, Failure>) {
    emit(
        "answer",
        || json!({"sent": ns(sent), "now": ns(Instant::now()), "answer": answer(a)}),
    );
}

/// Records the beginning of the term `held`.
pub(crate) fn emit_lead(cfg: &LeaseConfig, identity: &str, instance: &str, held: &Term<Every>) {
    emit("lead", || {
        json!({"identity": identity, "instance": instance, "token": held.fencing_token(),
            "sent": ns(held.last_sent()), "lease": lease(held.lease()), "record": record(held.record()),
            "retry_ms": cfg.retry_period.as_millis() as u64,
            "lease_duration_seconds": cfg.lease_duration_seconds(),
            "renew_deadline_ms": cfg.renew_deadline.as_millis() as u64,
            "confirmed_until": ns(held.confirmed_until())})
    });
}

/// Whether somebody listens to the steps.
fn listening() -> bool {
    tracing::enabled!(target: "kube_leader::step", tracing::Level::TRACE)
}

/// `build()` if somebody listens to the steps, else null (a part of a step built early).
pub(crate) fn if_listening(build: impl FnOnce() -> Value) -> Value {
    if listening() {
        build()
    } else {
        Value::Null
    }
}

/// Emits the step `kind`, built by `build` only if somebody listens.
pub(crate) fn emit(kind: &'static str, build: impl FnOnce() -> Value) {
    if listening() {
        let step = build();
        tracing::trace!(target: "kube_leader::step", kind, step = %step);
    }
}

/// The base of the recorded instants.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// An instant, in nanoseconds since the base.
pub(crate) fn ns(i: Instant) -> i64 {
    let b = base();
    let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if i >= b {
        nanos(i - b)
    } else {
        -nanos(b - i)
    }
}

/// A record.
pub(crate) fn record(r: &LeaseRecord) -> Value {
    json!({
        "holder": r.holder,
        "lease_duration_ms": r.lease_duration.map(|d| d.as_millis() as u64),
        "acquire_time": r.acquire_time.map(|t| t.to_string()),
        "renew_time": r.renew_time.map(|t| t.to_string()),
        "transitions": r.transitions,
    })
}

/// A Lease, as the API server's JSON.
pub(crate) fn lease(l: &Lease) -> Value {
    serde_json::to_value(l).unwrap_or(Value::Null)
}

/// The resourceVersion of a Lease.
pub(crate) fn rv(l: &Lease) -> Value {
    json!(l.metadata.resource_version)
}

/// An observation.
pub(crate) fn observed(o: &Observed) -> Value {
    json!({
        "record": record(&o.record),
        "rv": o.resource_version,
        "observed_at": ns(o.observed_at),
        "mine": o.mine,
        "preferred": o.preferred,
        "coordinated": o.coordinated,
        "by_kube_leader": o.by_kube_leader,
    })
}

/// What a candidate knows of an absent Lease.
pub(crate) fn absent(a: &Absent<'_>) -> Value {
    match a {
        Absent::Never => json!("never"),
        Absent::Deleted(o) => json!({ "deleted": observed(o) }),
        Absent::Unknown { since } => json!({ "unknown_since": ns(*since) }),
    }
}

/// A decision.
pub(crate) fn decision(d: &Decision) -> Value {
    match d {
        Decision::Create => json!("create"),
        Decision::Takeover => json!("takeover"),
        Decision::Renew => json!("renew"),
        Decision::Follow => json!("follow"),
        Decision::WaitUntil(at) => json!({ "wait_until": ns(*at) }),
    }
}

/// A step of the term machine.
pub(crate) fn step(s: &Step) -> Value {
    match s {
        Step::Keep => json!("keep"),
        Step::Renew { lease: l, until } => json!({ "renew": {
            "precondition": rv(l), "lease": lease(l), "until": ns(*until),
        } }),
        Step::Reread { until } => json!({ "reread": { "until": ns(*until) } }),
        Step::End(reason) => json!({ "end": format!("{reason:?}") }),
    }
}

/// A failed request.
pub(crate) fn failure(f: &Failure) -> Value {
    json!(match f {
        Failure::NotFound => "not_found",
        Failure::Conflict => "conflict",
        Failure::Transient(_) => "transient",
        Failure::Fatal(_) => "fatal",
    })
}

/// The answer to a request for a Lease: `{"ok": lease}` or `{"failed": failure}`.
pub(crate) fn answer(a: &Result<Lease, Failure>) -> Value {
    match a {
        Ok(l) => json!({ "ok": lease(l) }),
        Err(f) => json!({ "failed": failure(f) }),
    }
}

// === decoding, for the replayer ===

/// The instant recorded as `ns` (the inverse of [`ns`]).
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn instant(ns: i64) -> Instant {
    let d = std::time::Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        base() + d
    } else {
        base() - d
    }
}

/// A record, from [`record`]'s JSON.
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn record_from(v: &Value) -> Option<LeaseRecord> {
    let time = |k: &str| -> Option<Option<k8s_openapi::jiff::Timestamp>> {
        match &v[k] {
            Value::Null => Some(None),
            t => t.as_str()?.parse().ok().map(Some),
        }
    };
    Some(LeaseRecord {
        holder: v["holder"].as_str().map(str::to_string),
        lease_duration: v["lease_duration_ms"]
            .as_u64()
            .map(std::time::Duration::from_millis),
        acquire_time: time("acquire_time")?,
        renew_time: time("renew_time")?,
        transitions: u32::try_from(v["transitions"].as_u64()?).ok()?,
    })
}

/// An observation, from [`observed`]'s JSON.
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn observed_from(v: &Value) -> Option<Observed> {
    let s = |k: &str| v[k].as_str().map(str::to_string);
    Some(Observed {
        record: record_from(&v["record"])?,
        resource_version: s("rv"),
        observed_at: instant(v["observed_at"].as_i64()?),
        mine: v["mine"].as_bool()?,
        preferred: s("preferred"),
        coordinated: v["coordinated"].as_bool()?,
        by_kube_leader: v["by_kube_leader"].as_bool()?,
    })
}

/// A Lease, from [`lease`]'s JSON.
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn lease_from(v: &Value) -> Option<Lease> {
    serde_json::from_value(v.clone()).ok()
}

/// A failure, from [`failure`]'s JSON (a fatal one as a transient: the term treats them alike).
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn failure_from(v: &Value) -> Option<Failure> {
    Some(match v.as_str()? {
        "not_found" => Failure::NotFound,
        "conflict" => Failure::Conflict,
        "transient" | "fatal" => Failure::Transient(kube::Error::Api(Box::default())),
        _ => return None,
    })
}

/// An answer, from [`answer`]'s JSON.
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn answer_from(v: &Value) -> Option<Result<Lease, Failure>> {
    match (&v["ok"], &v["failed"]) {
        (Value::Null, f) => failure_from(f).map(Err),
        (l, _) => lease_from(l).map(Ok),
    }
}

/// A wall time, from its RFC 3339 text.
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn wall_from(v: &Value) -> Option<k8s_openapi::jiff::Timestamp> {
    v.as_str()?.parse().ok()
}
