//! Trace checking of the Lease strategy (issue 43): the decision steps a real candidate
//! recorded (`lease/term/steps.rs`: `tracing` events of target `kube_leader::step`), replayed
//! through the shipped decision code and checked against the model's rules.
//!
//! A step is *allowed by the model* when all of these hold:
//!
//! 1. Determinism. Its recorded inputs, fed to the same shipped functions, give its recorded
//!    outputs: the fold of a watch event (`Observed::update` with `written_by`,
//!    `written_by_any`, `preferred_in`, `coordinated_strategy`), every decision (`decide`,
//!    `defer_to_controller`, `defer_to_preferred`, `decide_coordinated`,
//!    `decide_absent`), the record a write carries (`record_for`), and every step of the
//!    held `Term`, rebuilt from the term's first write and driven by the recorded events in
//!    order (renew, renewed, write failed, re-read, watched, deleted, deadline).
//! 2. The campaign's rules, as the model drives the code: a decision is taken on the last
//!    observation of the watch (or, while the Lease is absent, on the deletion last seen); a
//!    create follows a `Create` decision and carries no precondition; a replace follows a
//!    `Takeover` or `Renew` decision with the observed resourceVersion as its precondition (or,
//!    confirming a won term, the resourceVersion that write won); a term begins only with a write
//!    answered within the renew deadline of its sending, its `confirmed_until` is that send time
//!    plus the renew deadline, and its fencing token is the revision of the write that won it.
//! 3. The keeper's rules: every renewal carries the precondition of the Lease last written (or
//!    adopted); a renewal counts from when it was sent (the `sent` given to the term is the one
//!    recorded when the request went out, never the answer's time), and `confirmed_until` never
//!    exceeds the latest successful renewal's send time plus the renew deadline, which is
//!    shorter than the lease duration; a release carries the term's precondition.
//! 4. The store is linearizable, as the model's API server is: the revisions a campaign's
//!    watch shows never go back; every successful write made a revision greater than its
//!    precondition, no two writes made the same revision, and no other known write to the Lease
//!    committed between a successful compare-and-swap's precondition and its revision (a CAS
//!    succeeds only on the current revision); a Lease seen at a revision some write made
//!    carries that write's record; each candidate's fencing tokens increase, and no two terms
//!    have one token.
//!
//! Not checked: timing across candidates (each process has its own monotonic clock, and
//! nothing relates them but the store's revisions); writes this trace does not know (an
//! administrator's deletion, a write whose answer was lost), which the store checks skip; the
//! leader's work (the supervisor's gate on `confirmed_until` and the fenced ledger are checked
//! by the chaos run itself); whether the recorded `now` was read when the code claims (the
//! replay trusts the recorded inputs: it checks what the code did with them); the leader
//! for life and shards strategies.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;

use crate::lease::{
    coordinated::{coordinated_strategy, written_by_any},
    decide::{
        decide, decide_absent, decide_coordinated, defer_to_controller, defer_to_preferred, record_for,
        Absent, Decision, Observed,
    },
    record::{preferred_in, written_by, LeaseRecord},
    term::{steps, Every, Term, Writer},
};

/// One candidate process's recorded steps, in order: each `{"kind": .., "step": {..}}`.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The candidate's name in the run (its key, unique in the run).
    pub candidate: String,
    /// Its steps, in the order it took them.
    pub steps: Vec<Value>,
}

/// What a replay found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Candidate processes replayed.
    pub candidates: usize,
    /// Steps replayed.
    pub steps: usize,
    /// Terms begun.
    pub terms: usize,
    /// Successful writes of the Lease known to the trace.
    pub writes: usize,
    /// Steps the model does not allow: `candidate #step kind: what`.
    pub violations: Vec<String>,
}

/// Replays `traces` (every candidate of one Lease) and reports what the model cannot explain.
pub fn replay(traces: &[Trace]) -> Report {
    let mut replayer = Replayer::default();
    for trace in traces {
        replayer.candidate(trace);
    }
    replayer.finish()
}

