//! The decision steps of a leader-for-life candidate, recorded for trace checking (issue 43).
//!
//! As the Lease strategy's (`lease/term/steps.rs`, whose `emit` and instants these share): each
//! step is a `tracing` event of target `kube_leader::step` at level `TRACE`, with a field `kind`
//! and a field `step` (JSON), built only when a subscriber listens to that target. The campaign
//! reports its start, each decision with its inputs (the lock and the leader Pod as seen, the
//! instant, the policy) and output, each write with its precondition and answer, the dead Pod's
//! deletion and the term's beginning; the holder reports each lock seen (`lock_loss`), its own
//! Pod seen (`pod_ending`), each heartbeat (`beat`, `confirmed`) and its release's mark. The
//! replayer (`src/model/trace/for_life.rs`) decodes them with the functions here.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{
    config::DeadLeaderPod,
    decide::{Decision, Inputs, Policy},
    holder::{Beats, Liveness, Mark},
    record::{LeaderPod, PodRef, PodView},
};
use crate::{
    api::Failure,
    leadership::LossReason,
    lease::term::steps::{emit, failure, ns},
};

/// The preconditions of a write: the UID and the resourceVersion it is conditional on.
pub(crate) type Pre<'a> = (Option<&'a str>, Option<&'a str>);

/// A campaign begins: the candidate's Pod, and how long it defers to a preferred successor.
pub(crate) fn campaign(me: &PodRef, successor_wait: Duration) {
    emit(
        "campaign",
        || json!({"me": pod_ref(me), "successor_wait_ms": successor_wait.as_millis() as u64}),
    );
}

/// A decision of the campaign: its inputs (`lock`: the lock as seen, `leader_pod`: the watched
/// leader Pod's name) and its output, after the deferral to a preferred successor, with the
/// dead Pod a create would delete.
pub(crate) fn decided(
    lock: Option<&ConfigMap>,
    leader_pod: Option<&str>,
    i: &Inputs<'_>,
    decision: &Decision,
    dead_pod: Option<&PodRef>,
) {
    emit("decide", || {
        json!({"now": ns(i.now), "lock": lock.map(config_map),
            "leader_pod": leader_pod.map(|n| json!({"name": n, "state": self::leader_pod(i.leader_pod)})),
            "node_not_ready_since": i.node_not_ready_since.map(ns), "policy": policy(&i.policy),
            "decision": self::decision(decision), "dead_pod": dead_pod.map(pod_ref)})
    });
}

/// A write sent at `sent` (`op`: `create`, `adopt`, `delete`, `token`, `beat`, `mark`,
/// `release_delete`, `say_stopped`), with its preconditions, the lock sent and the answer
/// (`written`: the lock the answer carries, if any).
pub(crate) fn write<T>(
    op: &'static str,
    (uid, rv): Pre<'_>,
    lock: Option<&ConfigMap>,
    sent: Instant,
    answer: &Result<T, Failure>,
    written: impl Fn(&T) -> Option<&ConfigMap>,
) {
    emit("write", || {
        let answer = match answer {
            Ok(t) => json!({"ok": written(t).map(config_map)}),
            Err(f) => json!({ "failed": failure(f) }),
        };
        json!({"op": op, "precondition": {"uid": uid, "rv": rv}, "lock": lock.map(config_map),
            "sent": ns(sent), "now": ns(Instant::now()), "answer": answer})
    });
}

/// The lock a write's answer carries (a create's or an update's).
pub(crate) fn written(cm: &ConfigMap) -> Option<&ConfigMap> {
    Some(cm)
}

/// The dead leader's Pod deleted (in the background, UID precondition).
pub(crate) fn delete_pod(pod: &PodRef) {
    emit("delete_pod", || json!({ "pod": pod_ref(pod) }));
}

/// The term begins: its fencing token, its lock, and its heartbeat's first confirmation.
pub(crate) fn lead(
    token: u64,
    restarted: bool,
    token_stored: bool,
    lock: &ConfigMap,
    heartbeat: Option<(Liveness, Instant)>,
) {
    emit("lead", || {
        let beat = heartbeat.map(|(l, sent)| {
            json!({"sent": ns(sent), "confirm_ms": l.confirm.as_millis() as u64,
                "advertised_ms": l.advertised.as_millis() as u64,
                "confirmed_until": ns(Beats::new(l, sent).confirmed_until())})
        });
        json!({"token": token, "restarted": restarted, "token_stored": token_stored,
            "lock": config_map(lock), "heartbeat": beat})
    });
}

/// The holder saw its lock (`None`: gone; `from`: `watch`, or `beat` after a heartbeat's
/// conflict) and [`lock_loss`](super::holder::lock_loss) said `loss`.
pub(crate) fn lock_loss(
    from: &'static str,
    lock_uid: &str,
    lock: Option<&ConfigMap>,
    loss: Option<&LossReason>,
) {
    emit("lock_loss", || {
        json!({"from": from, "lock_uid": lock_uid, "lock": lock.map(config_map),
            "loss": loss.map(|l| format!("{l:?}"))})
    });
}

/// The holder saw its own Pod (`None`: gone) and [`pod_ending`](super::holder::pod_ending)
/// said `why`.
pub(crate) fn pod_ending(pod: Option<&PodView>, why: Option<&str>) {
    emit("pod_ending", || json!({"pod": pod.map(pod_view), "why": why}));
}

