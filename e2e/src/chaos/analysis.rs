//! What a chaos run found: overlaps (with those after a whole-candidate pause set apart), the
//! post-pause windows, the fate of every ledger write, fencing-token order, and leaderless gaps.

use std::{collections::BTreeMap, fmt, time::Duration};

use crate::checker::{History, Overlap, Report, Span, Term};

/// How a ledger write ended, as its writer reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written.
    Accepted,
    /// Refused by the fencing check: the ledger held `stored`, greater than the writer's token.
    Rejected {
        /// The ledger's token.
        stored: u64,
    },
    /// Not written: the ledger could not be read (or refused the write with a status).
    Unreached,
    /// Unknown: sent, but not answered (or never reported); it may have landed.
    Unknown,
}

/// One write of a leader's fencing token to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The writer (a process key of the run).
    pub key: String,
    /// The writer's fencing token.
    pub token: u64,
    /// When the write started (its read), CLOCK_MONOTONIC ns.
    pub start: u64,
    /// When its outcome was known.
    pub end: u64,
    /// Its outcome.
    pub outcome: WriteOutcome,
}

impl Write {
    /// Reads a `ledger_write` event of a candidate (`{"event": "ledger_write", "fencing_token",
    /// "start_ns", "mono_ns", "outcome", "stored"}`), attributing it to `key`.
    pub fn from_event(key: &str, event: &serde_json::Value) -> Option<Write> {
        if event["event"] != "ledger_write" {
            return None;
        }
        let outcome = match event["outcome"].as_str()? {
            "accepted" => WriteOutcome::Accepted,
            "rejected" => WriteOutcome::Rejected {
                stored: event["stored"].as_u64()?,
            },
            "unreached" => WriteOutcome::Unreached,
            _ => WriteOutcome::Unknown,
        };
        Some(Write {
            key: key.to_string(),
            token: event["fencing_token"].as_u64()?,
            start: event["start_ns"].as_u64()?,
            end: event["mono_ns"].as_u64()?,
            outcome,
        })
    }
}

/// One fault the harness injected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Its kind, for example `kill` or `partition`.
    pub kind: String,
    /// The process it was aimed at, if any.
    pub target: Option<String>,
    /// When it began.
    pub start: u64,
    /// When it ended (healed, thawed, or at once for a kill).
    pub end: u64,
}

/// A whole candidate frozen (SIGSTOP of all its processes) and thawed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    /// The candidate.
    pub key: String,
    /// When it was frozen.
    pub froze: u64,
    /// When it was thawed.
    pub thawed: u64,
}

/// A leader that a fault deposed while its process ran on, unaware (leader for life: its lock
/// deleted by someone else, an administrator or the garbage collector after its Pod was deleted):
/// it acts until its watch tells it. (An evicted leader is none: it deletes its lock itself.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deposition {
    /// The deposed leader.
    pub key: String,
    /// When the fault began.
    pub at: u64,
}

/// After a whole-candidate pause: how long the resumed leader went on acting, and its writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostPause {
    /// The paused candidate.
    pub key: String,
    /// How long it was frozen.
    pub frozen_for: Duration,
    /// From the thaw to the end of its term; `None` if it never stopped (or did not lead).
    pub window: Option<Duration>,
    /// Its writes that started in the window, and how many of them were accepted, rejected by
    /// the fencing check, not sent (the ledger could not be read), or of unknown outcome.
    pub writes: usize,
    /// See `writes`.
    pub accepted: usize,
    /// See `writes`.
    pub rejected: usize,
    /// See `writes`.
    pub unreached: usize,
    /// See `writes`.
    pub unknown: usize,
}

/// The candidate a process key stands for: keys `NAME@N` are the `N`th process of candidate
/// `NAME` (a leader-for-life Pod whose container restarted keeps its lock and its token); other
/// keys are candidates themselves.
pub fn candidate_of(key: &str) -> &str {
    key.split_once('@').map_or(key, |(name, _)| name)
}

