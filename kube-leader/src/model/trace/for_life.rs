//! Trace checking of leader for life (issue 43): the decision steps a real candidate recorded
//! (`for_life/steps.rs`: `tracing` events of target `kube_leader::step`), replayed through the
//! shipped decision code and checked against the model's rules.
//!
//! A step is *allowed by the model* when all of these hold:
//!
//! 1. Determinism. Its recorded inputs, fed to the same shipped functions, give its recorded
//!    outputs: every decision of the campaign (`track_fate` on the lock and the leader Pod as
//!    seen, `decide`, `defer_to_preferred`, `dead_pod_to_delete`: the replay keeps its own
//!    `Fate` across the decisions, as the campaign does), the term's fencing token
//!    (`restart_token` for a restart), the holder's `lock_loss`, `pod_ending` and
//!    `release_mark`, and its heartbeat's confirmations (`Beats`).
//! 2. The campaign's rules: a create follows a `Create` decision taken on an absent lock, and
//!    carries no precondition; an adopt follows a `Continue` decision with the lock's UID and
//!    resourceVersion as its preconditions; a stale lock's deletion follows a `DeleteLock`
//!    decision with its UID (and, on a lapsed liveness, the resourceVersion seen), and a
//!    released lock's only on the release mark; the dead leader's Pod is deleted only once this
//!    candidate's own create won, and only the Pod a decision named; a term begins only with the
//!    write that won it, with that write's revision as its token (a restart: the token its lock
//!    stores, else its resourceVersion); the leader Pod decided on is the lock's owner's.
//! 3. The holder's rules: a heartbeat is sent no earlier than due (the first a third of the
//!    liveness after the making write's send, each next one a third after the last send),
//!    never after the term was seen lost, on the resourceVersion of the lock last written or
//!    read; it confirms the term from its send (never its answer), for the liveness; the
//!    release marks the lock only as read and still the term's (UID precondition, its
//!    resourceVersion), deletes it only after the mark, with the term's UID as precondition;
//!    the lock is created again marked released only after it was seen deleted under the term.
//! 4. The store: no two successful writes made one revision; no known write committed between
//!    a conditional write's resourceVersion and its revision; a lock seen at a revision some
//!    write made carries that write's record; a term's token never repeats across locks, and a
//!    lock's terms (a restart continues one) share one token; each candidate's tokens increase.
//!
//! Not checked: timing across candidates (separate monotonic clocks); writes the trace does not
//! know (an administrator's, the garbage collector's, an answer lost); the order of the watch
//! events before a decision (the decision records what it was taken on, which the replay
//! trusts); the answer of the dead Pod's deletion (best effort, in the background); the work.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};

use super::{Report, Trace};
use crate::{
    api::Failure,
    for_life::{
        decide::{
            dead_pod_to_delete, decide, defer_to_preferred, track_fate, Decision, Fate, Inputs, Proof, Stale,
        },
        holder::{lock_loss, pod_ending, release_mark, restart_token, Beats, Liveness, Mark},
        record::{LeaderPod, LockRecord, PodRef},
        steps as fl,
    },
    lease::term::steps::{failure_from, instant},
    lock::fencing_token,
};

/// Replays `traces` (every candidate of one lock) and reports what the model cannot explain.
pub fn replay(traces: &[Trace]) -> Report {
    let mut replayer = Replayer::default();
    for trace in traces {
        replayer.candidate(trace);
    }
    replayer.finish()
}

/// A replay fed one candidate at a time: [`replay`] in steps.
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
            let name = format!("{} #{n} {kind}", trace.candidate);
            if let Err(what) = cand.step(kind, &step["step"], store, &name) {
                report.violations.push(format!("{name}: {what}"));
            }
        }
        report.candidates += 1;
        report.steps += trace.steps.len();
        report.terms += cand.terms;
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

/// A successful write of the lock.
#[derive(Debug, Clone)]
struct Written {
    what: String,
    precondition: Option<u64>,
    revision: u64,
    record: LockRecord,
}

