//! The replayer on small handmade traces: a valid one is accepted, and each deliberately broken
//! step (a mutant of the recorded trace, as the model's mutants break the world) is refused.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp,
};
use serde_json::json;

use super::*;
use crate::{
    api::Failure,
    lease::{record::set_writer, term::Step},
};

const MS: i64 = 1_000_000;

fn wall(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
}

/// The Lease `instance` writes with `record`, at resourceVersion `rv`.
fn lease_at(record: &LeaseRecord, rv: Option<&str>, instance: &str) -> Lease {
    let mut spec = LeaseSpec::default();
    record.write_to(&mut spec, 2);
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some("lock".into()),
            namespace: Some("ns".into()),
            resource_version: rv.map(str::to_string),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    };
    set_writer(&mut lease, instance, record);
    lease
}

fn step(kind: &str, step: Value) -> Value {
    json!({"kind": kind, "step": step})
}

/// Candidate `a` creates the Lease (revision 10), leads, and renews it once (revision 11).
fn leader() -> Trace {
    leader_leases().0
}

/// [`leader`], with the Leases it wrote.
fn leader_leases() -> (Trace, Lease, Lease) {
    let (trace, created, renewed, _) = leader_term();
    (trace, created, renewed)
}

/// [`leader_leases`], with the term as the shipped code holds it after the renewal.
fn leader_term() -> (Trace, Lease, Lease, Term<Every>) {
    let lease_duration = Duration::from_secs(2);
    let record = record_for(&Decision::Create, None, "a", lease_duration, wall(0));
    let created = lease_at(&record, Some("10"), "ia");
    let mut steps_ = vec![
        step(
            "decide",
            json!({"now": 0, "identity": "a", "coordinated": false, "fallback_ms": 2000,
            "successor_wait_ms": 500, "observed": null, "absent": "never", "decision": "create"}),
        ),
        step(
            "write",
            json!({"op": "create", "precondition": null,
            "lease": steps::lease(&lease_at(&record, None, "ia")), "record": steps::record(&record)}),
        ),
        step(
            "answer",
            json!({"sent": MS, "now": 5 * MS, "answer": {"ok": steps::lease(&created)}}),
        ),
        step(
            "lead",
            json!({"identity": "a", "instance": "ia", "token": 10, "sent": MS,
            "lease": steps::lease(&created), "record": steps::record(&record), "retry_ms": 200,
            "lease_duration_seconds": 2, "renew_deadline_ms": 1000, "confirmed_until": 1001 * MS}),
        ),
    ];
    let writer = Writer {
        identity: "a".into(),
        instance: "ia".into(),
        lease_duration_seconds: 2,
        renew_deadline: Duration::from_secs(1),
        yields_to_coordinated: true,
    };
    let at = steps::instant(MS);
    let mut term = Term::new(
        writer,
        created.clone(),
        record,
        10,
        at,
        Every::new(Duration::from_millis(200), at),
    );
    let renewal = term.renew(steps::instant(200 * MS), wall(200));
    steps_.push(step(
        "renew",
        json!({"now": 200 * MS, "wall": wall(200).to_string(), "sent": 201 * MS,
        "step": steps::step(&renewal)}),
    ));
    let Step::Renew { lease, .. } = renewal else {
        panic!("a renewal")
    };
    let mut written = *lease;
    written.metadata.resource_version = Some("11".into());
    term.renewed(written.clone(), steps::instant(201 * MS));
    steps_.push(step(
        "renewed",
        json!({"sent": 201 * MS, "now": 900 * MS, "written": steps::lease(&written),
        "confirmed_until": steps::ns(term.confirmed_until())}),
    ));
    let trace = Trace {
        candidate: "a".into(),
        steps: steps_,
    };
    (trace, created, written, term)
}