/// The inputs of [`Analysis::run`].
#[derive(Debug, Clone)]
pub struct Analysis<'a> {
    /// The terms, with frozen spans.
    pub history: &'a History,
    /// Every ledger write reported.
    pub writes: &'a [Write],
    /// Every fault, in order.
    pub faults: &'a [Fault],
    /// Every whole-candidate pause.
    pub pauses: &'a [Pause],
    /// Every leader deposed by a fault while its process ran on (see [`Deposition`]).
    pub deposed: &'a [Deposition],
    /// The window of the run: from the first candidate's start to the shutdown.
    pub from: u64,
    /// See `from`.
    pub until: u64,
}

/// What [`Analysis::run`] found.
#[derive(Debug, Clone)]
pub struct Findings {
    /// The checker's report over the window.
    pub report: Report,
    /// Overlaps that no whole-candidate pause explains: must be none.
    pub unexplained_overlaps: Vec<Overlap>,
    /// Overlaps inside a post-pause window (the resumed leader acting beside the new one).
    pub post_pause_overlaps: Vec<Overlap>,
    /// Overlaps of a deposed leader (see [`Deposition`]) with its successor, before it learned
    /// of its deposition.
    pub deposition_overlaps: Vec<Overlap>,
    /// Writes of deposed leaders that started during those overlaps, and of them, those accepted
    /// although a newer leader's write had been accepted before they started (the fencing check
    /// failing: must be none).
    pub deposition_writes: (usize, usize),
    /// One entry per pause.
    pub post_pauses: Vec<PostPause>,
    /// Writes accepted.
    pub accepted: usize,
    /// Writes rejected because a newer leader (a later term of another candidate, with a greater
    /// token) had written: what fencing is for.
    pub stale_rejected: usize,
    /// Writes rejected although no newer leader had a greater token: the writer's token went
    /// backwards (fenced out while legitimately leading).
    pub wrongly_rejected: Vec<Write>,
    /// Writes not sent (the ledger could not be read).
    pub unreached: usize,
    /// Writes of unknown outcome.
    pub unknown: usize,
    /// Accepted writes that did not start within a term of their writer.
    pub outside_terms: Vec<Write>,
    /// Consecutive terms whose fencing token went down, or stayed the same from one candidate to
    /// another (see [`candidate_of`]).
    pub token_regressions: Vec<(Term, Term)>,
    /// The longest leaderless span after the last fault ended.
    pub gap_after_last_fault: Option<Span>,
    /// The longest leaderless span after any fault ended (before the next began), and its fault.
    pub worst_gap_after_a_fault: Option<(String, Span)>,
    /// How many faults of each kind.
    pub faults_by_kind: BTreeMap<String, usize>,
}

// === impl Analysis ===