/// A term: its candidate step, token and lock.
#[derive(Debug, Clone)]
struct TermOf {
    what: String,
    token: u64,
    lock_uid: String,
}

/// What the trace knows of the store, across candidates.
#[derive(Debug, Default)]
struct Store {
    writes: Vec<Written>,
    /// Every lock seen: (revision, record, by which step).
    seen: Vec<(u64, LockRecord, String)>,
    terms: Vec<TermOf>,
}

impl Store {
    fn wrote(&mut self, what: &str, precondition: Option<u64>, written: &ConfigMap) -> Verdict {
        let revision = revision(written).ok_or("a written lock without a numeric resourceVersion")?;
        if precondition.is_some_and(|p| p >= revision) {
            return Err(format!(
                "wrote revision {revision} on precondition {precondition:?}"
            ));
        }
        self.writes.push(Written {
            what: what.to_string(),
            precondition,
            revision,
            record: LockRecord::from_config_map(written),
        });
        Ok(())
    }

    fn saw(&mut self, what: &str, cm: &ConfigMap) {
        if let Some(rev) = revision(cm) {
            self.seen
                .push((rev, LockRecord::from_config_map(cm), what.to_string()));
        }
    }

    fn check(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut by_rev = std::collections::BTreeMap::new();
        for w in &self.writes {
            if let Some(other) = by_rev.insert(w.revision, w) {
                out.push(format!(
                    "store: {} and {} made one revision {}",
                    other.what, w.what, w.revision
                ));
            }
        }
        for w in &self.writes {
            let Some(p) = w.precondition else { continue };
            if let Some((r, other)) = by_rev.range(p + 1..w.revision).next() {
                out.push(format!(
                    "store: {} on resourceVersion {p} succeeded (revision {}), but {} had committed \
                     revision {r} in between",
                    w.what, w.revision, other.what
                ));
            }
        }
        for (rev, record, what) in &self.seen {
            if by_rev.get(rev).is_some_and(|w| w.record != *record) {
                out.push(format!(
                    "store: {what} saw revision {rev} with another record than was written"
                ));
            }
        }
        let mut by_token = std::collections::BTreeMap::new();
        let mut by_lock = std::collections::BTreeMap::new();
        for t in &self.terms {
            if let Some(other) = by_token.insert(t.token, t).filter(|o| o.lock_uid != t.lock_uid) {
                out.push(format!(
                    "store: two locks' terms with fencing token {} ({} and {})",
                    t.token, other.what, t.what
                ));
            }
            if let Some(other) = by_lock
                .insert(t.lock_uid.clone(), t)
                .filter(|o| o.token != t.token)
            {
                out.push(format!(
                    "store: one lock's terms with tokens {} ({}) and {} ({})",
                    other.token, other.what, t.token, t.what
                ));
            }
        }
        out
    }
}

