//! The leader-for-life replayer on small handmade traces: a valid one is accepted, and each
//! deliberately broken step (a mutant of the recorded trace) is refused.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::{
    for_life::{
        decide::{Policy, Waiting},
        record::{lock_config_map, with_fencing_token, PodView, RELEASED_ANNOTATION},
        DeadLeaderPod,
    },
    lease::term::steps::ns,
    lock::LockRef,
};

const MS: i64 = 1_000_000;

fn pod(name: &str) -> PodRef {
    PodRef {
        name: name.into(),
        uid: format!("u{name}"),
    }
}

/// A new lock owned by `owner`, as a candidate sends it.
fn new_lock(owner: &PodRef) -> ConfigMap {
    let lock = LockRef::new("ns", "lock").unwrap();
    lock_config_map(&lock, owner, Timestamp::from_second(1_800_000_000).unwrap())
}

/// `cm` as the API server answers it: UID `uid`, resourceVersion `rv`.
fn at(cm: &ConfigMap, uid: &str, rv: u64) -> ConfigMap {
    let mut cm = cm.clone();
    cm.metadata.uid = Some(uid.into());
    cm.metadata.resource_version = Some(rv.to_string());
    cm
}

fn released(cm: &ConfigMap) -> ConfigMap {
    let mut cm = cm.clone();
    let a = cm.metadata.annotations.get_or_insert_with(Default::default);
    a.insert(RELEASED_ANNOTATION.into(), "2027-01-15T08:00:10Z".into());
    cm
}

fn step(kind: &str, step: Value) -> Value {
    json!({"kind": kind, "step": step})
}

fn policy() -> Policy {
    Policy {
        dead_leader_pod: DeadLeaderPod::DeleteEvicted,
        not_ready_takeover: None,
        kubelet_terminal_proof: true,
    }
}

fn view(uid: &str, phase: &str, reason: Option<&str>) -> PodView {
    PodView {
        uid: uid.into(),
        phase: Some(phase.into()),
        reason: reason.map(str::to_string),
        deleting: false,
        graceful_deletion: false,
        node_name: Some("n1".into()),
        grace: Duration::from_secs(30),
        phase_by_kubelet: true,
        disruption_target: None,
    }
}

fn campaign(me: &PodRef) -> Value {
    step(
        "campaign",
        json!({"me": fl::pod_ref(me), "successor_wait_ms": 2000}),
    )
}

fn decide(
    now_ms: i64,
    lock: Option<&ConfigMap>,
    leader: Option<(&str, LeaderPod)>,
    d: &Decision,
    dead: Option<&PodRef>,
) -> Value {
    step(
        "decide",
        json!({"now": now_ms * MS, "lock": lock.map(fl::config_map),
        "leader_pod": leader.map(|(n, p)| json!({"name": n, "state": fl::leader_pod(&p)})),
        "node_not_ready_since": null, "policy": fl::policy(&policy()), "decision": fl::decision(d),
        "dead_pod": dead.map(fl::pod_ref)}),
    )
}

fn write(
    op: &str,
    (uid, rv): (Option<&str>, Option<&str>),
    lock: Option<&ConfigMap>,
    sent_ms: i64,
    answer: Value,
) -> Value {
    step(
        "write",
        json!({"op": op, "precondition": {"uid": uid, "rv": rv}, "lock": lock.map(fl::config_map),
        "sent": sent_ms * MS, "now": (sent_ms + 1) * MS, "answer": answer}),
    )
}

fn ok(cm: Option<&ConfigMap>) -> Value {
    json!({"ok": cm.map(fl::config_map)})
}

fn lead(token: u64, restarted: bool, stored: bool, lock: &ConfigMap, beat: Value) -> Value {
    step(
        "lead",
        json!({"token": token, "restarted": restarted, "token_stored": stored,
        "lock": fl::config_map(lock), "heartbeat": beat}),
    )
}

/// The locks of [`leader`]: created (10), its token stored (11), a heartbeat (12), marked
/// released (13).
struct Locks {
    created: ConfigMap,
    stored: ConfigMap,
    beaten: ConfigMap,
    marked: ConfigMap,
}

fn locks() -> Locks {
    let b = pod("b");
    let created = at(&new_lock(&b), "L1", 10);
    let stored = at(&with_fencing_token(created.clone(), 10), "L1", 11);
    let beaten = at(&stored, "L1", 12);
    let marked = at(&released(&beaten), "L1", 13);
    Locks {
        created,
        stored,
        beaten,
        marked,
    }
}