/// A replay fed one candidate at a time (so that a long run's traces need not all be decoded
/// at once): [`replay`] in steps.
#[derive(Debug, Default)]
pub struct Replayer {
    report: Report,
    store: Store,
}

impl Replayer {
    /// Replays one candidate process's trace.
    pub fn candidate(&mut self, trace: &Trace) {
        let (report, store) = (&mut self.report, &mut self.store);
        let mut cand = Cand::default();
        for (n, step) in trace.steps.iter().enumerate() {
            let kind = step["kind"].as_str().unwrap_or("?");
            if let Err(what) = cand.step(kind, &step["step"], store) {
                let at = format!("{} #{n} {kind}", trace.candidate);
                report.violations.push(format!("{at}: {what}"));
            }
        }
        report.candidates += 1;
        report.steps += trace.steps.len();
        report.terms += cand.tokens.len();
        let tokens = cand.tokens.iter().map(|t| (*t, trace.candidate.clone()));
        store.tokens.extend(tokens);
    }

    /// Checks the store's history across the candidates replayed, and reports.
    pub fn finish(mut self) -> Report {
        self.report.writes = self.store.writes.len();
        self.report.violations.extend(self.store.check());
        self.report
    }
}

/// A step's verdict: `Err` says why the model does not allow it.
type Verdict = Result<(), String>;

/// A successful write of the Lease.
#[derive(Debug, Clone)]
struct Written {
    candidate_step: String,
    precondition: Option<u64>,
    revision: u64,
    record: LeaseRecord,
}

/// What the trace knows of the store, across candidates.
#[derive(Debug, Default)]
struct Store {
    writes: Vec<Written>,
    /// Every Lease seen by a watch or a read: (revision, record).
    seen: Vec<(u64, LeaseRecord)>,
    /// Every term's fencing token, with its candidate.
    tokens: Vec<(u64, String)>,
}

impl Store {
    fn wrote(&mut self, what: &str, precondition: Option<u64>, written: &Lease) -> Verdict {
        let revision = revision(written).ok_or("a written Lease without a numeric resourceVersion")?;
        if precondition.is_some_and(|p| p >= revision) {
            return Err(format!(
                "wrote revision {revision} on precondition {precondition:?}"
            ));
        }
        self.writes.push(Written {
            candidate_step: what.to_string(),
            precondition,
            revision,
            record: LeaseRecord::from_lease(written),
        });
        Ok(())
    }

    fn check(&self) -> Vec<String> {
        let mut out = Vec::new();
        let by_rev: BTreeMap<u64, &Written> = self.writes.iter().map(|w| (w.revision, w)).collect();
        if by_rev.len() != self.writes.len() {
            out.push("store: two successful writes made one revision".to_string());
        }
        for w in &self.writes {
            let Some(p) = w.precondition else { continue };
            if let Some((r, other)) = by_rev.range(p + 1..w.revision).next() {
                out.push(format!(
                    "store: the CAS of {} on revision {p} succeeded (revision {}), but {} had \
                     committed revision {r} in between",
                    w.candidate_step, w.revision, other.candidate_step
                ));
            }
        }
        for (rev, record) in &self.seen {
            if let Some(w) = by_rev.get(rev) {
                if w.record != *record {
                    out.push(format!(
                        "store: revision {rev} seen with another record than {} wrote",
                        w.candidate_step
                    ));
                }
            }
        }
        let mut tokens = BTreeSet::new();
        for (t, who) in &self.tokens {
            if !tokens.insert(*t) {
                out.push(format!("store: two terms with fencing token {t} (one of {who})"));
            }
        }
        out
    }
}

/// A numeric resourceVersion.
fn revision(l: &Lease) -> Option<u64> {
    l.metadata.resource_version.as_deref()?.parse().ok()
}

/// A write in flight.
#[derive(Debug, Clone)]
struct Sent {
    sent: i64,
    precondition: Option<u64>,
}

/// The held term, rebuilt.
#[derive(Debug)]
struct Held {
    term: Term<Every>,
    renew_deadline_ns: i64,
    lease_duration_ns: i64,
    /// The renewal in flight.
    renewal: Option<Sent>,
}