impl Analysis<'_> {
    /// Analyses the run.
    pub fn run(&self) -> Findings {
        let report = self.history.report_window(self.from, self.until);
        let terms = self.history.terms();

        let post_windows: Vec<(usize, Span)> = self
            .pauses
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let term = term_at(terms, &p.key, p.froze)?;
                Some((
                    i,
                    Span {
                        start: p.thawed,
                        end: term.end.unwrap_or(self.until).max(p.thawed),
                    },
                ))
            })
            .collect();
        let in_post_window = |key: &str, span: &Span| {
            post_windows
                .iter()
                .any(|(i, w)| self.pauses[*i].key == key && span.start >= w.start && span.end <= w.end)
        };
        let (post_pause_overlaps, others): (Vec<Overlap>, Vec<Overlap>) = report
            .overlaps
            .iter()
            .cloned()
            .partition(|o| in_post_window(&o.first, &o.span) || in_post_window(&o.second, &o.span));
        // A deposed leader's window: from the fault to the end of the term it had then.
        let deposition_windows: Vec<(&str, Span)> = self
            .deposed
            .iter()
            .filter_map(|d| {
                let term = term_at(terms, &d.key, d.at)?;
                Some((
                    d.key.as_str(),
                    Span {
                        start: d.at,
                        end: term.end.unwrap_or(self.until).max(d.at),
                    },
                ))
            })
            .collect();
        let in_deposition = |key: &str, span: &Span| {
            deposition_windows
                .iter()
                .any(|(k, w)| *k == key && span.start >= w.start && span.end <= w.end)
        };
        let (deposition_overlaps, unexplained_overlaps): (Vec<Overlap>, Vec<Overlap>) = others
            .into_iter()
            .partition(|o| in_deposition(&o.first, &o.span) || in_deposition(&o.second, &o.span));
        let mut deposition_writes = (0, 0);
        for o in &deposition_overlaps {
            let (old, new) = if in_deposition(&o.first, &o.span) {
                (&o.first, &o.second)
            } else {
                (&o.second, &o.first)
            };
            let newer_wrote = self
                .writes
                .iter()
                .filter(|w| &w.key == new && w.outcome == WriteOutcome::Accepted && w.start >= o.span.start)
                .map(|w| w.end)
                .min();
            for w in self
                .writes
                .iter()
                .filter(|w| &w.key == old && w.start >= o.span.start && w.start <= o.span.end)
            {
                deposition_writes.0 += 1;
                if w.outcome == WriteOutcome::Accepted && newer_wrote.is_some_and(|t| w.start > t) {
                    deposition_writes.1 += 1;
                }
            }
        }

        // Pauses of a candidate that led when frozen (a pause of a follower, e.g. one caught
        // acquiring, has no post-pause window: a term it starts after the thaw is a term).
        let post_pauses = self
            .pauses
            .iter()
            .filter_map(|p| {
                let term = term_at(terms, &p.key, p.froze)?;
                let stopped = term.end;
                let window_end = stopped.unwrap_or(self.until);
                let writes: Vec<&Write> = self
                    .writes
                    .iter()
                    .filter(|w| w.key == p.key && w.start >= p.thawed && w.start <= window_end)
                    .collect();
                let count = |f: fn(&WriteOutcome) -> bool| writes.iter().filter(|w| f(&w.outcome)).count();
                Some(PostPause {
                    key: p.key.clone(),
                    frozen_for: Duration::from_nanos(p.thawed.saturating_sub(p.froze)),
                    window: stopped.map(|s| Duration::from_nanos(s.saturating_sub(p.thawed))),
                    writes: writes.len(),
                    accepted: count(|o| *o == WriteOutcome::Accepted),
                    rejected: count(|o| matches!(o, WriteOutcome::Rejected { .. })),
                    unreached: count(|o| *o == WriteOutcome::Unreached),
                    unknown: count(|o| *o == WriteOutcome::Unknown),
                })
            })
            .collect();

        let mut accepted = 0;
        let mut stale_rejected = 0;
        let mut unreached = 0;
        let mut unknown = 0;
        let mut wrongly_rejected = Vec::new();
        let mut outside_terms = Vec::new();
        for w in self.writes {
            let own = term_at(terms, &w.key, w.start);
            match w.outcome {
                WriteOutcome::Accepted => {
                    accepted += 1;
                    if own.is_none() {
                        outside_terms.push(w.clone());
                    }
                }
                WriteOutcome::Unreached => unreached += 1,
                WriteOutcome::Unknown => unknown += 1,
                WriteOutcome::Rejected { .. } => {
                    let since = own.map_or(0, |t| t.start);
                    let newer = terms.iter().any(|u| {
                        candidate_of(&u.candidate) != candidate_of(&w.key)
                            && u.start >= since
                            && u.start <= w.end
                            && u.fencing_token.is_some_and(|t| t > w.token)
                    });
                    if newer {
                        stale_rejected += 1;
                    } else {
                        wrongly_rejected.push(w.clone());
                    }
                }
            }
        }

        let mut ordered: Vec<&Term> = terms.iter().collect();
        ordered.sort_by_key(|t| (t.start, t.end));
        let token_regressions = ordered
            .windows(2)
            .filter(|w| {
                let same = candidate_of(&w[0].candidate) == candidate_of(&w[1].candidate);
                match (w[0].fencing_token, w[1].fencing_token) {
                    // Another candidate needs a greater token; the same one may keep its own.
                    (Some(a), Some(b)) => b < a || (b == a && !same),
                    _ => false,
                }
            })
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();

        // Leaderless spans: the window minus the union of all terms (frozen leaders hold the lock).
        let mut union: Vec<Span> = Vec::new();
        for t in &ordered {
            let s = Span {
                start: t.start,
                end: t.end.unwrap_or(self.until).max(t.start),
            };
            match union.last_mut() {
                Some(last) if s.start <= last.end => last.end = last.end.max(s.end),
                _ => union.push(s),
            }
        }
        let longest_gap_in = |from: u64, until: u64| -> Option<Span> {
            let mut cursor = from;
            let mut best: Option<Span> = None;
            let mut consider = |s: Span| {
                if s.end > s.start && best.is_none_or(|b| s.len_ns() > b.len_ns()) {
                    best = Some(s);
                }
            };
            for u in union.iter().filter(|u| u.end > from && u.start < until) {
                consider(Span {
                    start: cursor,
                    end: u.start.min(until),
                });
                cursor = cursor.max(u.end);
            }
            consider(Span {
                start: cursor,
                end: until,
            });
            best
        };
        // Faults may overlap (two sets of candidates share one kube-apiserver): liveness is
        // measured from the end of each span of overlapping faults to the start of the next,
        // and charged to the fault that ended the span.
        let mut ordered_faults: Vec<&Fault> = self.faults.iter().collect();
        ordered_faults.sort_by_key(|f| f.start);
        let mut spans: Vec<(Span, &str)> = Vec::new();
        for f in ordered_faults {
            match spans.last_mut() {
                Some((s, kind)) if f.start <= s.end => {
                    if f.end > s.end {
                        s.end = f.end;
                        *kind = &f.kind;
                    }
                }
                _ => spans.push((
                    Span {
                        start: f.start,
                        end: f.end,
                    },
                    &f.kind,
                )),
            }
        }
        let mut worst_gap_after_a_fault: Option<(String, Span)> = None;
        for (i, (span, kind)) in spans.iter().enumerate() {
            let next = spans.get(i + 1).map_or(self.until, |(n, _)| n.start);
            if let Some(g) = longest_gap_in(span.end, next) {
                if worst_gap_after_a_fault
                    .as_ref()
                    .is_none_or(|(_, w)| g.len_ns() > w.len_ns())
                {
                    worst_gap_after_a_fault = Some((kind.to_string(), g));
                }
            }
        }
        let gap_after_last_fault = self
            .faults
            .iter()
            .map(|f| f.end)
            .max()
            .and_then(|end| longest_gap_in(end, self.until));

        let mut faults_by_kind = BTreeMap::new();
        for f in self.faults {
            *faults_by_kind.entry(f.kind.clone()).or_insert(0) += 1;
        }

        Findings {
            report,
            unexplained_overlaps,
            post_pause_overlaps,
            deposition_overlaps,
            deposition_writes,
            post_pauses,
            accepted,
            stale_rejected,
            wrongly_rejected,
            unreached,
            unknown,
            outside_terms,
            token_regressions,
            gap_after_last_fault,
            worst_gap_after_a_fault,
            faults_by_kind,
        }
    }
}

