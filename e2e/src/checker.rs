//! The exact safety checker: leadership intervals of all candidates on one clock.
//!
//! Every candidate runs on this host, so CLOCK_MONOTONIC ([`mono_ns`](crate::mono_ns)) is one
//! clock for all of them. Each candidate reports when it started and stopped acting as leader;
//! the harness reports when it froze and thawed a candidate (SIGSTOP/SIGCONT). A frozen candidate
//! cannot act, so its frozen spans are cut out of its intervals before they are compared.
//!
//! [`History::report`] gives the overlaps between different candidates (the safety invariant
//! says there are none), the transitions, and the longest time without a leader.
//!
//! ```
//! use kube_leader_e2e::checker::History;
//!
//! let mut h = History::new();
//! h.began("a", 0);
//! h.ended("a", 100);
//! h.began("b", 150);
//! let report = h.report(200);
//! assert!(report.overlaps.is_empty());
//! assert_eq!(report.transitions, 1);
//! assert_eq!(report.longest_gap.map(|g| g.len_ns()), Some(50));
//! ```

use std::{collections::BTreeMap, fmt, time::Duration};

/// A span of CLOCK_MONOTONIC nanoseconds, `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span {
    /// The first nanosecond.
    pub start: u64,
    /// The end (exclusive).
    pub end: u64,
}

impl Span {
    /// Its length in nanoseconds.
    pub fn len_ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Its length.
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.len_ns())
    }

    fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    fn intersect(&self, other: &Span) -> Option<Span> {
        let s = Span {
            start: self.start.max(other.start),
            end: self.end.min(other.end),
        };
        (!s.is_empty()).then_some(s)
    }
}

/// One term of one candidate: from becoming leader to losing it (`end: None` while it leads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The candidate.
    pub candidate: String,
    /// When it started acting as leader.
    pub start: u64,
    /// When it stopped; `None`: it still leads.
    pub end: Option<u64>,
    /// The fencing token of the term, if reported.
    pub fencing_token: Option<u64>,
}

/// Two candidates leading at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// One candidate (the one whose term started first).
    pub first: String,
    /// The other.
    pub second: String,
    /// When both led, frozen spans excluded.
    pub span: Span,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} and {} both led for {:?} (CLOCK_MONOTONIC {}..{} ns)",
            self.first,
            self.second,
            self.span.duration(),
            self.span.start,
            self.span.end
        )
    }
}

/// What [`History::report`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Every overlap between terms of different candidates, frozen spans excluded; in order.
    pub overlaps: Vec<Overlap>,
    /// How many terms there were.
    pub terms: usize,
    /// How many times leadership passed to a *different* candidate (terms in order of their
    /// start; a candidate that leads again after itself is not a transition).
    pub transitions: usize,
    /// Of those, the transitions to a term that started within the window of the report (see
    /// [`History::report_window`]): a rollout's own transitions.
    pub window_transitions: usize,
    /// The longest span in which no candidate led (frozen leaders count as leading: they hold the
    /// lock), within the window of the report; `None` if there was no gap.
    pub longest_gap: Option<Span>,
    /// Terms that ended before they started, or that started again before ending: harness bugs.
    pub malformed: Vec<String>,
}

impl Report {
    /// The total time during which two candidates led at once.
    pub fn overlap_total(&self) -> Duration {
        Duration::from_nanos(self.overlaps.iter().map(|o| o.span.len_ns()).sum())
    }

    /// Panics, with every finding, if the safety invariant was broken or the history is malformed.
    pub fn assert_safe(&self) {
        assert!(
            self.malformed.is_empty(),
            "malformed history: {:?}",
            self.malformed
        );
        assert!(
            self.overlaps.is_empty(),
            "two leaders at once, {} time(s), {:?} in total:\n{}",
            self.overlaps.len(),
            self.overlap_total(),
            self.overlaps
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "terms {}, transitions {}, overlaps {} ({:?}), longest leaderless gap {:?}",
            self.terms,
            self.transitions,
            self.overlaps.len(),
            self.overlap_total(),
            self.longest_gap.map(|g| g.duration())
        )
    }
}