/// The campaign's last decision, with its inputs.
#[derive(Debug, Clone)]
struct Decided {
    now: i64,
    identity: String,
    fallback: std::time::Duration,
    decision: Decision,
}

/// One candidate's replay state.
#[derive(Debug, Default)]
struct Cand {
    /// The campaign's fold of the watch.
    observed: Option<Observed>,
    deleted: Option<Observed>,
    unknown_since: Option<i64>,
    last_seen_rev: Option<u64>,
    decided: Option<Decided>,
    write: Option<Sent>,
    /// The first write this campaign won (its revision, the token) and the last one answered
    /// (sent, answered, the Lease).
    won: Option<(u64, i64, i64, Lease)>,
    held: Option<Held>,
    tokens: Vec<u64>,
    n: usize,
}

/// Reads a field.
fn field<T>(v: &Value, key: &str, read: impl Fn(&Value) -> Option<T>) -> Result<T, String> {
    read(&v[key]).ok_or_else(|| format!("malformed field {key}: {}", v[key]))
}

/// Compares an output with what the replay gives.
fn same(what: &str, recorded: &Value, replayed: &Value) -> Verdict {
    if recorded == replayed {
        return Ok(());
    }
    Err(format!(
        "{what}: recorded {recorded}, the shipped code gives {replayed}"
    ))
}

/// A recorded resourceVersion as a number (`None`: none).
fn precondition(v: &Value) -> Result<Option<u64>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => s.parse().map(Some).map_err(|_| format!("resourceVersion {s}")),
        other => Err(format!("resourceVersion {other}")),
    }
}

impl Cand {
    fn step(&mut self, kind: &str, s: &Value, store: &mut Store) -> Verdict {
        self.n += 1;
        let name = format!("#{} {kind}", self.n);
        match kind {
            "seen" => self.seen(s, store),
            "absent" => self.absent(s),
            "decide" => self.decide(s),
            "write" => self.write(s),
            "answer" => self.answer(s, store, &name),
            "lead" => self.lead(s),
            "renew" | "renewed" | "write_failed" | "reread" | "watched" | "deleted" | "deadline"
            | "release" => {
                let held = self.held.as_mut().ok_or("a term step outside a term")?;
                held.step(kind, s, store, &name)
            }
            other => Err(format!("unknown step kind {other}")),
        }
    }

    /// `Campaign::seen`: the fold of a watch event.
    fn seen(&mut self, s: &Value, store: &mut Store) -> Verdict {
        let lease = field(s, "lease", steps::lease_from)?;
        let instance = field(s, "instance", |v| v.as_str().map(str::to_string))?;
        let now = steps::instant(field(s, "now", Value::as_i64)?);
        let record = LeaseRecord::from_lease(&lease);
        let rv = lease.metadata.resource_version.clone();
        let next = Observed::update(self.observed.as_ref(), record.clone(), rv, now)
            .written_by_me(written_by(&lease, &record, &instance))
            .preferring(preferred_in(&lease, &record))
            .coordinated(coordinated_strategy(&lease).is_some())
            .written_by_kube_leader(written_by_any(&lease, &record));
        let verdict = same("the observation", &s["observed"], &steps::observed(&next));
        self.observed = Some(next);
        self.deleted = None;
        self.unknown_since = None;
        verdict?;
        if let Some(rev) = revision(&lease) {
            store.seen.push((rev, record));
            if self.last_seen_rev.is_some_and(|last| rev < last) {
                return Err(format!(
                    "the watch went back from revision {:?} to {rev}",
                    self.last_seen_rev
                ));
            }
            self.last_seen_rev = Some(rev);
        }
        Ok(())
    }

    /// `Campaign::absent`.
    fn absent(&mut self, s: &Value) -> Verdict {
        let now = field(s, "now", Value::as_i64)?;
        let relisted = field(s, "relisted", Value::as_bool)?;
        let last = self.observed.take();
        if relisted && (last.is_some() || self.deleted.is_some()) {
            self.deleted = None;
            self.unknown_since = Some(now);
        } else if let Some(last) = last {
            self.deleted = Some(last);
        }
        Ok(())
    }

