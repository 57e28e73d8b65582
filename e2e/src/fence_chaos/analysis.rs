//! The checker of the fenced chaos run: from the lock's and the objects' histories (commit
//! order, exact), the writers' reports and the webhooks' `fence check` lines, it counts
//!
//! - per object incarnation, the landed writes whose token is older than one already on it
//!   (a regression: must be none under the enforcing rule; counted under the audit-only one);
//! - the landed writes whose token was older than the lock's when they committed (the lock had
//!   moved to a newer token): under the enforcing rule only those whose lock moved between the
//!   webhook's read and the commit can land, each explained by the check that let it through;
//!   under the audit-only rule, every stale write the same run would have accepted;
//! - the writes refused and the webhook-down spans' outcomes, and the latency figures.

use std::collections::BTreeMap;

use super::{
    history::{LockVersion, ObjectVersion},
    records::{Check, Outcome, Side, WriteRecord},
};

/// Everything the checker reads.
#[derive(Debug, Default)]
pub struct Input {
    /// The lock's versions, in commit order.
    pub lock: Vec<LockVersion>,
    /// The objects' versions, in commit order.
    pub objects: Vec<ObjectVersion>,
    /// Every write the writers reported.
    pub writes: Vec<WriteRecord>,
    /// The enforcing webhook's checks.
    pub checks: Vec<Check>,
    /// The audit-only webhook's `would refuse` lines.
    pub would_refuse: usize,
    /// When the enforcing webhook was down (CLOCK_MONOTONIC ns).
    pub down: Vec<(u64, u64)>,
    /// When a fault was in force (latency pairs in them are set apart).
    pub faults: Vec<(u64, u64)>,
}

/// Landed writes of one side, from the object histories.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Landed {
    /// Versions written with a token (by the fenced writers).
    pub writes: usize,
    /// Regressions: a token older than one already on the object (same incarnation).
    pub regressions: usize,
    /// A token older than the lock's when it committed.
    pub after_lock_moved: usize,
}

/// A distribution's percentiles, in ms.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Spread {
    /// How many values.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (ms).
    pub fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let at = |p: f64| values[((values.len() as f64 - 1.0) * p).round() as usize];
        Self {
            n: values.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: values[values.len() - 1],
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.2} p90 {:.2} p99 {:.2} max {:.2} ms (n {})",
            self.p50, self.p90, self.p99, self.max, self.n
        )
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Figures {
    /// Leadership transitions (the lock passing to another holder).
    pub transitions: usize,
    /// Landed writes under the enforcing rule.
    pub fenced: Landed,
    /// Landed writes under the audit-only rule.
    pub audit: Landed,
    /// Enforced writes landed after the lock moved whose check read the lock before the move
    /// (the check-to-commit window), and those with no such check (must be none).
    pub moved_in_window: usize,
    /// See `moved_in_window`.
    pub unexplained: Vec<String>,
    /// Enforced writes refused by the fence ("fenced: ..."), and by a webhook that could not be
    /// reached.
    pub refused: usize,
    /// See `refused`.
    pub webhook_unreachable: usize,
    /// The audit-only webhook's `would refuse` lines.
    pub would_refuse: usize,
    /// One refusal message, as the writer got it.
    pub refusal_example: Option<String>,
    /// While the webhook was down: enforced writes that landed (must be none), refused, and
    /// unfenced writes that landed.
    pub down_landed: usize,
    /// See `down_landed`.
    pub down_refused: usize,
    /// See `down_landed`.
    pub down_plain_landed: usize,
    /// From the webhook's read of the lock to the harness's watch seeing the commit or the
    /// writer's answer, whichever came first (an upper bound of the check-to-commit window),
    /// per landed enforced write.
    pub window: Spread,
    /// Paired latency, outside faults: enforced write, unfenced write, their difference.
    pub fenced_latency: Spread,
    /// See `fenced_latency`.
    pub plain_latency: Spread,
    /// See `fenced_latency`.
    pub added_latency: Spread,
    /// The added latency over every pair, faults included.
    pub added_latency_all: Spread,
}