/// The leadership history of a set of candidates; see the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct History {
    terms: Vec<Term>,
    frozen: BTreeMap<String, Vec<Span>>,
    freezing: BTreeMap<String, u64>,
    malformed: Vec<String>,
}

// === impl History ===

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// `candidate` started acting as leader at `at` (CLOCK_MONOTONIC ns).
    pub fn began(&mut self, candidate: &str, at: u64) {
        self.began_with_token(candidate, at, None);
    }

    /// `candidate` started acting as leader at `at`, with a fencing token.
    pub fn began_with_token(&mut self, candidate: &str, at: u64, fencing_token: Option<u64>) {
        if self.open_term(candidate).is_some() {
            self.malformed
                .push(format!("{candidate} began at {at} while still leading"));
        }
        self.terms.push(Term {
            candidate: candidate.to_string(),
            start: at,
            end: None,
            fencing_token,
        });
    }

    /// `candidate` stopped acting as leader at `at`.
    pub fn ended(&mut self, candidate: &str, at: u64) {
        match self.open_term(candidate) {
            Some(i) if self.terms[i].start <= at => self.terms[i].end = Some(at),
            Some(i) => {
                self.malformed.push(format!(
                    "{candidate} ended at {at}, before its term began at {}",
                    self.terms[i].start
                ));
                self.terms[i].end = Some(self.terms[i].start);
            }
            None => self
                .malformed
                .push(format!("{candidate} ended at {at} without leading")),
        }
    }

    /// The harness froze `candidate` (SIGSTOP) at `at`.
    pub fn froze(&mut self, candidate: &str, at: u64) {
        self.freezing.insert(candidate.to_string(), at);
    }

    /// The harness thawed `candidate` (SIGCONT) at `at`.
    pub fn thawed(&mut self, candidate: &str, at: u64) {
        if let Some(from) = self.freezing.remove(candidate) {
            self.frozen_span(candidate, Span { start: from, end: at });
        }
    }

    /// `candidate` could not act during `span`: it is cut out of its terms.
    pub fn frozen_span(&mut self, candidate: &str, span: Span) {
        self.frozen.entry(candidate.to_string()).or_default().push(span);
    }

    /// Folds in one JSON event line of a candidate process (`lease-candidate` and the like):
    /// `{"event": "started_leading" | "stopped_leading" | "exit", "identity": .., "mono_ns": ..,
    /// "fencing_token": ..}`. Other events are ignored; returns whether it was used.
    pub fn record_event(&mut self, event: &serde_json::Value) -> bool {
        let (Some(kind), Some(id), Some(at)) = (
            event["event"].as_str(),
            event["identity"].as_str(),
            event["mono_ns"].as_u64(),
        ) else {
            return false;
        };
        match kind {
            "started_leading" => self.began_with_token(id, at, event["fencing_token"].as_u64()),
            "stopped_leading" => self.ended(id, at),
            // A candidate that exits while leading stopped leading then.
            "exit" if self.open_term(id).is_some() => self.ended(id, at),
            _ => return false,
        }
        true
    }

    /// The terms recorded so far, in the order they began.
    pub fn terms(&self) -> &[Term] {
        &self.terms
    }

    /// Who leads now, as far as the history knows (every candidate with an open term).
    pub fn leaders(&self) -> Vec<&str> {
        self.terms
            .iter()
            .filter(|t| t.end.is_none())
            .map(|t| t.candidate.as_str())
            .collect()
    }

    fn open_term(&self, candidate: &str) -> Option<usize> {
        self.terms
            .iter()
            .rposition(|t| t.candidate == candidate && t.end.is_none())
    }

    /// Checks the history up to `until` (open terms and freezes are closed there): overlaps,
    /// transitions, and the longest gap between the first term's start and `until`.
    pub fn report(&self, until: u64) -> Report {
        let first = self.terms.iter().map(|t| t.start).min().unwrap_or(until);
        self.report_window(first, until)
    }

    /// As [`History::report`], with the longest gap measured within `from..until` only (for
    /// example from the end of the last fault, or from when the candidates started).
    pub fn report_window(&self, from: u64, until: u64) -> Report {
        let mut terms: Vec<&Term> = self.terms.iter().collect();
        terms.sort_by_key(|t| (t.start, t.end));
        let span_of = |t: &Term| Span {
            start: t.start,
            end: t.end.unwrap_or(until).max(t.start),
        };

        // Each term minus its candidate's frozen spans.
        let mut frozen = self.frozen.clone();
        for (candidate, &start) in &self.freezing {
            frozen
                .entry(candidate.clone())
                .or_default()
                .push(Span { start, end: until });
        }
        let acting: Vec<(&Term, Vec<Span>)> = terms
            .iter()
            .map(|t| {
                (
                    *t,
                    subtract(
                        span_of(t),
                        frozen.get(&t.candidate).map_or(&[][..], Vec::as_slice),
                    ),
                )
            })
            .collect();

        let mut overlaps = Vec::new();
        for (i, (a, a_spans)) in acting.iter().enumerate() {
            for (b, b_spans) in &acting[i + 1..] {
                if a.candidate == b.candidate {
                    continue;
                }
                for x in a_spans {
                    for y in b_spans {
                        if let Some(span) = x.intersect(y) {
                            overlaps.push(Overlap {
                                first: a.candidate.clone(),
                                second: b.candidate.clone(),
                                span,
                            });
                        }
                    }
                }
            }
        }
        overlaps.sort_by_key(|o| o.span);

        let changes: Vec<&[&Term]> = terms
            .windows(2)
            .filter(|w| w[0].candidate != w[1].candidate)
            .collect();
        let transitions = changes.len();
        let window_transitions = changes
            .iter()
            .filter(|w| (from..=until).contains(&w[1].start))
            .count();

        // Gaps: the window minus the union of all terms (frozen leaders still hold the lock).
        let mut union: Vec<Span> = Vec::new();
        for s in terms.iter().map(|t| span_of(t)) {
            match union.last_mut() {
                Some(last) if s.start <= last.end => last.end = last.end.max(s.end),
                _ => union.push(s),
            }
        }
        let window = Span {
            start: from,
            end: until,
        };
        let longest_gap = subtract(window, &union).into_iter().max_by_key(Span::len_ns);

        Report {
            window_transitions,
            overlaps,
            terms: terms.len(),
            transitions,
            longest_gap,
            malformed: self.malformed.clone(),
        }
    }
}

