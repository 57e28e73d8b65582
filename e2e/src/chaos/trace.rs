//! Trace checking of a chaos run (issue 43): the decision steps each library candidate
//! reported (`step` events of `chaos-candidate lease|for-life`), replayed through the model's
//! rules by [`kube_leader::internal::trace::replay`] (Lease) or
//! [`kube_leader::internal::trace::for_life::replay`] (leader for life).

use std::{collections::BTreeMap, fmt, fs, path::Path, time::Duration};

use kube_leader::internal::trace::{self, for_life, Report, Trace};
use serde_json::{json, Value};

/// The steps reported so far, per candidate process (as JSON text: a long run reports many).
#[derive(Debug, Default)]
pub struct Steps {
    by_candidate: BTreeMap<String, Vec<String>>,
}

/// What the replay of a run's steps gave.
#[derive(Debug)]
pub struct TraceCheck {
    /// The replayer's report.
    pub report: Report,
    /// How long the replay took.
    pub took: Duration,
    /// The steps replayed, by kind.
    pub kinds: BTreeMap<String, usize>,
    /// Each mutant of the run's own trace (one recorded step broken), and whether the replay
    /// refused it (`None`: the run has no step to break so).
    pub mutants: Vec<(&'static str, Option<bool>)>,
}

/// The mutants of a real trace: a name, the kind of step broken (its first instance where
/// `applies`), and the break.
type Mutant = (&'static str, &'static str, fn(&Value) -> bool, fn(&mut Value));

/// The strategy whose model replays the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// `chaos-candidate lease`.
    Lease,
    /// `chaos-candidate for-life`.
    ForLife,
}

impl Model {
    fn mutants(self) -> &'static [Mutant] {
        match self {
            Model::Lease => &MUTANTS,
            Model::ForLife => &FOR_LIFE_MUTANTS,
        }
    }

    fn replay(self, traces: &[Trace]) -> Report {
        match self {
            Model::Lease => trace::replay(traces),
            Model::ForLife => for_life::replay(traces),
        }
    }
}

/// A replay fed one candidate at a time, of either model.
enum Replayer {
    Lease(trace::Replayer),
    ForLife(for_life::Replayer),
}

impl Replayer {
    fn candidate(&mut self, t: &Trace) {
        match self {
            Replayer::Lease(r) => r.candidate(t),
            Replayer::ForLife(r) => r.candidate(t),
        }
    }

    fn finish(self) -> Report {
        match self {
            Replayer::Lease(r) => r.finish(),
            Replayer::ForLife(r) => r.finish(),
        }
    }
}

/// The mutants of a real leader-for-life trace.
const FOR_LIFE_MUTANTS: [Mutant; 5] = [
    (
        "a create with a precondition",
        "write",
        |s| s["op"] == "create",
        |s| s["precondition"]["rv"] = json!("1"),
    ),
    (
        "a stale lock deleted without its UID precondition",
        "write",
        |s| s["op"] == "delete",
        |s| s["precondition"]["uid"] = Value::Null,
    ),
    (
        "a create decided while another Pod leads",
        "decide",
        |s| s["decision"].get("wait").is_some() && !s["lock"].is_null(),
        |s| s["decision"] = json!("create"),
    ),
    (
        "a released lock taken over without its mark",
        "decide",
        |s| s["decision"]["delete_lock"]["proof"] == "Released",
        |s| {
            if let Some(a) = s["lock"]["metadata"]["annotations"].as_object_mut() {
                a.remove("kube-leader.io/released-at");
            }
        },
    ),
    (
        "a fencing token not the winning write's revision",
        "lead",
        |_| true,
        |s| s["token"] = json!(s["token"].as_u64().unwrap_or(0) + 1),
    ),
];