/// The lock's token at commit `rv`: the one of its last version before.
fn lock_token_at(lock: &[LockVersion], rv: u64) -> Option<u64> {
    let i = lock.partition_point(|l| l.rv < rv);
    i.checked_sub(1).map(|i| lock[i].token)
}

/// The landed writes of `side`, and for the enforcing side the checks that let the late ones
/// through: `(landed, [(name, predecessor rv, commit rv, token)] of writes after a move)`.
fn landed(input: &Input, side: Side) -> (Landed, Vec<(String, u64, u64, u64)>) {
    let mut by_incarnation: BTreeMap<(&str, &str), Vec<&ObjectVersion>> = BTreeMap::new();
    for v in &input.objects {
        if Side::of(&v.name) == Some(side) {
            by_incarnation.entry((&v.name, &v.uid)).or_default().push(v);
        }
    }
    let (mut l, mut late) = (Landed::default(), Vec::new());
    for versions in by_incarnation.values_mut() {
        versions.sort_by_key(|v| v.rv);
        versions.dedup_by_key(|v| v.rv);
        let (mut max, mut prev): (Option<u64>, Option<u64>) = (None, None);
        for v in versions.iter() {
            let before = prev.replace(v.rv);
            // Versions without a stamp (the harness's create) are not fenced writes.
            let Some(t) = v.stamp.filter(|_| !v.deleted) else {
                continue;
            };
            l.writes += 1;
            if max.is_some_and(|m| t < m) {
                l.regressions += 1;
            }
            max = max.max(Some(t));
            if lock_token_at(&input.lock, v.rv).is_some_and(|lt| lt > t) {
                l.after_lock_moved += 1;
                late.push((v.name.clone(), before.unwrap_or(0), v.rv, t));
            }
        }
    }
    (l, late)
}

/// Checks every enforced write that landed after the lock moved against the webhook's check
/// that let it through: that check must have read the lock before the move (a version whose
/// token is at most the write's); returns how many are so explained, and the others.
fn explain(input: &Input, late: &[(String, u64, u64, u64)]) -> (usize, Vec<String>) {
    let (mut ok, mut unexplained) = (0, Vec::new());
    for (name, prev, commit, token) in late {
        let check = input
            .checks
            .iter()
            .filter(|c| c.name == *name && c.token == *token && c.allowed && c.old_version == Some(*prev))
            .max_by_key(|c| c.lock_version);
        match check.and_then(|c| Some((c.lock_version?, c.lock_token?))) {
            Some((read, read_token)) if read < *commit && read_token <= *token => ok += 1,
            _ => unexplained.push(format!(
                "{name}: token {token} committed at {commit} after the lock moved (lock token then \
                 {:?}), check: {check:?}",
                lock_token_at(&input.lock, *commit)
            )),
        }
    }
    (ok, unexplained)
}

fn within(spans: &[(u64, u64)], w: &WriteRecord) -> bool {
    spans.iter().any(|&(a, b)| w.start_ns >= a && w.end_ns <= b)
}

fn overlaps(spans: &[(u64, u64)], w: &WriteRecord) -> bool {
    spans.iter().any(|&(a, b)| w.start_ns <= b && w.end_ns >= a)
}

/// Runs every check of the module documentation.
pub fn analyze(input: &Input) -> Figures {
    let (fenced, late) = landed(input, Side::Fenced);
    let (audit, _) = landed(input, Side::Audit);
    let (moved_in_window, unexplained) = explain(input, &late);
    let mut f = Figures {
        fenced,
        audit,
        moved_in_window,
        unexplained,
        would_refuse: input.would_refuse,
        ..Figures::default()
    };
    f.transitions = transitions(&input.lock);
    for w in input.writes.iter().filter(|w| w.side == Side::Fenced) {
        let message = w.message.as_deref().unwrap_or_default();
        match w.outcome {
            Outcome::Refused if message.contains("fenced:") => {
                f.refused += 1;
                f.refusal_example.get_or_insert_with(|| message.to_owned());
            }
            Outcome::Refused | Outcome::Error if message.contains("failed calling webhook") => {
                f.webhook_unreachable += 1;
            }
            _ => {}
        }
        if within(&input.down, w) {
            match w.outcome {
                Outcome::Ok => f.down_landed += 1,
                Outcome::Refused | Outcome::Error => f.down_refused += 1,
                Outcome::Timeout => {}
            }
        }
    }
    f.down_plain_landed = input
        .writes
        .iter()
        .filter(|w| w.side == Side::Plain && w.outcome == Outcome::Ok && within(&input.down, w))
        .count();
    latency(input, &mut f);
    f
}