/// A numeric resourceVersion.
fn revision(cm: &ConfigMap) -> Option<u64> {
    cm.metadata.resource_version.as_deref()?.parse().ok()
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

/// A recorded lock (`None`: null).
fn lock(v: &Value, key: &str) -> Result<Option<ConfigMap>, String> {
    fl::config_map_from(&v[key]).map_err(|e| format!("malformed field {key}: {e}"))
}

/// The campaign's last decision, with what it was taken on.
#[derive(Debug, Clone)]
struct Decided {
    decision: Decision,
    lock: Option<ConfigMap>,
    dead_pod: Option<PodRef>,
}

/// A write of the campaign that won: its op, when it was sent, the lock it wrote.
#[derive(Debug, Clone)]
struct WonWrite {
    op: String,
    sent: i64,
    lock: ConfigMap,
}

/// The held term, as the holder's steps show it.
#[derive(Debug, Default)]
struct Held {
    lock_uid: String,
    token: u64,
    beats: Option<Beats>,
    /// The lock last written or read: the next heartbeat's precondition.
    current_rv: Option<String>,
    /// When the next heartbeat may be due at the earliest, or exactly (after a conflict whose
    /// re-read found the lock still the term's: at once).
    due_min: i64,
    due_exact: Option<i64>,
    /// The heartbeat announced (`beat`: its due, its now), its write's send, its outcome.
    beat: Option<(i64, i64)>,
    beat_sent: Option<(i64, bool)>,
    /// The last heartbeat's write met a conflict (or a 404): its re-read follows.
    conflicted: bool,
    /// The first loss seen (its `Debug` text).
    lost: Option<String>,
    /// The release read the lock to mark (its resourceVersion), or found it marked.
    to_mark: Option<Option<String>>,
    marked: bool,
}

/// One candidate's replay state.
#[derive(Debug, Default)]
struct Cand {
    me: Option<PodRef>,
    successor_wait: std::time::Duration,
    fate: Option<Fate>,
    decided: Option<Decided>,
    /// The dead leader's Pod to delete once this candidate's create won (`Election::dead_pod`).
    dead_pod: Option<PodRef>,
    won: Option<WonWrite>,
    held: Option<Held>,
    tokens: Vec<u64>,
    terms: usize,
}

impl Cand {
    fn step(&mut self, kind: &str, s: &Value, store: &mut Store, name: &str) -> Verdict {
        match kind {
            "campaign" => {
                *self = Cand {
                    me: Some(field(s, "me", fl::pod_ref_from)?),
                    successor_wait: std::time::Duration::from_millis(field(
                        s,
                        "successor_wait_ms",
                        Value::as_u64,
                    )?),
                    tokens: std::mem::take(&mut self.tokens),
                    terms: self.terms,
                    ..Cand::default()
                };
                Ok(())
            }
            "decide" => self.decide(s, store, name),
            "write" => self.write(s, store, name),
            "delete_pod" => self.delete_pod(s),
            "lead" => self.lead(s, store, name),
            "lock_loss" | "pod_ending" | "beat" | "confirmed" | "release_mark" => {
                let me = self.me.clone().ok_or("a holder step before any campaign")?;
                let held = self.held.as_mut().ok_or("a holder step outside a term")?;
                held.step(kind, s, &me, store, name)
            }
            other => Err(format!("unknown step kind {other}")),
        }
    }

    /// `Election::step`: one decision, replayed on its recorded inputs.
    fn decide(&mut self, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let me = self.me.clone().ok_or("a decision before the campaign began")?;
        if self.held.is_some() {
            return Err("a decision during a term".into());
        }
        let now = instant(field(s, "now", Value::as_i64)?);
        let cm = lock(s, "lock")?;
        let record = cm.as_ref().map(LockRecord::from_config_map);
        let watched = match &s["leader_pod"] {
            Value::Null => None,
            v => Some((
                field(v, "name", |n| n.as_str().map(str::to_string))?,
                field(v, "state", fl::leader_pod_from)?,
            )),
        };
        // The campaign watches the Pod named by the lock's owner (not its own), and only it.
        if let Some(Ok(owner)) = record.as_ref().map(|r| &r.owner) {
            let expected = (owner.name != me.name).then_some(owner.name.as_str());
            if watched.as_ref().map(|w| w.0.as_str()) != expected {
                return Err(format!(
                    "decided on the Pod {watched:?}, the lock's owner is {}",
                    owner.name
                ));
            }
        }
        let leader_pod = watched.as_ref().map(|(n, p)| (n.as_str(), p));
        track_fate(&mut self.fate, record.as_ref(), &me, leader_pod, now);
        let since = match &s["node_not_ready_since"] {
            Value::Null => None,
            v => Some(instant(v.as_i64().ok_or("malformed node_not_ready_since")?)),
        };
        let inputs = Inputs {
            lock: record.as_ref(),
            leader_pod: watched.as_ref().map_or(&LeaderPod::Unknown, |w| &w.1),
            node_not_ready_since: since,
            fate: self.fate.as_ref(),
            me: &me,
            now,
            policy: field(s, "policy", fl::policy_from)?,
        };
        let decision = defer_to_preferred(decide(inputs), self.fate.as_ref(), &me, now, self.successor_wait);
        let dead_pod = dead_pod_to_delete(&inputs);
        if let Some(cm) = &cm {
            store.saw(name, cm);
        }
        same("the decision", &s["decision"], &fl::decision(&decision))?;
        same(
            "the dead Pod",
            &s["dead_pod"],
            &json!(dead_pod.as_ref().map(fl::pod_ref)),
        )?;
        self.won = None;
        self.decided = Some(Decided {
            decision,
            lock: cm,
            dead_pod,
        });
        Ok(())
    }

    /// A write, by the campaign or by the holder.
    fn write(&mut self, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let op = field(s, "op", |v| v.as_str().map(str::to_string))?;
        let pre = &s["precondition"];
        let pre_uid = pre["uid"].as_str().map(str::to_string);
        let pre_rv = pre["rv"].as_str().map(str::to_string);
        let sent = field(s, "sent", Value::as_i64)?;
        let sent_lock = lock(s, "lock")?;
        let answer = match (&s["answer"].get("ok"), &s["answer"]["failed"]) {
            (Some(ok), _) => Ok(fl::config_map_from(ok)?),
            (None, f) => Err(failure_from(f).ok_or("malformed answer")?),
        };
        if field(s, "now", Value::as_i64)? < sent {
            return Err("answered before it was sent".into());
        }
        let rv_num = |rv: &Option<String>| rv.as_deref().and_then(|r| r.parse::<u64>().ok());
        let me = self.me.clone().ok_or("a write before any campaign")?;
        match op.as_str() {
            "create" | "adopt" | "delete" => {
                self.campaign_write(&op, (pre_uid, pre_rv.clone()), sent_lock.as_ref(), &me)?
            }
            _ => {
                let held = self.held.as_mut().ok_or("a holder's write outside a term")?;
                held.write(&op, (pre_uid, pre_rv.clone()), sent_lock.as_ref(), sent, &me)?;
            }
        }
        match (&answer, op.as_str()) {
            (Ok(Some(written)), _) => {
                store.wrote(name, rv_num(&pre_rv), written)?;
                if let (Some(held), "beat") = (self.held.as_mut(), op.as_str()) {
                    held.current_rv = written.metadata.resource_version.clone();
                }
                if op == "create" || op == "adopt" {
                    self.won = Some(WonWrite {
                        op: op.clone(),
                        sent,
                        lock: written.clone(),
                    });
                }
            }
            (Ok(None) | Err(Failure::NotFound), "delete") => {
                // `Election::delete_stale`: the lock is gone, on a proof.
                if let Some(f) = self.fate.as_mut() {
                    f.proven = true;
                }
            }
            _ => {}
        }
        if let (Some(held), "beat") = (self.held.as_mut(), op.as_str()) {
            held.beat_sent = Some((sent, answer.is_ok()));
            held.conflicted = matches!(answer, Err(Failure::Conflict | Failure::NotFound));
        }
        Ok(())
    }

    /// The campaign's writes: each on the decision it follows, with its preconditions.
    fn campaign_write(
        &mut self,
        op: &str,
        (uid, rv): (Option<String>, Option<String>),
        sent: Option<&ConfigMap>,
        me: &PodRef,
    ) -> Verdict {
        if self.held.is_some() {
            return Err(format!("a campaign's {op} during a term"));
        }
        let decided = self
            .decided
            .as_ref()
            .ok_or_else(|| format!("a {op} before any decision"))?;
        let seen = decided.lock.as_ref().map(LockRecord::from_config_map);
        let seen_rv = seen.as_ref().and_then(|r| r.resource_version.clone());
        match (op, &decided.decision) {
            ("create", Decision::Create) => {
                if decided.lock.is_some() {
                    return Err("a create decided on a present lock".into());
                }
                if uid.is_some() || rv.is_some() {
                    return Err("a create with a precondition".into());
                }
                let record = sent
                    .map(LockRecord::from_config_map)
                    .ok_or("a create without its lock")?;
                if !record.is_owned_by(me) || record.released {
                    return Err("a create of a lock not owned by this Pod, or marked released".into());
                }
                if decided.dead_pod.is_some() {
                    self.dead_pod = decided.dead_pod.clone();
                }
            }
            ("adopt", Decision::Continue) => {
                let seen = seen.as_ref().ok_or("an adopt of no lock")?;
                if rv.is_none() || rv != seen_rv || uid.as_deref() != Some(seen.uid.as_str()) {
                    return Err(format!(
                        "an adopt on preconditions {uid:?}/{rv:?}, the lock decided on is {}/{seen_rv:?}",
                        seen.uid
                    ));
                }
            }
            (
                "delete",
                Decision::DeleteLock {
                    lock_uid,
                    why,
                    proof,
                    delete_pod,
                },
            ) => {
                let seen = seen.as_ref().ok_or("a deletion of no lock")?;
                let expected_rv = matches!(proof, Proof::LivenessLapsed { .. })
                    .then(|| seen_rv.clone())
                    .flatten();
                if uid.as_deref() != Some(lock_uid.as_str()) || rv != expected_rv {
                    return Err(format!(
                        "a deletion on preconditions {uid:?}/{rv:?}, the decision's are {lock_uid}/{expected_rv:?}"
                    ));
                }
                if matches!(why, Stale::Released { .. }) && !seen.released {
                    return Err("a released lock's takeover without the release mark".into());
                }
                if delete_pod.is_some() {
                    self.dead_pod = delete_pod.clone();
                }
            }
            (op, d) => return Err(format!("a {op} after the decision {d:?}")),
        }
        Ok(())
    }

    /// `Election::delete_dead_pod`: only once this candidate's create won.
    fn delete_pod(&mut self, s: &Value) -> Verdict {
        let pod = field(s, "pod", fl::pod_ref_from)?;
        if self.won.as_ref().is_none_or(|w| w.op != "create") || self.held.is_some() {
            return Err(format!(
                "the dead Pod {} deleted before this candidate's create won",
                pod.name
            ));
        }
        if self.dead_pod.take() != Some(pod.clone()) {
            return Err(format!("deleted the Pod {}, which no decision named", pod.name));
        }
        Ok(())
    }

    /// `Election::run`: the term begins.
    fn lead(&mut self, s: &Value, store: &mut Store, name: &str) -> Verdict {
        let won = self.won.take().ok_or("a term without a won write")?;
        let token = field(s, "token", Value::as_u64)?;
        let restarted = field(s, "restarted", Value::as_bool)?;
        let stored = field(s, "token_stored", Value::as_bool)?;
        let lead_lock = lock(s, "lock")?.ok_or("a term without its lock")?;
        if fl::config_map(&lead_lock) != fl::config_map(&won.lock) {
            return Err("the term does not begin with the write that won it".into());
        }
        let expected = match (won.op.as_str(), restarted) {
            ("create", false) => (
                fencing_token(won.lock.metadata.resource_version.as_deref(), 0),
                false,
            ),
            ("adopt", true) => {
                let decided = self
                    .decided
                    .as_ref()
                    .and_then(|d| d.lock.as_ref())
                    .ok_or("an adopt of no lock")?;
                restart_token(&LockRecord::from_config_map(decided))
            }
            (op, restarted) => return Err(format!("a term (restarted: {restarted}) won by a {op}")),
        };
        same(
            "the fencing token",
            &json!([token, stored]),
            &json!([expected.0, expected.1]),
        )?;
        if self
            .tokens
            .last()
            .is_some_and(|t| *t > token || (*t == token && !restarted))
        {
            return Err(format!("fencing token {token} after {:?}", self.tokens.last()));
        }
        let lock_uid = lead_lock.metadata.uid.clone().unwrap_or_default();
        let mut held = Held {
            lock_uid: lock_uid.clone(),
            token,
            current_rv: lead_lock.metadata.resource_version.clone(),
            ..Held::default()
        };
        if let Some(h) = s.get("heartbeat").filter(|h| !h.is_null()) {
            let ms = |k: &str| field(h, k, Value::as_u64).map(std::time::Duration::from_millis);
            let liveness = Liveness {
                confirm: ms("confirm_ms")?,
                advertised: ms("advertised_ms")?,
            };
            let sent = field(h, "sent", Value::as_i64)?;
            if sent != won.sent {
                return Err(format!(
                    "a heartbeat counted from {sent}, its write was sent at {}",
                    won.sent
                ));
            }
            let beats = Beats::new(liveness, instant(sent));
            same(
                "confirmed_until",
                &h["confirmed_until"],
                &json!(fl_ns(beats.confirmed_until())),
            )?;
            held.due_min = fl_ns(beats.first_due());
            held.beats = Some(beats);
        }
        self.tokens.push(token);
        self.terms += 1;
        store.terms.push(TermOf {
            what: name.to_string(),
            token,
            lock_uid,
        });
        self.held = Some(held);
        Ok(())
    }
}

/// An instant as recorded.
fn fl_ns(i: tokio::time::Instant) -> i64 {
    crate::lease::term::steps::ns(i)
}

// === the holder ===

impl Held {
    fn step(&mut self, kind: &str, s: &Value, me: &PodRef, store: &mut Store, name: &str) -> Verdict {
        match kind {
            "lock_loss" => {
                let cm = lock(s, "lock")?;
                if field(s, "lock_uid", |v| v.as_str().map(str::to_string))? != self.lock_uid {
                    return Err("the holder checked its lock against another UID than its term's".into());
                }
                let loss = lock_loss(
                    &self.lock_uid,
                    me,
                    cm.as_ref().map(LockRecord::from_config_map).as_ref(),
                );
                same(
                    "the loss",
                    &s["loss"],
                    &json!(loss.as_ref().map(|l| format!("{l:?}"))),
                )?;
                if let Some(cm) = &cm {
                    store.saw(name, cm);
                }
                match (loss, s["from"].as_str()) {
                    (Some(l), _) => {
                        self.lost.get_or_insert(format!("{l:?}"));
                    }
                    (None, Some("beat")) => {
                        // `Beat::reread`: still the term's, so the heartbeat is written again
                        // at once, on this resourceVersion.
                        self.current_rv = cm.and_then(|c| c.metadata.resource_version);
                        if std::mem::take(&mut self.conflicted) {
                            self.due_exact = self.beat.map(|b| b.0);
                        }
                    }
                    (None, _) => {}
                }
                Ok(())
            }
            "pod_ending" => {
                let pod = match &s["pod"] {
                    Value::Null => None,
                    v => Some(fl::pod_view_from(v).ok_or("malformed pod")?),
                };
                let why = pod_ending(me, pod.as_ref());
                same("the Pod's end", &s["why"], &json!(why))?;
                if why.is_some() {
                    self.lost.get_or_insert("PodEnding".into());
                }
                Ok(())
            }
            "beat" => self.beat(s),
            "confirmed" => self.confirmed(s),
            "release_mark" => {
                let cm = lock(s, "lock")?.ok_or("a release mark of no lock")?;
                store.saw(name, &cm);
                let mark = release_mark(&self.lock_uid, me, &LockRecord::from_config_map(&cm));
                same("the release's mark", &s["mark"], &json!(format!("{mark:?}")))?;
                match mark {
                    Mark::Write => self.to_mark = Some(cm.metadata.resource_version.clone()),
                    Mark::Marked => self.marked = true,
                    Mark::NotMine => {}
                }
                Ok(())
            }
            _ => unreachable!("a holder step"),
        }
    }

    /// `Beat::run`: a heartbeat due.
    fn beat(&mut self, s: &Value) -> Verdict {
        if self.beats.is_none() {
            return Err("a heartbeat in a term without one".into());
        }
        if let Some(lost) = &self.lost {
            return Err(format!("a heartbeat after the term was lost ({lost})"));
        }
        let due = field(s, "due", Value::as_i64)?;
        let now = field(s, "now", Value::as_i64)?;
        match self.due_exact.take() {
            Some(exact) if exact != due => {
                return Err(format!("a heartbeat due at {due}, not again at {exact}"))
            }
            None if due < self.due_min => {
                return Err(format!(
                    "a heartbeat due at {due}, before {} (a third of the liveness)",
                    self.due_min
                ));
            }
            _ => {}
        }
        if now < due {
            return Err("a heartbeat before it was due".into());
        }
        self.beat = Some((due, now));
        self.beat_sent = None;
        Ok(())
    }

    /// `Beat::run`: a heartbeat written confirms the term.
    fn confirmed(&mut self, s: &Value) -> Verdict {
        let beats = self.beats.as_mut().ok_or("a confirmation without a heartbeat")?;
        let sent = field(s, "sent", Value::as_i64)?;
        match self.beat_sent.take() {
            Some((at, true)) if at == sent => {}
            other => {
                return Err(format!(
                    "a confirmation counted from {sent}, the heartbeat written: {other:?}"
                ))
            }
        }
        let until = beats.written(instant(sent));
        same("confirmed_until", &s["until"], &json!(fl_ns(until)))?;
        self.due_min = fl_ns(instant(sent) + beats.liveness.period());
        Ok(())
    }

    /// The holder's writes: the token, heartbeats, the release, the lock created again.
    fn write(
        &mut self,
        op: &str,
        (uid, rv): (Option<String>, Option<String>),
        sent_lock: Option<&ConfigMap>,
        sent: i64,
        me: &PodRef,
    ) -> Verdict {
        let record = sent_lock.map(LockRecord::from_config_map);
        let ours = uid.as_deref() == Some(self.lock_uid.as_str());
        match op {
            "token" => {
                if !ours || record.and_then(|r| r.fencing_token) != Some(self.token) {
                    return Err("a fencing token stored in another lock, or another token".into());
                }
            }
            "beat" => {
                let (due, now) = self.beat.ok_or("a heartbeat written that was not due")?;
                if sent < now || sent < due {
                    return Err("a heartbeat sent before it was due".into());
                }
                if !ours || rv.is_none() || rv != self.current_rv {
                    return Err(format!(
                        "a heartbeat on {uid:?}/{rv:?}, the lock last written or read is {}/{:?}",
                        self.lock_uid, self.current_rv
                    ));
                }
                if record.is_none_or(|r| r.fencing_token != Some(self.token)) {
                    return Err("a heartbeat without the term's fencing token".into());
                }
                self.due_min = sent
                    + i64::try_from(self.beats.map_or(0, |b| b.liveness.period().as_nanos() as u64))
                        .unwrap_or(i64::MAX);
            }
            "mark" => {
                let read = self
                    .to_mark
                    .take()
                    .ok_or("a release mark written without a read lock to mark")?;
                if !ours || rv.is_none() || rv != read {
                    return Err(format!(
                        "a release mark on {uid:?}/{rv:?}, the lock read is {read:?}"
                    ));
                }
                if !record.is_some_and(|r| r.released && r.is_owned_by(me)) {
                    return Err("a release mark that does not mark the lock released".into());
                }
                self.marked = true;
            }
            "release_delete" => {
                if !self.marked || !ours || rv.is_some() {
                    return Err(
                        "the lock deleted by its release before its mark, or not on the term's UID".into(),
                    );
                }
            }
            "say_stopped" => {
                if self.lost.as_deref() != Some("LockDeleted") {
                    return Err(format!(
                        "the lock created again marked released after {:?}",
                        self.lost
                    ));
                }
                if uid.is_some() || rv.is_some() || !record.is_some_and(|r| r.released && r.is_owned_by(me)) {
                    return Err("the lock created again not as this Pod's, marked released".into());
                }
            }
            other => return Err(format!("unknown write {other}")),
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "for_life/tests.rs"]
mod tests;