const MUTANTS: [Mutant; 4] = [
    (
        "a renewal confirmed from its answer",
        "renewed",
        |s| s["now"].as_i64() > s["sent"].as_i64(),
        |s| s["sent"] = s["now"].clone(),
    ),
    (
        "a renewal without precondition",
        "renew",
        |s| s["step"].get("renew").is_some(),
        |s| s["step"]["renew"]["precondition"] = Value::Null,
    ),
    (
        "a takeover without precondition",
        "write",
        |s| s["op"] == "replace",
        |s| s["precondition"] = Value::Null,
    ),
    (
        "a fencing token not the winning write's revision",
        "lead",
        |_| true,
        |s| s["token"] = json!(s["token"].as_u64().unwrap_or(0) + 1),
    ),
];

impl Steps {
    /// Takes in a `step` event of the candidate `key`.
    pub fn absorb(&mut self, key: &str, event: &Value) {
        let step = json!({"kind": event["kind"], "step": event["step"]});
        self.by_candidate
            .entry(key.to_string())
            .or_default()
            .push(step.to_string());
    }

    /// Replays every candidate's steps through `model`, and each mutant of them. When the model
    /// cannot explain some (or with `KUBE_LEADER_CHAOS_KEEP`), the traces are written to `dir`
    /// (`steps-KEY.jsonl`) for a look.
    pub fn replay(&self, model: Model, dir: &Path) -> TraceCheck {
        let began = std::time::Instant::now();
        let mut replayer = match model {
            Model::Lease => Replayer::Lease(trace::Replayer::default()),
            Model::ForLife => Replayer::ForLife(for_life::Replayer::default()),
        };
        let mut kinds = BTreeMap::new();
        let all = model.mutants();
        let mut mutants: Vec<(&'static str, Option<bool>)> = all.iter().map(|m| (m.0, None)).collect();
        for (key, lines) in &self.by_candidate {
            let trace = Trace {
                candidate: key.clone(),
                steps: lines
                    .iter()
                    .map(|l| serde_json::from_str(l).unwrap_or(Value::Null))
                    .collect(),
            };
            replayer.candidate(&trace);
            for step in &trace.steps {
                *kinds
                    .entry(step["kind"].as_str().unwrap_or("?").to_string())
                    .or_insert(0) += 1;
            }
            // Each mutant breaks the first step it applies to, in the first candidate that has
            // one, and that candidate's trace alone is replayed.
            for (i, m) in all.iter().enumerate() {
                if let (None, Some(broken)) = (mutants[i].1, mutate(&trace, m)) {
                    mutants[i].1 = Some(!model.replay(&[broken]).violations.is_empty());
                }
            }
        }
        let report = replayer.finish();
        let took = began.elapsed();
        let keep = std::env::var_os("KUBE_LEADER_CHAOS_KEEP").is_some();
        if !report.violations.is_empty() || keep {
            for (key, lines) in &self.by_candidate {
                let _ = fs::write(dir.join(format!("steps-{key}.jsonl")), lines.join("\n") + "\n");
            }
        }
        TraceCheck {
            report,
            took,
            kinds,
            mutants,
        }
    }
}

/// `trace` with the first step that `mutant` applies to broken (`None`: none applies).
fn mutate(trace: &Trace, (_, kind, applies, break_it): &Mutant) -> Option<Trace> {
    let mut trace = trace.clone();
    let step = trace
        .steps
        .iter_mut()
        .find(|s| s["kind"] == *kind && applies(&s["step"]))?;
    break_it(&mut step["step"]);
    Some(trace)
}

impl fmt::Display for TraceCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.report;
        write!(
            f,
            "trace check: {} steps of {} candidates ({} terms, {} writes known) replayed \
             (with its mutants) in {:.1?}; {} the model cannot explain",
            r.steps,
            r.candidates,
            r.terms,
            r.writes,
            self.took,
            r.violations.len()
        )?;
        write!(f, "\n  steps by kind: {:?}", self.kinds)?;
        for (name, refused) in &self.mutants {
            let verdict = match refused {
                Some(true) => "refused",
                Some(false) => "ACCEPTED",
                None => "no step to break",
            };
            write!(f, "\n  mutant of the run's trace, {name}: {verdict}")?;
        }
        for v in r.violations.iter().take(20) {
            write!(f, "\n  {v}")?;
        }
        Ok(())
    }
}