    /// `Campaign::decide`.
    fn decide(&mut self, s: &Value) -> Verdict {
        let now_ns = field(s, "now", Value::as_i64)?;
        let now = steps::instant(now_ns);
        let identity = field(s, "identity", |v| v.as_str().map(str::to_string))?;
        let ms = |k: &str| field(s, k, Value::as_u64).map(std::time::Duration::from_millis);
        let (fallback, wait) = (ms("fallback_ms")?, ms("successor_wait_ms")?);
        let observed = match &s["observed"] {
            Value::Null => None,
            v => Some(steps::observed_from(v).ok_or("malformed observation")?),
        };
        if observed != self.observed {
            return Err("decided on another observation than the watch's last".into());
        }
        let decision = if field(s, "coordinated", Value::as_bool)? {
            decide_coordinated(observed.as_ref(), &identity, now, fallback)
        } else if let Some(obs) = &observed {
            let d = decide(Some(obs), &identity, now, fallback);
            let d = defer_to_controller(d, obs, now, fallback);
            defer_to_preferred(d, obs, &identity, now, wait)
        } else {
            let absent = self.absent_input(&s["absent"])?;
            decide_absent(absent, &identity, now, fallback)
        };
        same("the decision", &s["decision"], &steps::decision(&decision))?;
        self.decided = Some(Decided {
            now: now_ns,
            identity,
            fallback,
            decision,
        });
        Ok(())
    }

    /// What the decision knew of the absent Lease, checked against the fold.
    fn absent_input(&self, v: &Value) -> Result<Absent<'_>, String> {
        if v == "never" {
            if self.deleted.is_some() || self.unknown_since.is_some() {
                return Err("a Lease seen before taken for a first election".into());
            }
            return Ok(Absent::Never);
        }
        if let Some(since) = v["unknown_since"].as_i64() {
            if self.unknown_since.is_some_and(|u| u != since) {
                return Err("absent since another instant than the relist".into());
            }
            return Ok(Absent::Unknown {
                since: steps::instant(since),
            });
        }
        let recorded = steps::observed_from(&v["deleted"]).ok_or("malformed absent")?;
        match &self.deleted {
            Some(d) if *d == recorded => Ok(Absent::Deleted(d)),
            _ => Err("decided on another deleted record than the watch's last".into()),
        }
    }
}

// === the campaign's writes and the term's beginning ===

impl Cand {
    /// `Campaign::write` and `Campaign::replace`: a create or a replace sent.
    fn write(&mut self, s: &Value) -> Verdict {
        let op = field(s, "op", |v| v.as_str().map(str::to_string))?;
        let pre = precondition(&s["precondition"])?;
        let lease = field(s, "lease", steps::lease_from)?;
        let record = field(s, "record", steps::record_from)?;
        let decided = self.decided.clone().ok_or("a write before any decision")?;
        if LeaseRecord::from_lease(&lease) != record {
            return Err("the Lease sent does not carry the record".into());
        }
        // Sent after the decision, or (a confirmation) after the answer it confirms.
        let after = self.won.as_ref().map_or(decided.now, |w| w.2);
        self.write = Some(Sent {
            sent: after,
            precondition: pre,
        });
        if let Some((_, _, _, won)) = &self.won {
            // Confirming a won term that was answered late: a replace on what that write won.
            if op != "replace" || pre != revision(won) {
                return Err(format!("a confirmation {op} on {pre:?}, not on the won revision"));
            }
            return Ok(());
        }
        let observed = self.observed.as_ref();
        match (&decided.decision, op.as_str()) {
            (Decision::Create, "create") if pre.is_none() => {}
            (Decision::Takeover | Decision::Renew, "replace") => {
                let seen = observed.and_then(|o| o.resource_version.as_deref()?.parse::<u64>().ok());
                if pre.is_none() || pre != seen {
                    return Err(format!(
                        "a replace on precondition {pre:?}, the watch showed {seen:?}"
                    ));
                }
            }
            (d, op) => return Err(format!("a {op} (precondition {pre:?}) after the decision {d:?}")),
        }
        let wall = record.renew_time.ok_or("a record without renewTime")?;
        let mut expected = record_for(
            &decided.decision,
            observed,
            &decided.identity,
            decided.fallback,
            wall,
        );
        if decided.decision == Decision::Create {
            // Created again after a deletion: the elector keeps counting (`transitions_for_create`).
            expected.transitions = record.transitions;
        }
        same("the record", &steps::record(&record), &steps::record(&expected))
    }