/// The term of `key` that was open at `at`.
fn term_at<'t>(terms: &'t [Term], key: &str, at: u64) -> Option<&'t Term> {
    terms
        .iter()
        .rev()
        .find(|t| t.candidate == key && t.start <= at && t.end.is_none_or(|e| e >= at))
}

// === impl Findings ===

impl Findings {
    /// The longest post-pause window, if any pause ended with the leader stopping.
    pub fn worst_post_pause_window(&self) -> Option<Duration> {
        self.post_pauses.iter().filter_map(|p| p.window).max()
    }

    /// Writes that started in a post-pause window, and how many of them were accepted.
    pub fn post_pause_writes(&self) -> (usize, usize) {
        self.post_pauses
            .iter()
            .fold((0, 0), |(n, a), p| (n + p.writes, a + p.accepted))
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        let kinds: Vec<String> = self
            .faults_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        writeln!(
            f,
            "transitions {} (terms {}); faults {} ({})",
            self.report.transitions,
            self.report.terms,
            self.faults_by_kind.values().sum::<usize>(),
            kinds.join(", ")
        )?;
        writeln!(
            f,
            "overlaps outside post-pause windows: {} ({:?}); overlaps in post-pause windows: {} ({:?} in total)",
            self.unexplained_overlaps.len(),
            self.unexplained_overlaps
                .iter()
                .map(|o| o.span.duration())
                .sum::<Duration>(),
            self.post_pause_overlaps.len(),
            self.post_pause_overlaps
                .iter()
                .map(|o| o.span.duration())
                .sum::<Duration>(),
        )?;
        if !self.deposition_overlaps.is_empty() {
            writeln!(
                f,
                "deposed leaders acting beside their successor until their watch told them: {} time(s), \
                 worst {}; their writes then {}, accepted after the successor wrote {}",
                self.deposition_overlaps.len(),
                ms(self
                    .deposition_overlaps
                    .iter()
                    .map(|o| o.span.duration())
                    .max()
                    .unwrap_or_default()),
                self.deposition_writes.0,
                self.deposition_writes.1
            )?;
        }
        let windows: Vec<String> = self
            .post_pauses
            .iter()
            .map(|p| p.window.map_or("never stopped".into(), ms))
            .collect();
        let (pw, pa) = self.post_pause_writes();
        writeln!(
            f,
            "post-pause window: worst {} over {} pause(s) [{}]; writes in them {pw}, accepted {pa}",
            self.worst_post_pause_window().map_or("-".into(), ms),
            self.post_pauses.len(),
            windows.join(", ")
        )?;
        writeln!(
            f,
            "ledger writes: accepted {}, stale rejected {}, wrongly rejected {}, not sent {}, \
             unknown outcome {}, accepted outside a term {}; fencing-token regressions {}",
            self.accepted,
            self.stale_rejected,
            self.wrongly_rejected.len(),
            self.unreached,
            self.unknown,
            self.outside_terms.len(),
            self.token_regressions.len()
        )?;
        write!(
            f,
            "worst leaderless gap: after the last fault {}; after any fault {}; overall {}",
            self.gap_after_last_fault
                .map_or("none".into(), |g| ms(g.duration())),
            self.worst_gap_after_a_fault
                .as_ref()
                .map_or("none".into(), |(k, g)| format!(
                    "{} (after {k})",
                    ms(g.duration())
                )),
            self.report
                .longest_gap
                .map_or("none".into(), |g| ms(g.duration())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, token: u64, start: u64, outcome: WriteOutcome) -> Write {
        Write {
            key: key.into(),
            token,
            start,
            end: start + 1,
            outcome,
        }
    }

    /// An analysis of `h` over [0, 100) with nothing else; tests set what they need.
    fn over(h: &History) -> Analysis<'_> {
        Analysis {
            history: h,
            writes: &[],
            faults: &[],
            pauses: &[],
            deposed: &[],
            from: 0,
            until: 100,
        }
    }

    fn fault(kind: &str, start: u64, end: u64) -> Fault {
        Fault {
            kind: kind.into(),
            target: None,
            start,
            end,
        }
    }

    #[test]
    fn a_pause_explains_only_the_overlap_after_the_thaw() {
        let mut h = History::new();
        h.began_with_token("a", 0, Some(1));
        h.froze("a", 10);
        h.began_with_token("b", 30, Some(2));
        h.thawed("a", 60);
        h.ended("a", 65);
        h.began_with_token("c", 80, Some(3)); // c beside b: a real overlap
        let writes = [
            write("a", 1, 61, WriteOutcome::Rejected { stored: 2 }),
            write("b", 2, 31, WriteOutcome::Accepted),
            write("a", 1, 5, WriteOutcome::Accepted),
        ];
        let pauses = [Pause {
            key: "a".into(),
            froze: 10,
            thawed: 60,
        }];
        let faults = [fault("pause", 10, 60)];
        let found = Analysis {
            writes: &writes,
            faults: &faults,
            pauses: &pauses,
            ..over(&h)
        }
        .run();
        assert_eq!(found.post_pause_overlaps.len(), 1);
        assert_eq!(found.post_pause_overlaps[0].span, Span { start: 60, end: 65 });
        assert_eq!(
            found.unexplained_overlaps.len(),
            1,
            "{:?}",
            found.unexplained_overlaps
        );
        assert_eq!(found.post_pauses[0].window, Some(Duration::from_nanos(5)));
        assert_eq!(
            (found.post_pauses[0].writes, found.post_pauses[0].rejected),
            (1, 1)
        );
        assert_eq!((found.accepted, found.stale_rejected), (2, 1));
        assert!(found.wrongly_rejected.is_empty());
        assert_eq!(found.faults_by_kind["pause"], 1);
        assert!(found.to_string().contains("post-pause window: worst"));
    }

    #[test]
    fn token_regressions_and_wrong_rejections() {
        let mut h = History::new();
        h.began_with_token("a", 0, Some(5));
        h.ended("a", 10);
        h.began_with_token("b", 20, Some(0)); // the lock was recreated: counting starts again
        let writes = [
            write("a", 5, 1, WriteOutcome::Accepted),
            write("b", 0, 21, WriteOutcome::Rejected { stored: 5 }),
            write("b", 0, 50, WriteOutcome::Unknown),
            write("c", 9, 60, WriteOutcome::Accepted),
        ];
        let found = Analysis {
            writes: &writes,
            ..over(&h)
        }
        .run();
        assert_eq!(found.token_regressions.len(), 1);
        assert_eq!(found.wrongly_rejected.len(), 1);
        assert_eq!((found.unreached, found.unknown), (0, 1));
        assert_eq!(found.outside_terms.len(), 1, "c wrote without leading");
    }

    #[test]
    fn a_deposed_leader_acting_until_its_watch_tells_it_is_set_apart() {
        let mut h = History::new();
        h.began_with_token("a", 0, Some(1));
        h.began_with_token("b", 20, Some(2)); // the lock of a was deleted at 10
        h.ended("a", 25);
        h.began_with_token("c", 30, Some(3)); // nothing explains c beside b
        let writes = [
            write("b", 2, 21, WriteOutcome::Accepted),
            write("a", 1, 23, WriteOutcome::Rejected { stored: 2 }),
        ];
        let deposed = [Deposition {
            key: "a".into(),
            at: 10,
        }];
        let found = Analysis {
            writes: &writes,
            deposed: &deposed,
            ..over(&h)
        }
        .run();
        assert_eq!(found.deposition_overlaps.len(), 1);
        assert_eq!(found.deposition_overlaps[0].span, Span { start: 20, end: 25 });
        assert_eq!(found.deposition_writes, (1, 0));
        assert_eq!(found.unexplained_overlaps.len(), 1);
        assert!(found.to_string().contains("deposed leaders acting beside"));
    }

    #[test]
    fn a_restarted_process_of_the_same_pod_keeps_its_token() {
        let mut h = History::new();
        h.began_with_token("p@1", 0, Some(7));
        h.ended("p@1", 10);
        h.began_with_token("p@2", 20, Some(7)); // same Pod, same lock: it continues
        h.ended("p@2", 30);
        h.began_with_token("q@1", 40, Some(7)); // another candidate with the same token
        let found = over(&h).run();
        assert_eq!(candidate_of("p@2"), "p");
        assert_eq!(candidate_of("lease-id"), "lease-id");
        assert_eq!(found.token_regressions.len(), 1);
        assert_eq!(found.token_regressions[0].1.candidate, "q@1");
    }

    #[test]
    fn gaps_after_faults() {
        let mut h = History::new();
        h.began("a", 0);
        h.ended("a", 10);
        h.began("b", 40); // 30 leaderless after the kill at 10
        h.ended("b", 50);
        h.began("c", 55);
        let faults = [fault("kill", 10, 10), fault("lock-delete", 50, 50)];
        let found = Analysis {
            faults: &faults,
            ..over(&h)
        }
        .run();
        let (kind, gap) = found.worst_gap_after_a_fault.unwrap();
        assert_eq!((kind.as_str(), gap), ("kill", Span { start: 10, end: 40 }));
        assert_eq!(found.gap_after_last_fault, Some(Span { start: 50, end: 55 }));

        // A fault of another set of candidates still going on when the kill ends: the gap
        // counts from the end of both.
        let faults = [fault("apiserver-restart", 5, 30), fault("kill", 10, 10)];
        let found = Analysis {
            faults: &faults,
            ..over(&h)
        }
        .run();
        let (kind, gap) = found.worst_gap_after_a_fault.unwrap();
        assert_eq!(
            (kind.as_str(), gap),
            ("apiserver-restart", Span { start: 30, end: 40 })
        );
    }
}