/// A heartbeat written, sent at `sent` (its write is a `write` step of op `beat`): confirmed
/// until `until`.
pub(crate) fn confirmed(sent: Instant, until: Instant) {
    emit("confirmed", || json!({"sent": ns(sent), "until": ns(until)}));
}

/// A heartbeat due at `due` about to be sent.
pub(crate) fn beat(due: Instant) {
    emit("beat", || json!({"due": ns(due), "now": ns(Instant::now())}));
}

/// The release read its lock (`lock`) and [`release_mark`](super::holder::release_mark) said
/// `mark`.
pub(crate) fn release_mark(lock: &ConfigMap, mark: Mark) {
    emit(
        "release_mark",
        || json!({"lock": config_map(lock), "mark": format!("{mark:?}")}),
    );
}

// === encoding ===

/// A lock, as the API server's JSON, without its managed fields.
pub(crate) fn config_map(cm: &ConfigMap) -> Value {
    let mut cm = cm.clone();
    cm.metadata.managed_fields = None;
    serde_json::to_value(cm).unwrap_or(Value::Null)
}

pub(crate) fn pod_ref(p: &PodRef) -> Value {
    json!({"name": p.name, "uid": p.uid})
}

pub(crate) fn pod_view(v: &PodView) -> Value {
    json!({"uid": v.uid, "phase": v.phase, "reason": v.reason, "deleting": v.deleting,
        "graceful_deletion": v.graceful_deletion, "node_name": v.node_name,
        "grace_ns": v.grace.as_nanos() as u64, "phase_by_kubelet": v.phase_by_kubelet,
        "disruption_target": v.disruption_target})
}

pub(crate) fn leader_pod(p: &LeaderPod) -> Value {
    match p {
        LeaderPod::Unknown => json!("unknown"),
        LeaderPod::Absent => json!("absent"),
        LeaderPod::Present(v) => json!({ "present": pod_view(v) }),
    }
}

pub(crate) fn policy(p: &Policy) -> Value {
    let dead = match p.dead_leader_pod {
        DeadLeaderPod::Keep => "keep",
        DeadLeaderPod::DeleteEvicted => "delete_evicted",
        DeadLeaderPod::DeleteTerminal => "delete_terminal",
    };
    json!({"dead_leader_pod": dead,
        "not_ready_takeover_ns": p.not_ready_takeover.map(|d| d.as_nanos() as u64),
        "kubelet_terminal_proof": p.kubelet_terminal_proof})
}

/// A decision (its reasons and proofs as their `Debug` text: they hold no instant).
pub(crate) fn decision(d: &Decision) -> Value {
    match d {
        Decision::Create => json!("create"),
        Decision::Continue => json!("continue"),
        Decision::DeleteLock {
            lock_uid,
            why,
            proof,
            delete_pod,
        } => json!({"delete_lock": {"lock_uid": lock_uid, "why": format!("{why:?}"),
            "proof": format!("{proof:?}"), "delete_pod": delete_pod.as_ref().map(pod_ref)}}),
        Decision::Wait { why, recheck_at } => json!({"wait": {"why": format!("{why:?}"),
            "recheck_at": recheck_at.map(ns)}}),
    }
}

// === decoding, for the replayer ===

/// A lock, from [`config_map`]'s JSON (`None`: null).
#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn config_map_from(v: &Value) -> Result<Option<ConfigMap>, String> {
    match v {
        Value::Null => Ok(None),
        v => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| e.to_string()),
    }
}

#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn pod_ref_from(v: &Value) -> Option<PodRef> {
    Some(PodRef {
        name: v["name"].as_str()?.to_string(),
        uid: v["uid"].as_str()?.to_string(),
    })
}

#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn pod_view_from(v: &Value) -> Option<PodView> {
    let s = |k: &str| v[k].as_str().map(str::to_string);
    Some(PodView {
        uid: s("uid")?,
        phase: s("phase"),
        reason: s("reason"),
        deleting: v["deleting"].as_bool()?,
        graceful_deletion: v["graceful_deletion"].as_bool()?,
        node_name: s("node_name"),
        grace: Duration::from_nanos(v["grace_ns"].as_u64()?),
        phase_by_kubelet: v["phase_by_kubelet"].as_bool()?,
        disruption_target: s("disruption_target"),
    })
}

#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn leader_pod_from(v: &Value) -> Option<LeaderPod> {
    match v.as_str() {
        Some("unknown") => Some(LeaderPod::Unknown),
        Some("absent") => Some(LeaderPod::Absent),
        _ => pod_view_from(&v["present"]).map(LeaderPod::Present),
    }
}

#[cfg(any(test, feature = "trace-check"))]
pub(crate) fn policy_from(v: &Value) -> Option<Policy> {
    Some(Policy {
        dead_leader_pod: match v["dead_leader_pod"].as_str()? {
            "keep" => DeadLeaderPod::Keep,
            "delete_evicted" => DeadLeaderPod::DeleteEvicted,
            "delete_terminal" => DeadLeaderPod::DeleteTerminal,
            _ => return None,
        },
        not_ready_takeover: match &v["not_ready_takeover_ns"] {
            Value::Null => None,
            n => Some(Duration::from_nanos(n.as_u64()?)),
        },
        kubelet_terminal_proof: v["kubelet_terminal_proof"].as_bool()?,
    })
}