    /// The answer to a campaign's write.
    fn answer(&mut self, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let sent = field(s, "sent", Value::as_i64)?;
        let now = field(s, "now", Value::as_i64)?;
        let answer = field(s, "answer", steps::answer_from)?;
        let write = self.write.take().ok_or("an answer without a write")?;
        if sent < write.sent {
            return Err(format!(
                "a write sent at {sent}, before it was decided ({})",
                write.sent
            ));
        }
        if now < sent {
            return Err("answered before it was sent".into());
        }
        let Ok(lease) = answer else {
            // A failed confirmation: the campaign decides again.
            self.won = None;
            return Ok(());
        };
        {
            store.wrote(name, write.precondition, &lease)?;
            let first = match &self.won {
                Some((first, ..)) => *first,
                None => revision(&lease).ok_or("no revision")?,
            };
            self.won = Some((first, sent, now, lease));
        }
        Ok(())
    }

    /// `Campaign::lead`: the term begins.
    fn lead(&mut self, s: &Value) -> Verdict {
        let (first, sent, answered, won) = self.won.take().ok_or("a term without a won write")?;
        self.observed = None;
        self.deleted = None;
        self.unknown_since = None;
        self.decided = None;
        self.last_seen_rev = None;
        let token = field(s, "token", Value::as_u64)?;
        let rec_sent = field(s, "sent", Value::as_i64)?;
        let lease = field(s, "lease", steps::lease_from)?;
        let record = field(s, "record", steps::record_from)?;
        let renew_deadline_ms = field(s, "renew_deadline_ms", Value::as_u64)?;
        let seconds = field(s, "lease_duration_seconds", Value::as_i64)?;
        let retry = std::time::Duration::from_millis(field(s, "retry_ms", Value::as_u64)?);
        let renew_deadline = std::time::Duration::from_millis(renew_deadline_ms);
        let deadline_ns = i64::try_from(renew_deadline.as_nanos()).map_err(|e| e.to_string())?;
        let lease_ns = seconds.saturating_mul(1_000_000_000);
        if rec_sent != sent || steps::lease(&lease) != steps::lease(&won) {
            return Err("the term does not begin with the write that won it".into());
        }
        if answered - sent >= deadline_ns {
            return Err("a term begun on a write answered after its renew deadline".into());
        }
        if token != first {
            return Err(format!(
                "fencing token {token}, the winning write made revision {first}"
            ));
        }
        if self.tokens.last().is_some_and(|t| *t >= token) {
            return Err(format!("fencing token {token} after {:?}", self.tokens.last()));
        }
        if deadline_ns >= lease_ns {
            return Err("a renew deadline not shorter than the lease duration".into());
        }
        let identity = field(s, "identity", |v| v.as_str().map(str::to_string))?;
        let writer = Writer {
            identity,
            instance: field(s, "instance", |v| v.as_str().map(str::to_string))?,
            lease_duration_seconds: i32::try_from(seconds).map_err(|e| e.to_string())?,
            renew_deadline,
            yields_to_coordinated: true,
        };
        let at = steps::instant(sent);
        let term = Term::new(writer, lease, record, token, at, Every::new(retry, at));
        let until = field(s, "confirmed_until", Value::as_i64)?;
        same(
            "confirmed_until",
            &until.into(),
            &steps::ns(term.confirmed_until()).into(),
        )?;
        if until > sent + deadline_ns {
            return Err("confirmed past the winning write's send time + the renew deadline".into());
        }
        self.tokens.push(token);
        self.held = Some(Held {
            term,
            renew_deadline_ns: deadline_ns,
            lease_duration_ns: lease_ns,
            renewal: None,
        });
        Ok(())
    }
}