/// Pod `b` creates the lock (10) with a heartbeat of 3 s, stores its token (11); its first
/// heartbeat, on the created lock, conflicts, is written again at once on the lock re-read
/// (12), and confirms the term; then it releases: marks the lock (13) and deletes it.
fn leader() -> Trace {
    let (b, l) = (pod("b"), locks());
    let liveness = Liveness {
        confirm: Duration::from_secs(3),
        advertised: Duration::from_secs(3),
    };
    let mut beats = Beats::new(liveness, instant(MS));
    let first = ns(beats.confirmed_until());
    let due = ns(beats.first_due());
    let until = ns(beats.written(instant(due + 2 * MS)));
    let tokened = with_fencing_token(l.created.clone(), 10);
    Trace {
        candidate: "b".into(),
        steps: vec![
            campaign(&b),
            decide(0, None, None, &Decision::Create, None),
            write(
                "create",
                (None, None),
                Some(&new_lock(&b)),
                1,
                ok(Some(&l.created)),
            ),
            lead(
                10,
                false,
                false,
                &l.created,
                json!({"sent": MS, "confirm_ms": 3000, "advertised_ms": 3000, "confirmed_until": first}),
            ),
            write(
                "token",
                (Some("L1"), Some("10")),
                Some(&tokened),
                3,
                ok(Some(&l.stored)),
            ),
            step("beat", json!({"due": due, "now": due})),
            write(
                "beat",
                (Some("L1"), Some("10")),
                Some(&tokened),
                due / MS,
                json!({"failed": "conflict"}),
            ),
            step(
                "lock_loss",
                json!({"from": "beat", "lock_uid": "L1", "lock": fl::config_map(&l.stored), "loss": null}),
            ),
            step("beat", json!({"due": due, "now": due + MS})),
            write(
                "beat",
                (Some("L1"), Some("11")),
                Some(&l.stored),
                due / MS + 2,
                ok(Some(&l.beaten)),
            ),
            step("confirmed", json!({"sent": due + 2 * MS, "until": until})),
            step(
                "release_mark",
                json!({"lock": fl::config_map(&l.beaten), "mark": "Write"}),
            ),
            write(
                "mark",
                (Some("L1"), Some("12")),
                Some(&released(&l.beaten)),
                5000,
                ok(Some(&l.marked)),
            ),
            write("release_delete", (Some("L1"), None), None, 5002, ok(None)),
        ],
    }
}

/// Pod `c` waits while `b` leads, takes the released lock over (deletes it on the mark), and
/// creates its own (15).
fn follower() -> Trace {
    let (b, c, l) = (pod("b"), pod("c"), locks());
    let running = || Some(("b", LeaderPod::Present(view("ub", "Running", None))));
    let wait = Decision::Wait {
        why: Waiting::Leader { holder: "b".into() },
        recheck_at: None,
    };
    let take = Decision::DeleteLock {
        lock_uid: "L1".into(),
        why: Stale::Released { holder: "b".into() },
        proof: Proof::Released,
        delete_pod: None,
    };
    let mine = at(&new_lock(&c), "L2", 15);
    let _ = b;
    Trace {
        candidate: "c".into(),
        steps: vec![
            campaign(&c),
            decide(100, Some(&l.beaten), running(), &wait, None),
            decide(5001, Some(&l.marked), running(), &take, None),
            write("delete", (Some("L1"), None), None, 5002, ok(None)),
            decide(5004, None, running(), &Decision::Create, None),
            write("create", (None, None), Some(&new_lock(&c)), 5005, ok(Some(&mine))),
            lead(15, false, false, &mine, Value::Null),
        ],
    }
}

/// Pod `b`, restarted, finds its own lock (as `b` left it at 12) and adopts it (20).
fn restarted() -> Trace {
    let (b, l) = (pod("b"), locks());
    let adopted = at(&l.beaten, "L1", 20);
    Trace {
        candidate: "b-again".into(),
        steps: vec![
            campaign(&b),
            decide(0, Some(&l.beaten), None, &Decision::Continue, None),
            write(
                "adopt",
                (Some("L1"), Some("12")),
                Some(&l.beaten),
                1,
                ok(Some(&adopted)),
            ),
            lead(10, true, true, &adopted, Value::Null),
        ],
    }
}

/// Pod `c` takes over from the evicted `b` (its kubelet's terminal phase), creates its lock (15)
/// and then deletes the dead Pod.
fn after_eviction() -> Trace {
    let (b, c, l) = (pod("b"), pod("c"), locks());
    let evicted = || Some(("b", LeaderPod::Present(view("ub", "Failed", Some("Evicted")))));
    let take = Decision::DeleteLock {
        lock_uid: "L1".into(),
        why: Stale::LeaderPodTerminated {
            holder: "b".into(),
            phase: "Failed".into(),
            reason: Some("Evicted".into()),
        },
        proof: Proof::KubeletTerminal,
        delete_pod: Some(b.clone()),
    };
    let mine = at(&new_lock(&c), "L2", 15);
    Trace {
        candidate: "c".into(),
        steps: vec![
            campaign(&c),
            decide(100, Some(&l.created), evicted(), &take, None),
            write("delete", (Some("L1"), None), None, 101, ok(None)),
            decide(103, None, evicted(), &Decision::Create, Some(&b)),
            write("create", (None, None), Some(&new_lock(&c)), 104, ok(Some(&mine))),
            step("delete_pod", json!({"pod": fl::pod_ref(&b)})),
            lead(15, false, false, &mine, Value::Null),
        ],
    }
}