/// Transitions: the lock passing to a candidate other than the last one (not to the thief).
fn transitions(lock: &[LockVersion]) -> usize {
    let mut last: Option<&str> = None;
    let mut n = 0;
    for h in lock
        .iter()
        .filter_map(|l| l.holder.as_deref())
        .filter(|h| *h != super::history::THIEF)
    {
        if last.is_some_and(|l| l != h) {
            n += 1;
        }
        last = Some(h);
    }
    n
}

/// The paired latency figures and the check-to-commit window.
fn latency(input: &Input, f: &mut Figures) {
    let key = |w: &WriteRecord| (w.identity.clone(), w.token, w.tick);
    let plain: BTreeMap<_, &WriteRecord> = input
        .writes
        .iter()
        .filter(|w| w.side == Side::Plain && w.outcome == Outcome::Ok)
        .map(|w| (key(w), w))
        .collect();
    let ms = |ns: u64| ns as f64 / 1e6;
    let (mut with, mut without, mut diff, mut all) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut window = Vec::new();
    let checks: BTreeMap<(&str, u64, u64), &Check> = input
        .checks
        .iter()
        .filter(|c| c.allowed)
        .filter_map(|c| Some(((c.name.as_str(), c.token, c.old_version?), c)))
        .collect();
    for w in input
        .writes
        .iter()
        .filter(|w| w.side == Side::Fenced && w.outcome == Outcome::Ok)
    {
        let Some(p) = plain.get(&key(w)) else { continue };
        let d = ms(w.duration_ns()) - ms(p.duration_ns());
        all.push(d);
        if !overlaps(&input.faults, w) && !overlaps(&input.faults, p) {
            with.push(ms(w.duration_ns()));
            without.push(ms(p.duration_ns()));
            diff.push(d);
        }
    }
    let prev = predecessors(&input.objects);
    let answers: BTreeMap<(&str, u64), u64> = input
        .writes
        .iter()
        .filter_map(|w| Some(((w.object.as_str(), w.rv?), w.end_unix_us)))
        .collect();
    for v in input
        .objects
        .iter()
        .filter(|v| Side::of(&v.name) == Some(Side::Fenced))
    {
        let Some(c) = v
            .stamp
            .zip(prev.get(&(v.name.as_str(), v.rv)))
            .and_then(|(t, p)| checks.get(&(v.name.as_str(), t, *p)))
        else {
            continue;
        };
        // The commit is before both the watch's sight of it and the writer's answer.
        let answered = answers.get(&(v.name.as_str(), v.rv)).copied().unwrap_or(u64::MAX);
        let committed_by = v.seen_unix_us.min(answered);
        window.push(committed_by.saturating_sub(c.at_unix_us) as f64 / 1e3);
    }
    f.window = Spread::of(window);
    f.fenced_latency = Spread::of(with);
    f.plain_latency = Spread::of(without);
    f.added_latency = Spread::of(diff);
    f.added_latency_all = Spread::of(all);
}

/// Each object version's predecessor: (name, rv) → the rv before it.
fn predecessors(objects: &[ObjectVersion]) -> BTreeMap<(&str, u64), u64> {
    let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for v in objects {
        by_name.entry(&v.name).or_default().push(v.rv);
    }
    let mut out = BTreeMap::new();
    for (name, mut rvs) in by_name {
        rvs.sort_unstable();
        rvs.dedup();
        for w in rvs.windows(2) {
            out.insert((name, w[1]), w[0]);
        }
    }
    out
}

#[cfg(test)]
#[path = "analysis/tests.rs"]
mod tests;