// === the keeper ===

impl Held {
    fn step(&mut self, kind: &str, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let now = || field(s, "now", Value::as_i64).map(steps::instant);
        let step = match kind {
            "renew" => return self.renew(s),
            "renewed" => return self.renewed(s, store, name),
            "write_failed" => {
                self.renewal = None;
                let failure = field(s, "failure", steps::failure_from)?;
                self.term.write_failed(&failure, now()?)
            }
            "reread" => {
                let answer = field(s, "answer", steps::answer_from)?;
                if let Ok(l) = &answer {
                    if let Some(rev) = revision(l) {
                        store.seen.push((rev, LeaseRecord::from_lease(l)));
                    }
                }
                self.term.reread(answer, now()?)
            }
            "watched" => self.term.watched(&field(s, "lease", steps::lease_from)?),
            "deleted" => self.term.deleted(),
            "deadline" => self.term.deadline_reached(now()?),
            "release" => return self.release(s, store, name),
            _ => unreachable!("a term step"),
        };
        same("the term's step", &s["step"], &steps::step(&step))
    }

    /// `Keeper::renew`: a renewal built and sent.
    fn renew(&mut self, s: &Value) -> Verdict {
        let now = field(s, "now", Value::as_i64)?;
        let sent = field(s, "sent", Value::as_i64)?;
        let wall = field(s, "wall", steps::wall_from)?;
        let expected_pre = revision(self.term.lease());
        let step = self.term.renew(steps::instant(now), wall);
        same("the renewal", &s["step"], &steps::step(&step))?;
        if s["step"].get("renew").is_none() {
            return Ok(());
        }
        let pre = precondition(&s["step"]["renew"]["precondition"])?;
        if pre.is_none() || pre != expected_pre {
            return Err(format!(
                "a renewal on precondition {pre:?}, the term's Lease is at {expected_pre:?}"
            ));
        }
        if sent < now {
            return Err("a renewal sent before it was built".into());
        }
        self.renewal = Some(Sent {
            sent,
            precondition: pre,
        });
        Ok(())
    }

    /// `Term::renewed`: a renewal answered.
    fn renewed(&mut self, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let renewal = self
            .renewal
            .take()
            .ok_or("a renewal answered that was not sent")?;
        let sent = field(s, "sent", Value::as_i64)?;
        let now = field(s, "now", Value::as_i64)?;
        let written = field(s, "written", steps::lease_from)?;
        if sent != renewal.sent {
            return Err(format!(
                "the term counts the renewal from {sent}, it was sent at {} (answered at {now})",
                renewal.sent
            ));
        }
        store.wrote(name, renewal.precondition, &written)?;
        self.term.renewed(written, steps::instant(sent));
        let until = field(s, "confirmed_until", Value::as_i64)?;
        same(
            "confirmed_until",
            &until.into(),
            &steps::ns(self.term.confirmed_until()).into(),
        )?;
        if until > sent + self.renew_deadline_ns || self.renew_deadline_ns >= self.lease_duration_ns {
            return Err("confirmed past the renewal's send time + the renew deadline".into());
        }
        Ok(())
    }

    /// `Keeper::release`: a release written on the term's Lease.
    fn release(&mut self, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let pre = precondition(&s["precondition"])?;
        let expected = revision(self.term.lease());
        if pre.is_none() || pre != expected {
            return Err(format!(
                "a release on precondition {pre:?}, the term's Lease is at {expected:?}"
            ));
        }
        if let Ok(written) = field(s, "answer", steps::answer_from)? {
            store.wrote(name, pre, &written)?;
        }
        Ok(())
    }
}

/// Reading recorded steps back from their `tracing` events.
#[path = "trace/recorded.rs"]
mod recorded;
pub use recorded::{step_of, STEP_TARGET};

/// Trace checking of leader for life.
#[path = "trace/for_life.rs"]
pub mod for_life;

#[cfg(test)]
#[path = "trace/tests.rs"]
mod tests;