/// Candidate `a` creates the Lease (revision 10) but hears of it only after its renew deadline;
/// it confirms the term by renewing (revision 11), and leads with the first write's token.
fn late_leader() -> Trace {
    let lease_duration = Duration::from_secs(2);
    let record = record_for(&Decision::Create, None, "a", lease_duration, wall(0));
    let created = lease_at(&record, Some("10"), "ia");
    let mut again = record.clone();
    again.renew_time = Some(wall(1500));
    let confirming = lease_at(&again, Some("10"), "ia");
    let mut confirmed = confirming.clone();
    confirmed.metadata.resource_version = Some("11".into());
    let lead = json!({"identity": "a", "instance": "ia", "token": 10, "sent": 1501 * MS,
        "lease": steps::lease(&confirmed), "record": steps::record(&again), "retry_ms": 200,
        "lease_duration_seconds": 2, "renew_deadline_ms": 1000, "confirmed_until": 2501 * MS});
    Trace {
        candidate: "a".into(),
        steps: vec![
            step(
                "decide",
                json!({"now": 0, "identity": "a", "coordinated": false, "fallback_ms": 2000,
                "successor_wait_ms": 500, "observed": null, "absent": "never", "decision": "create"}),
            ),
            step(
                "write",
                json!({"op": "create", "precondition": null,
                "lease": steps::lease(&lease_at(&record, None, "ia")), "record": steps::record(&record)}),
            ),
            step(
                "answer",
                json!({"sent": MS, "now": 1500 * MS, "answer": {"ok": steps::lease(&created)}}),
            ),
            step(
                "write",
                json!({"op": "replace", "precondition": "10",
                "lease": steps::lease(&confirming), "record": steps::record(&again)}),
            ),
            step(
                "answer",
                json!({"sent": 1501 * MS, "now": 1600 * MS,
                "answer": {"ok": steps::lease(&confirmed)}}),
            ),
            step("lead", lead),
        ],
    }
}

/// [`leader`], whose next renewal meets a conflict (somebody labelled the Lease: revision 12)
/// and re-reads it: still its own.
fn leader_rereading() -> Trace {
    let (mut trace, _, renewed, mut term) = leader_term();
    let renewal = term.renew(steps::instant(400 * MS), wall(400));
    trace.steps.push(step(
        "renew",
        json!({"now": 400 * MS, "wall": wall(400).to_string(),
        "sent": 401 * MS, "step": steps::step(&renewal)}),
    ));
    let failed = term.write_failed(&Failure::Conflict, steps::instant(450 * MS));
    assert!(matches!(failed, Step::Reread { .. }), "{failed:?}");
    trace.steps.push(step(
        "write_failed",
        json!({"now": 450 * MS, "failure": "conflict",
        "step": steps::step(&failed)}),
    ));
    let mut labelled = renewed;
    labelled.metadata.resource_version = Some("12".into());
    labelled.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
    let answer = Ok(labelled);
    let recorded = steps::answer(&answer);
    let reread = term.reread(answer, steps::instant(460 * MS));
    assert_eq!(reread, Step::Keep);
    trace.steps.push(step(
        "reread",
        json!({"now": 460 * MS, "answer": recorded,
        "step": steps::step(&reread)}),
    ));
    trace
}

/// Candidate `b` sees `a`'s Lease `seen`, waits it out, and takes it over (revision `won`) on
/// the revision it saw.
fn follower(seen: &Lease, won: &str) -> Trace {
    let lease_duration = Duration::from_secs(2);
    let record = LeaseRecord::from_lease(seen);
    let pre = seen.metadata.resource_version.clone().unwrap();
    let observed = Observed::update(None, record, Some(pre.clone()), steps::instant(2 * MS))
        .written_by_kube_leader(true);
    let now = 3000 * MS;
    let mine = record_for(
        &Decision::Takeover,
        Some(&observed),
        "b",
        lease_duration,
        wall(3000),
    );
    let sent = lease_at(&mine, Some(&pre), "ib");
    let mut answered = sent.clone();
    answered.metadata.resource_version = Some(won.into());
    Trace {
        candidate: "b".into(),
        steps: vec![
            step(
                "seen",
                json!({"now": 2 * MS, "instance": "ib", "lease": steps::lease(seen),
                "observed": steps::observed(&observed)}),
            ),
            step(
                "decide",
                json!({"now": now, "identity": "b", "coordinated": false, "fallback_ms": 2000,
                "successor_wait_ms": 500, "observed": steps::observed(&observed), "decision": "takeover"}),
            ),
            step(
                "write",
                json!({"op": "replace", "precondition": pre,
                "lease": steps::lease(&sent), "record": steps::record(&mine)}),
            ),
            step(
                "answer",
                json!({"sent": now + MS, "now": now + 9 * MS,
                "answer": {"ok": steps::lease(&answered)}}),
            ),
        ],
    }
}

fn refused(traces: &[Trace], what: &str) -> Vec<String> {
    let report = replay(traces);
    assert!(
        !report.violations.is_empty(),
        "the replayer accepted a broken trace ({what})"
    );
    report.violations
}