/// `span` minus every span of `holes`, as disjoint spans in order.
fn subtract(span: Span, holes: &[Span]) -> Vec<Span> {
    let mut holes: Vec<Span> = holes.iter().filter_map(|h| h.intersect(&span)).collect();
    holes.sort();
    let mut out = Vec::new();
    let mut cursor = span.start;
    for h in holes {
        if h.start > cursor {
            out.push(Span {
                start: cursor,
                end: h.start,
            });
        }
        cursor = cursor.max(h.end);
    }
    if cursor < span.end {
        out.push(Span {
            start: cursor,
            end: span.end,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u64, end: u64) -> Span {
        Span { start, end }
    }

    #[test]
    fn disjoint_terms_are_safe_and_counted() {
        let mut h = History::new();
        h.began("a", 10);
        h.ended("a", 20);
        h.began("a", 25);
        h.ended("a", 30);
        h.began("b", 40);
        h.ended("b", 50);
        h.began("c", 50); // touching is not overlapping
        let r = h.report(100);
        r.assert_safe();
        assert_eq!((r.terms, r.transitions), (4, 2));
        assert_eq!(r.longest_gap, Some(span(30, 40)));
        assert_eq!(h.leaders(), ["c"]);
    }

    #[test]
    fn overlaps_are_found_and_measured() {
        let mut h = History::new();
        h.began("a", 0);
        h.began("b", 50);
        h.ended("a", 80);
        h.began("c", 70);
        let r = h.report(100);
        assert_eq!(r.overlaps.len(), 3);
        assert_eq!(
            r.overlaps[0],
            Overlap {
                first: "a".into(),
                second: "b".into(),
                span: span(50, 80)
            }
        );
        assert!(r
            .overlaps
            .iter()
            .any(|o| o.first == "b" && o.second == "c" && o.span == span(70, 100)));
        assert_eq!(r.overlap_total(), Duration::from_nanos(30 + 10 + 30));
        assert_eq!(r.longest_gap, None);
        let msg = std::panic::catch_unwind(|| r.assert_safe()).unwrap_err();
        assert!(msg
            .downcast_ref::<String>()
            .unwrap()
            .contains("two leaders at once, 3 time(s)"));
    }

    #[test]
    fn frozen_spans_are_excluded() {
        let mut h = History::new();
        h.began("a", 0);
        h.froze("a", 10);
        h.began("b", 30);
        h.thawed("a", 60);
        h.ended("a", 65); // the resumed leader acted for 5 ns beside b
        let r = h.report(100);
        assert_eq!(
            r.overlaps,
            vec![Overlap {
                first: "a".into(),
                second: "b".into(),
                span: span(60, 65)
            }]
        );
        // Still frozen at the end of the report: no overlap at all.
        let mut h = History::new();
        h.began("a", 0);
        h.froze("a", 10);
        h.began("b", 30);
        h.report(100).assert_safe();
    }

    #[test]
    fn malformed_histories_are_reported() {
        let mut h = History::new();
        h.ended("a", 5);
        h.began("b", 10);
        h.began("b", 20);
        h.began("c", 50);
        h.ended("c", 40);
        let r = h.report(100);
        assert_eq!(r.malformed.len(), 3, "{:?}", r.malformed);
    }

    #[test]
    fn gaps_within_a_window() {
        let mut h = History::new();
        h.began("a", 100);
        h.ended("a", 200);
        h.began("b", 450);
        assert_eq!(h.report_window(0, 500).longest_gap, Some(span(200, 450)));
        assert_eq!(h.report_window(300, 500).longest_gap, Some(span(300, 450)));
        assert_eq!(h.report_window(0, 150).longest_gap, Some(span(0, 100)));
        assert_eq!(History::new().report_window(0, 10).longest_gap, Some(span(0, 10)));
    }

    #[test]
    fn candidate_process_events() {
        let mut h = History::new();
        let ev = |e: &str, id: &str, at: u64| serde_json::json!({"event": e, "identity": id, "mono_ns": at});
        assert!(
            h.record_event(&serde_json::json!({"event": "started_leading", "identity": "a",
            "mono_ns": 5, "fencing_token": 3}))
        );
        assert!(h.record_event(&ev("exit", "a", 9)));
        assert!(
            !h.record_event(&ev("exit", "a", 10)),
            "exit while not leading is no term end"
        );
        assert!(!h.record_event(&serde_json::json!({"event": "started_leading"})));
        assert_eq!(
            h.terms()[0],
            Term {
                candidate: "a".into(),
                start: 5,
                end: Some(9),
                fencing_token: Some(3)
            }
        );
    }

    #[test]
    fn subtraction() {
        assert_eq!(
            subtract(span(0, 10), &[span(2, 3), span(5, 12)]),
            vec![span(0, 2), span(3, 5)]
        );
        assert_eq!(subtract(span(0, 10), &[span(0, 10)]), vec![]);
        assert_eq!(
            subtract(span(0, 10), &[span(4, 6), span(1, 5)]),
            vec![span(0, 1), span(6, 10)]
        );
    }
}