fn refused(traces: &[Trace], why: &str) {
    let report = replay(traces);
    assert!(!report.violations.is_empty(), "accepted: {why}");
    eprintln!("refused ({why}): {:?}", report.violations);
}

/// The `n`th step of `kind` in `t`.
fn nth<'t>(t: &'t mut Trace, kind: &str, n: usize) -> &'t mut Value {
    t.steps
        .iter_mut()
        .filter(|s| s["kind"] == kind)
        .nth(n)
        .expect("such a step")
}

#[test]
fn valid_traces_are_accepted() {
    for traces in [
        vec![leader(), follower()],
        vec![restarted()],
        vec![after_eviction()],
    ] {
        let report = replay(&traces);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert!(report.steps > 0 && report.terms > 0);
    }
    let report = replay(&[leader(), follower()]);
    assert_eq!((report.candidates, report.terms, report.writes), (2, 2, 5));
}

#[test]
fn a_create_over_a_present_lock_is_refused() {
    let mut c = follower();
    let create = nth(&mut c, "write", 1).clone();
    c.steps.insert(2, create);
    refused(&[leader(), c], "a create after a Wait decided on a present lock");
    let mut c = follower();
    nth(&mut c, "decide", 2)["step"]["lock"] = fl::config_map(&locks().marked);
    refused(&[leader(), c], "a Create decided on a present lock");
}

#[test]
fn an_adopt_without_its_precondition_is_refused() {
    let mut t = restarted();
    nth(&mut t, "write", 0)["step"]["precondition"]["rv"] = Value::Null;
    refused(&[t], "an adopt without resourceVersion");
    let mut t = restarted();
    nth(&mut t, "write", 0)["step"]["precondition"]["rv"] = json!("11");
    refused(
        &[t],
        "an adopt on another resourceVersion than the lock decided on",
    );
}

#[test]
fn a_dead_pod_deleted_before_the_create_won_is_refused() {
    let mut t = after_eviction();
    let delete_pod = t.steps.remove(5);
    t.steps.insert(4, delete_pod);
    refused(&[t], "the dead Pod deleted before the create");
    let mut t = after_eviction();
    nth(&mut t, "write", 1)["step"]["answer"] = json!({"failed": "conflict"});
    t.steps.truncate(6);
    refused(&[t], "the dead Pod deleted after a create that lost");
}

#[test]
fn a_decision_not_matching_its_inputs_is_refused() {
    let mut c = follower();
    nth(&mut c, "decide", 0)["step"]["decision"] = json!("create");
    refused(&[leader(), c], "a Create while a live Pod leads");
    let mut c = follower();
    // Deleting the released lock on another proof than the mark.
    nth(&mut c, "decide", 1)["step"]["lock"] = fl::config_map(&locks().beaten);
    refused(&[leader(), c], "a takeover of a lock not marked released");
}

#[test]
fn a_token_not_increasing_is_refused() {
    let mut c = follower();
    let lower = at(&new_lock(&pod("c")), "L2", 10);
    nth(&mut c, "write", 1)["step"]["answer"] = ok(Some(&lower));
    nth(&mut c, "lead", 0)["step"]["lock"] = fl::config_map(&lower);
    nth(&mut c, "lead", 0)["step"]["token"] = json!(10);
    refused(&[leader(), c], "two locks' terms with token 10");
    let mut t = restarted();
    nth(&mut t, "lead", 0)["step"]["token"] = json!(20);
    refused(&[leader(), t], "a restart with another token than its lock's");
}

#[test]
fn broken_holder_steps_are_refused() {
    let mut t = leader();
    nth(&mut t, "confirmed", 0)["step"]["sent"] = json!(nth(&mut t.clone(), "write", 3)["step"]["now"]);
    refused(&[t], "a heartbeat confirmed from its answer");
    let mut t = leader();
    nth(&mut t, "write", 3)["step"]["precondition"]["rv"] = json!("10");
    refused(&[t], "a heartbeat on a stale resourceVersion");
    let mut t = leader();
    let beat = nth(&mut t, "beat", 0);
    beat["step"]["due"] = json!(beat["step"]["due"].as_i64().unwrap() - 500 * MS);
    refused(&[t], "a heartbeat before it was due");
    let mut t = leader();
    t.steps
        .retain(|s| s["kind"] != "write" || s["step"]["op"] != "mark");
    refused(&[t], "the lock deleted by its release before its mark");
    let mut t = leader();
    nth(&mut t, "write", 2)["step"]["op"] = json!("say_stopped");
    refused(&[t], "the lock created again marked released while still held");
}