#[test]
fn a_valid_trace_is_accepted() {
    let (a, _, renewed) = leader_leases();
    let report = replay(&[a, follower(&renewed, "12")]);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(
        (report.candidates, report.steps, report.terms, report.writes),
        (2, 10, 1, 3)
    );
}

#[test]
fn a_conflict_read_again_is_accepted_and_a_misjudged_one_refused() {
    let report = replay(&[leader_rereading()]);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    // The re-read shows another holder, but the recorded step keeps the term.
    let mut t = leader_rereading();
    let answer = &mut t.steps[8]["step"]["answer"]["ok"]["spec"];
    answer["holderIdentity"] = json!("b");
    let v = refused(&[t], "a lost term kept");
    assert!(v[0].contains("#8 reread: the term's step"), "{v:?}");
}

#[test]
fn a_late_win_is_confirmed_before_leading() {
    let report = replay(&[late_leader()]);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    // Leading on the late answer itself, without the confirming renewal.
    let mut t = late_leader();
    t.steps.drain(3..5);
    let won = t.steps[2]["step"]["answer"]["ok"].clone();
    let lead = &mut t.steps[3]["step"];
    (lead["sent"], lead["lease"]) = (json!(MS), won);
    lead["confirmed_until"] = json!(1001 * MS);
    let v = refused(&[t], "a term begun on a late answer");
    assert!(v[0].contains("after its renew deadline"), "{v:?}");
    // Confirming on another revision than the won one.
    let mut t = late_leader();
    t.steps[3]["step"]["precondition"] = json!("9");
    let v = refused(&[t], "a confirmation on another revision");
    assert!(v[0].contains("not on the won revision"), "{v:?}");
}

#[test]
fn a_renewal_confirmed_from_its_answer_is_refused() {
    let mut t = leader();
    let renewed = &mut t.steps[5]["step"];
    renewed["sent"] = renewed["now"].clone();
    renewed["confirmed_until"] = json!(1900 * MS);
    let v = refused(&[t], "confirmed from the answer");
    assert!(v[0].contains("counts the renewal from"), "{v:?}");
}

#[test]
fn a_renewal_without_precondition_is_refused() {
    let mut t = leader();
    let renew = &mut t.steps[4]["step"]["step"]["renew"];
    renew["precondition"] = Value::Null;
    renew["lease"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let v = refused(&[t], "a renewal without precondition");
    assert!(v[0].contains("the renewal"), "{v:?}");
}

#[test]
fn a_takeover_without_precondition_is_refused() {
    let mut t = follower(&leader_leases().1, "12");
    t.steps[2]["step"]["precondition"] = Value::Null;
    let v = refused(&[t], "a takeover without precondition");
    assert!(v[0].contains("a replace on precondition None"), "{v:?}");
}

#[test]
fn a_takeover_before_the_expiry_is_refused() {
    let mut t = follower(&leader_leases().1, "12");
    t.steps[1]["step"]["now"] = json!(1500 * MS);
    let v = refused(&[t], "a takeover before the holder's lease expired");
    assert!(v[0].contains("the decision"), "{v:?}");
}

#[test]
fn a_token_not_from_the_winning_write_is_refused() {
    let mut t = leader();
    t.steps[3]["step"]["token"] = json!(0);
    let v = refused(&[t], "the token from leaseTransitions");
    assert!(v[0].contains("fencing token 0"), "{v:?}");
}

#[test]
fn a_term_won_after_its_renew_deadline_is_refused() {
    let mut t = leader();
    t.steps[2]["step"]["now"] = json!(1500 * MS);
    let v = refused(&[t], "a late answer");
    assert!(v[0].contains("after its renew deadline"), "{v:?}");
}

#[test]
fn a_cas_over_another_write_is_refused() {
    // `b`'s takeover on revision 10 made revision 12, but `a`'s renewal made 11 in between.
    let (a, created, _) = leader_leases();
    let v = refused(
        &[a.clone(), follower(&created, "12")],
        "a CAS on a stale revision",
    );
    assert!(v[0].contains("committed revision 11 in between"), "{v:?}");
    // Two writes answered with one revision.
    let v = refused(&[a, follower(&created, "11")], "two writes, one revision");
    assert!(v.iter().any(|v| v.contains("one revision")), "{v:?}");
}

#[test]
fn a_decision_on_a_stale_observation_is_refused() {
    let mut t = follower(&leader_leases().1, "12");
    t.steps[1]["step"]["observed"]["rv"] = json!("9");
    let v = refused(&[t], "a decision on another observation");
    assert!(v[0].contains("another observation"), "{v:?}");
}
