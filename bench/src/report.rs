//! The Markdown report: tables, ratios kube-leader / client-go, and the goals of issue 4 with
//! met / not met and, when not met, the measured cause.

use std::{fmt::Write as _, time::Duration};

use crate::{
    audit::{self, ByVerb},
    candidate::Impl,
    harness::{Header, LoadPlan, Mode, Plan},
    procfs::{mib, Memory},
    scenario::{
        for_life::ForLifeResult,
        handover::SidecarHandover,
        idle::IdleLoad,
        lease::{LeaseFailover, Stop},
        scale::{ManyLeases, OneLock},
        shards::{OneProcess, Replicas},
        sidecar::SidecarMemory,
        under_load::{self, Run},
    },
    stats::{self, fmt, Summary},
};

/// Everything one run measured.
#[derive(Debug)]
pub(crate) struct Results {
    pub(crate) plan: Plan,
    pub(crate) header: Header,
    pub(crate) for_life: Option<ForLifeResult>,
    pub(crate) lease: Vec<LeaseFailover>,
    pub(crate) idle: Vec<IdleLoad>,
    pub(crate) sidecar: Option<SidecarMemory>,
    /// Handovers through `kube-leader run` (issue 14).
    pub(crate) handover: Option<SidecarHandover>,
    /// Why the sidecar was not measured.
    pub(crate) sidecar_missing: Option<String>,
    pub(crate) one_lock: Vec<OneLock>,
    pub(crate) many: Option<ManyLeases>,
    /// Shards: one process holding many shard Leases.
    pub(crate) shard_process: Option<OneProcess>,
    /// Shards: replicas sharing a set.
    pub(crate) shard_replicas: Option<Replicas>,
    /// Leases held quiet and under load (`shards-hold`, `shards-hold-load`, `under-load`).
    pub(crate) under_load: Vec<Run>,
    /// The load generator's settings.
    pub(crate) load_plan: LoadPlan,
    /// The Lease holder identity of the kube-controller-manager measured beside them, if it ran.
    pub(crate) kcm_identity: Option<String>,
    /// Scenarios that failed, with their error.
    pub(crate) failures: Vec<(String, String)>,
    pub(crate) elapsed: Duration,
}

/// The goals of issue 4 (and the leader-for-life goal of issue 6), evaluated.
#[derive(Debug, Clone)]
pub(crate) struct Goal {
    pub(crate) goal: String,
    pub(crate) measured: String,
    /// `None`: not measured in this run.
    pub(crate) met: Option<bool>,
    pub(crate) cause: String,
}

const MIB_8: u64 = 8 * 1024;
const GOAL_MS: f64 = 100.0;

// === impl Results ===

impl Results {
    fn lease(&self, imp: Impl, stop: Stop) -> Option<&LeaseFailover> {
        self.lease.iter().find(|l| l.imp == imp && l.stop == stop)
    }

    /// `measured`, followed by the library's figure over its HTTP/2 client for the same kind of
    /// stop, where the run measured it.
    fn with_http2(&self, measured: String, stop: Stop) -> String {
        match self
            .lease(Impl::KubeLeaderHttp2, stop)
            .and_then(|h| Summary::of(&h.samples))
        {
            Some(h) => format!(
                "{measured}; over HTTP/2 (feature `http2`) p50 {} / p99 {}",
                fmt(h.p50),
                fmt(h.p99)
            ),
            None => measured,
        }
    }

    fn idle(&self, imp: Impl) -> Option<&IdleLoad> {
        self.idle.iter().find(|l| l.imp == imp)
    }

    /// Handovers through `kube-leader run` beside the library's (issue 14).
    fn handover_table(&self, s: &mut String) {
        let Some(h) = &self.handover else { return };
        let row = |s: &mut String, what: &str, samples: &[Duration], goal: &str| {
            let cells = match Summary::of(samples) {
                Some(x) => format!(
                    "{} | {} | {} | {} | {} | {}",
                    x.n,
                    fmt(x.p50),
                    fmt(x.p90),
                    fmt(x.p99),
                    fmt(x.max),
                    goal
                ),
                None => format!("0 | – | – | – | – | {goal}"),
            };
            let _ = writeln!(s, "| {what} | {cells} |");
        };
        let _ = writeln!(
            s,
            "### Handover through `kube-leader run` (COMMAND stamps its first instruction and its SIGTERM)\n"
        );
        let _ = writeln!(s, "| path | n | p50 | p90 | p99 | max | goal (issue 14) |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        let t = h.timings.map(|t| t.label()).unwrap_or_default();
        if let Some(l) = self.lease(Impl::KubeLeader, Stop::Graceful) {
            row(
                s,
                &format!("library, lease {t}: SIGTERM → next leader's first act"),
                &l.samples,
                "",
            );
        }
        if let Some(l) = self.lease(Impl::KubeLeaderHttp2, Stop::Graceful) {
            row(
                s,
                &format!(
                    "library over HTTP/2 (feature `http2`), lease {t}: SIGTERM → next leader's first act"
                ),
                &l.samples,
                "",
            );
        }
        row(
            s,
            &format!("sidecar, lease {t}: SIGTERM to kube-leader → next COMMAND"),
            &h.sigterm_to_start,
            "p99 ≤ 40 ms",
        );
        row(
            s,
            &format!("sidecar, lease {t}: COMMAND exit → next COMMAND"),
            &h.exit_to_start,
            "p99 ≤ 30 ms",
        );
        if let Some(f) = &self.for_life {
            row(
                s,
                "library, leader for life: lock deleted → old leader released → next leader's first act \
                 (waits for the old leader's word: not a speed figure)",
                &f.lock_deleted,
                "",
            );
        }
        row(
            s,
            "sidecar, leader for life: lock deleted → next COMMAND (waits for the old COMMAND to \
             stop: not a speed figure)",
            &h.lock_deleted_to_start,
            "",
        );
        let _ = writeln!(s);
    }

    /// The whole report.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
        let h = &self.header;
        let mode = match self.plan.mode {
            Mode::Ci => "CI-sized mode: few rounds, small scale; the figures are indicative only",
            Mode::Full => "full mode",
        };
        let _ = writeln!(s, "## kube-leader benchmark ({mode})\n");
        let _ = writeln!(
            s,
            "{} · {} · local control plane (etcd, kube-apiserver and kube-controller-manager {}, \
             started in {:.1} s) on the same machine · Rust candidates built with cargo profile {} · commit {} · \
             load average at start {} · {:.1} s before each Lease round's signal · run took {:.1} min\n",
            h.date,
            h.machine,
            kube_leader_testenv::KUBERNETES_VERSION,
            h.control_plane_started_in.as_secs_f64(),
            h.profile,
            h.commit,
            h.load,
            self.plan.settle.as_secs_f64(),
            self.elapsed.as_secs_f64() / 60.0
        );
        let _ = writeln!(
            s,
            "Failover: time from the signal (the harness's `delete` call, SIGTERM or SIGKILL) to the \
             next leader's first act (its started-leading callback), both stamped with CLOCK_MONOTONIC. \
             Percentiles are nearest-rank: with 20 rounds p99 is the maximum. Requests are counted at \
             the API server from its audit log, one API user per candidate. The machine has 2 cores \
             shared with other work; compare the two implementations by the ratios, measured in the \
             same run.\n"
        );
        self.failover_table(&mut s);
        self.handover_table(&mut s);
        self.ratios(&mut s);
        self.idle_table(&mut s);
        self.memory_table(&mut s);
        self.scale_tables(&mut s);
        self.shard_tables(&mut s);
        s.push_str(&under_load::markdown(
            &self.under_load,
            &self.header,
            &self.load_plan,
            self.kcm_identity.as_deref(),
        ));
        self.goals_table(&mut s);
        if !self.failures.is_empty() {
            let _ = writeln!(s, "### Scenarios that failed\n");
            for (name, e) in &self.failures {
                let _ = writeln!(s, "- **{name}**: {}", e.replace('\n', " "));
            }
            s.push('\n');
        }
        s
    }

    fn failover_table(&self, s: &mut String) {
        let _ = writeln!(s, "### Failover\n");
        let _ = writeln!(
            s,
            "| scenario | implementation | timings | rounds | p50 | p90 | p99 | max |"
        );
        let _ = writeln!(s, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |");
        let row = |s: &mut String, scenario: &str, imp: &str, timings: &str, samples: &[Duration]| {
            if let Some(m) = Summary::of(samples) {
                let _ = writeln!(
                    s,
                    "| {scenario} | {imp} | {timings} | {} | {} | {} | {} | {} |",
                    m.n,
                    fmt(m.p50),
                    fmt(m.p90),
                    fmt(m.p99),
                    fmt(m.max)
                );
            }
        };
        if let Some(f) = &self.for_life {
            row(
                s,
                "for-life: leader Pod deleted → next leader",
                "kube-leader",
                "—",
                &f.pod_deleted,
            );
            row(
                s,
                "↳ same rounds: Pod deleted → GC deleted its dependents",
                "Kubernetes GC",
                "—",
                &f.gc_delay,
            );
            row(
                s,
                "for-life: lock deleted → old leader released → next leader",
                "kube-leader",
                "—",
                &f.lock_deleted,
            );
            row(
                s,
                "↳ same rounds: lock deleted → old leader's loss token",
                "kube-leader",
                "—",
                &f.loss_seen,
            );
        }
        for stop in [Stop::Graceful, Stop::Crash] {
            for imp in Impl::ALL {
                if let Some(l) = self.lease(imp, stop) {
                    row(
                        s,
                        &format!("lease: {}", stop.name()),
                        imp.name(),
                        &l.timings.label(),
                        &l.samples,
                    );
                }
            }
        }
        s.push('\n');
        let mut notes = Vec::new();
        if let Some(f) = &self.for_life {
            if let (Some(a), Some(b)) = (
                Summary::of(&f.pod_to_lock_gone),
                Summary::of(&f.lock_gone_to_leader),
            ) {
                notes.push(format!(
                    "for-life, Pod deleted: the lock was gone after p50 {} / p99 {} (deleted by a waiting \
                     candidate in {} of {} rounds, by the garbage collector in the others); lock gone → next \
                     leader p50 {} / p99 {}.",
                    fmt(a.p50),
                    fmt(a.p99),
                    f.deleted_by_candidate,
                    f.pod_deleted.len(),
                    fmt(b.p50),
                    fmt(b.p99)
                ));
            }
        }
        if let Some(f) = &self.for_life {
            if let (Some(a), Some(b)) = (Summary::of(&f.deletion_seen), Summary::of(&f.recreated_seen)) {
                notes.push(format!(
                    "for-life, lock deleted: the harness's own watch saw the deletion after p50 {} / p99 {} and \
                     the next leader's new lock after p50 {} / p99 {}.",
                    fmt(a.p50),
                    fmt(a.p99),
                    fmt(b.p50),
                    fmt(b.p99)
                ));
            }
        }
        for imp in Impl::ALL {
            if let Some(l) = self.lease(imp, Stop::Graceful) {
                if let (Some(a), Some(b)) = (Summary::of(&l.to_release), Summary::of(&l.release_to_leader)) {
                    notes.push(format!(
                        "{} graceful: SIGTERM → release visible at the API server p50 {} / p99 {}; release → \
                         next leader p50 {} / p99 {}.",
                        imp.name(),
                        fmt(a.p50),
                        fmt(a.p99),
                        fmt(b.p50),
                        fmt(b.p99)
                    ));
                }
            }
            if let Some(l) = self.lease(imp, Stop::Crash) {
                if let Some(a) = Summary::of(&l.renewal_to_leader) {
                    notes.push(format!(
                        "{} crash: last renewal seen by the harness → next leader p50 {} / p99 {} (lease \
                         duration {}).",
                        imp.name(),
                        fmt(a.p50),
                        fmt(a.p99),
                        fmt(l.timings.lease)
                    ));
                    let early = l
                        .renewal_to_leader
                        .iter()
                        .filter(|d| **d < l.timings.lease)
                        .count();
                    if early > 0 {
                        let min = l.renewal_to_leader.iter().min().copied().unwrap_or_default();
                        notes.push(format!(
                            "{} took over **before** the lease had expired in {early} of {} crash rounds (as early \
                             as {} after the last renewal the harness saw, lease duration {}). client-go 1.20 \
                             notices a change of the record by comparing it serialized with whole-second \
                             timestamps, so renewals within one second look unchanged and its followers date \
                             their observation up to a second too early: faster, but a takeover while the old \
                             leader may still act.",
                            imp.name(),
                            l.renewal_to_leader.len(),
                            fmt(min),
                            fmt(l.timings.lease)
                        ));
                    }
                }
            }
        }
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
        s.push('\n');
    }

    fn ratios(&self, s: &mut String) {
        let mut rows = Vec::new();
        for stop in [Stop::Graceful, Stop::Crash] {
            if let (Some(k), Some(g)) = (
                self.lease(Impl::KubeLeader, stop)
                    .and_then(|l| Summary::of(&l.samples)),
                self.lease(Impl::ClientGo, stop)
                    .and_then(|l| Summary::of(&l.samples)),
            ) {
                let r = |a: Duration, b: Duration| ratio(a.as_secs_f64(), b.as_secs_f64());
                rows.push(format!(
                    "| {} | {} | {} | {} | {} |",
                    stop.name(),
                    r(k.p50, g.p50),
                    r(k.p90, g.p90),
                    r(k.p99, g.p99),
                    r(k.max, g.max)
                ));
            }
        }
        let mut other = Vec::new();
        if let (Some(k), Some(g)) = (self.idle(Impl::KubeLeader), self.idle(Impl::ClientGo)) {
            other.push(format!(
                "| idle leader, requests/min | {} |",
                ratio(
                    k.per_minute(audit::total(&k.leader)),
                    g.per_minute(audit::total(&g.leader))
                )
            ));
            other.push(format!(
                "| idle follower, requests/min (mean) | {} |",
                ratio(mean_per_minute(k), mean_per_minute(g))
            ));
            other.push(format!(
                "| peak RSS, leader | {} |",
                ratio(k.leader_memory.hwm_kib as f64, g.leader_memory.hwm_kib as f64)
            ));
            other.push(format!(
                "| peak RSS, follower (max) | {} |",
                ratio(
                    max_hwm(&k.follower_memory) as f64,
                    max_hwm(&g.follower_memory) as f64
                )
            ));
        }
        if rows.is_empty() && other.is_empty() {
            return;
        }
        let _ = writeln!(s, "### Ratios kube-leader / client-go (same run, same timings)\n");
        if !rows.is_empty() {
            let _ = writeln!(s, "| lease failover | p50 | p90 | p99 | max |");
            let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: |");
            for r in rows {
                let _ = writeln!(s, "{r}");
            }
            s.push('\n');
        }
        if !other.is_empty() {
            let _ = writeln!(s, "| idle candidates | kube-leader / client-go |");
            let _ = writeln!(s, "| --- | ---: |");
            for r in other {
                let _ = writeln!(s, "{r}");
            }
            s.push('\n');
        }
    }

    fn idle_table(&self, s: &mut String) {
        if self.idle.is_empty() {
            return;
        }
        let verbs = ["get", "list", "watch", "create", "update", "patch", "delete"];
        let _ = writeln!(
            s,
            "### Idle API load: requests per minute per candidate, counted at the API server\n"
        );
        let _ = writeln!(
            s,
            "| implementation | timings | window | role | requests/min | {} | other |",
            verbs.join(" | ")
        );
        let _ = writeln!(
            s,
            "| --- | --- | ---: | --- | ---: |{}---: |",
            " ---: |".repeat(verbs.len())
        );
        for l in &self.idle {
            let per_verb = |c: &ByVerb, scale: f64| {
                let known: u64 = verbs.iter().map(|v| c.get(*v).copied().unwrap_or(0)).sum();
                let mut cells: Vec<String> = verbs
                    .iter()
                    .map(|v| format!("{:.1}", l.per_minute(c.get(*v).copied().unwrap_or(0)) / scale))
                    .collect();
                cells.push(format!("{:.1}", l.per_minute(audit::total(c) - known) / scale));
                cells.join(" | ")
            };
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} s | leader | {:.1} | {} |",
                l.imp.name(),
                l.timings.label(),
                l.window.as_secs_f64(),
                l.per_minute(audit::total(&l.leader)),
                per_verb(&l.leader, 1.0)
            );
            let all = audit::sum(&l.followers);
            let n = l.followers.len().max(1) as f64;
            let max = l.followers.iter().map(audit::total).max().unwrap_or(0);
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} s | follower (mean of {}; max {:.1}) | {:.1} | {} |",
                l.imp.name(),
                l.timings.label(),
                l.window.as_secs_f64(),
                l.followers.len(),
                l.per_minute(max),
                l.per_minute(audit::total(&all)) / n,
                per_verb(&all, n)
            );
        }
        s.push('\n');
        for l in &self.idle {
            if l.changes > 0 {
                let _ = writeln!(
                    s,
                    "- {}: leadership changed {} times during the idle window.",
                    l.imp.name(),
                    l.changes
                );
            }
        }
    }

    fn memory_table(&self, s: &mut String) {
        let mut rows = Vec::new();
        let mut row = |what: &str, role: &str, m: &Memory| {
            rows.push(format!(
                "| {what} | {role} | {} | {} | {} | {} |",
                mib(m.hwm_kib),
                mib(m.rss_kib),
                mib(m.anon_kib),
                mib(m.file_kib)
            ));
        };
        if let Some(sc) = &self.sidecar {
            let what = format!(
                "`kube-leader run` sidecar (lease, after {:.0} s)",
                sc.window.as_secs_f64()
            );
            row(&what, "leader", &sc.leader);
            row(&what, "follower", &sc.follower);
            if let Some(m) = &sc.supervisor {
                row("↳ its `kube-leader __supervise` process", "leader", m);
            }
        }
        for l in &self.idle {
            let what = match l.imp {
                Impl::KubeLeader | Impl::KubeLeaderHttp2 => {
                    "library candidate (`lease-candidate`, LeaseElector)"
                }
                Impl::ClientGo => "client-go candidate (Go)",
            };
            row(what, "leader", &l.leader_memory);
            if let Some(m) = l.follower_memory.iter().max_by_key(|m| m.hwm_kib) {
                row(what, &format!("follower (max of {})", l.follower_memory.len()), m);
            }
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "### Memory: peak RSS (`VmHWM` from `/proc/<pid>/status`)\n");
        let _ = writeln!(s, "| process | role | peak RSS | RSS | anonymous | file-backed |");
        let _ = writeln!(s, "| --- | --- | ---: | ---: | ---: | ---: |");
        for r in rows {
            let _ = writeln!(s, "{r}");
        }
        s.push('\n');
        if let Some(why) = &self.sidecar_missing {
            let _ = writeln!(
                s,
                "- The `kube-leader run` sidecar was not measured ({why}); the library candidate stands in for it.\n"
            );
        }
    }

    fn scale_tables(&self, s: &mut String) {
        if !self.one_lock.is_empty() {
            let _ = writeln!(
                s,
                "### Scale: N kube-leader candidates on one Lease, in one process (one client per {} candidates)\n",
                self.plan.per_client
            );
            let _ = writeln!(
                s,
                "| candidates | clients | timings | time to first leader | failover p50 | failover max | requests per failover | idle requests/s (all) | idle requests/s (followers) | CPU idle | peak RSS |"
            );
            let _ = writeln!(
                s,
                "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            for o in &self.one_lock {
                let f = Summary::of(&o.failovers);
                let w = o.window.as_secs_f64();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1}% of a core | {} |",
                    o.candidates,
                    o.clients,
                    o.timings.label(),
                    fmt(o.first_leader),
                    f.map_or("—".into(), |f| fmt(f.p50)),
                    f.map_or("—".into(), |f| format!("{} (n={})", fmt(f.max), f.n)),
                    o.requests_per_failover,
                    audit::total(&o.idle) as f64 / w,
                    followers_only(&o.idle) as f64 / w,
                    o.cpu * 100.0,
                    mib(o.memory.hwm_kib)
                );
            }
            let _ = writeln!(
                s,
                "\nFailover here is a graceful step-down (release); every follower sees it in one watch event and \
                 races for the Lease (one wins, the rest get 409 Conflict). Followers' idle requests are all \
                 requests minus the leader's renewals (`update`).\n"
            );
            for o in &self.one_lock {
                let _ = writeln!(
                    s,
                    "- {} candidates, requests during {} failovers by verb: {}.",
                    o.candidates,
                    o.rounds,
                    verbs(&o.burst)
                );
            }
            s.push('\n');
        }
        if let Some(m) = &self.many {
            let _ = writeln!(s, "### Scale: one process holding N Leases\n");
            let _ = writeln!(
                s,
                "| Leases | clients | timings | all held after | writes/s | requests/s | CPU | peak RSS | RSS | Leases lost |"
            );
            let _ = writeln!(
                s,
                "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.1} (ideal {:.1}) | {:.1} | {:.1}% of a core | {} | {} | {} |\n",
                m.leases,
                m.clients,
                m.timings.label(),
                fmt(m.all_held),
                m.writes_per_second(),
                m.leases as f64 / m.timings.retry.as_secs_f64(),
                audit::total(&m.idle) as f64 / m.window.as_secs_f64(),
                m.cpu * 100.0,
                mib(m.memory.hwm_kib),
                mib(m.memory.rss_kib),
                m.lost
            );
            let _ = writeln!(
                s,
                "- Requests in the {:.0} s window by verb: {}. Ideal: one `update` per Lease per retry period and \
                 nothing else; more means renewals failed and were retried, or Leases were lost (renew deadline \
                 passed on an overloaded API server) and campaigned for again.\n",
                m.window.as_secs_f64(),
                verbs(&m.idle)
            );
            let by_code: Vec<String> = m
                .codes
                .iter()
                .map(|(verb, codes)| {
                    let c: Vec<String> = codes.iter().map(|(code, n)| format!("{code}: {n}")).collect();
                    format!("{verb} ({})", c.join(", "))
                })
                .collect();
            let _ = writeln!(s, "- The same by HTTP status: {}.\n", by_code.join("; "));
        }
    }

    fn shard_tables(&self, s: &mut String) {
        if let Some(m) = &self.shard_process {
            let _ = writeln!(
                s,
                "### Shards: one process holding N shard Leases (`kube_leader::Shards`, one client)\n"
            );
            let _ = writeln!(
                s,
                "| Leases | timings | all held after | window | writes/s | requests/s | 429s | CPU | peak RSS | RSS | Leases lost |"
            );
            let _ = writeln!(
                s,
                "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} s | {:.1} (ideal {:.1}, {:.3}×) | {:.1} | {} | {:.1}% of a core | {} | {} | {} |\n",
                m.leases,
                m.timings.label(),
                fmt(m.all_held),
                m.window.as_secs_f64(),
                m.writes_per_second(),
                m.ideal(),
                m.writes_per_second() / m.ideal(),
                audit::total(&m.requests) as f64 / m.window.as_secs_f64(),
                m.refused(),
                m.cpu * 100.0,
                mib(m.memory.hwm_kib),
                mib(m.memory.rss_kib),
                m.lost
            );
            let by_code: Vec<String> = m
                .codes
                .iter()
                .map(|(verb, codes)| {
                    let c: Vec<String> = codes.iter().map(|(code, n)| format!("{code}: {n}")).collect();
                    format!("{verb} ({})", c.join(", "))
                })
                .collect();
            let _ = writeln!(
                s,
                "- Requests in the window by verb and HTTP status: {}. Ideal: one `update` per shard per retry \
                 period, plus one for the membership Lease; the watch of all the set's Leases is one request \
                 per 290 s.\n",
                by_code.join("; ")
            );
        }
        if let Some(r) = &self.shard_replicas {
            let _ = writeln!(
                s,
                "### Shards: {} replicas sharing {} shards\n",
                r.replicas, r.shards
            );
            let _ = writeln!(s, "| moment | timings | shards per replica | worst distance from fair | time to the fair spread |");
            let _ = writeln!(s, "| --- | --- | --- | ---: | ---: |");
            for (what, sp) in [
                ("after start", &r.start),
                ("after a replica joins", &r.join),
                ("after a replica is SIGKILLed", &r.crash),
            ] {
                let _ = writeln!(
                    s,
                    "| {what} | {} | {} | {:.2} | {} |",
                    r.timings.label(),
                    sp.describe(),
                    sp.worst(),
                    sp.took.map_or("not reached".into(), fmt)
                );
            }
            let per: Vec<String> = r.idle_per_minute.iter().map(|p| format!("{p:.1}")).collect();
            let _ = writeln!(
                s,
                "\n- Idle requests per minute per replica over {:.0} s: {} (by verb, all replicas: {}).\n",
                r.idle_window.as_secs_f64(),
                per.join(", "),
                verbs(&r.idle)
            );
        }
    }

    /// The goals of issue 13 (shards), evaluated.
    fn shard_goals(&self, goals: &mut Vec<Goal>) {
        let g = "shards: one process holds N Leases (15s/10s/2s) through the window, 0 lost";
        goals.push(match &self.shard_process {
            Some(m) => Goal {
                goal: g.into(),
                measured: format!(
                    "{} Leases for {:.0} s ({}): {} lost",
                    m.leases,
                    m.window.as_secs_f64(),
                    m.timings.label(),
                    m.lost
                ),
                met: Some(m.lost == 0),
                cause: if m.lost == 0 {
                    String::new()
                } else {
                    format!("429s: {}", m.refused())
                },
            },
            None => not_measured(g),
        });
        let g = "shards: writes/s ≤ 1.02 × ideal (N / retry period)";
        goals.push(match &self.shard_process {
            Some(m) => {
                let ratio = m.writes_per_second() / m.ideal();
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{:.1} writes/s, ideal {:.1}: {ratio:.3}×",
                        m.writes_per_second(),
                        m.ideal()
                    ),
                    met: Some(ratio <= 1.02),
                    cause: if ratio <= 1.02 {
                        String::new()
                    } else {
                        format!("by verb: {}", verbs(&m.requests))
                    },
                }
            }
            None => not_measured(g),
        });
        let g = "shards: spread within 1 of fair after start, a join and a SIGKILL";
        goals.push(match &self.shard_replicas {
            Some(r) => {
                let all = [&r.start, &r.join, &r.crash];
                let met = all.iter().all(|s| s.took.is_some() && s.worst() < 1.0);
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{} replicas × {} shards: {} / {} / {}",
                        r.replicas,
                        r.shards,
                        r.start.describe(),
                        r.join.describe(),
                        r.crash.describe()
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        "see the shard table".into()
                    },
                }
            }
            None => not_measured(g),
        });
        let g = "shards: rebalance after a join ≤ one retry period + handover (1 s)";
        goals.push(match &self.shard_replicas {
            Some(r) => {
                let bound = r.timings.retry + Duration::from_secs(1);
                let met = r.join.took.is_some_and(|t| t <= bound);
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{} (retry period {})",
                        r.join.took.map_or("not reached".into(), fmt),
                        fmt(r.timings.retry)
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        "from the start of the joining process".into()
                    },
                }
            }
            None => not_measured(g),
        });
        let g = "shards: rebalance after a SIGKILL ≤ lease duration + one retry period";
        goals.push(match &self.shard_replicas {
            Some(r) => {
                let bound = r.timings.lease + r.timings.retry;
                let met = r.crash.took.is_some_and(|t| t <= bound);
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{} (lease {} + retry {})",
                        r.crash.took.map_or("not reached".into(), fmt),
                        fmt(r.timings.lease),
                        fmt(r.timings.retry)
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        "see the shard table".into()
                    },
                }
            }
            None => not_measured(g),
        });
    }

    /// The goals, evaluated.
    pub(crate) fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;

        // 1. for-life Pod deletion.
        let g = "for-life: leader Pod deleted → new leader ≤ GC delay + 100 ms (p99)";
        goals.push(match &self.for_life {
            Some(f) if !f.pod_deleted.is_empty() => {
                let excess = stats::excess_ms(&f.pod_deleted, &f.gc_delay);
                let p99 = stats::percentile_f64(&excess, 99.0).unwrap_or(f64::NAN);
                let (pd, gc) = (
                    Summary::of(&f.pod_deleted).unwrap(),
                    Summary::of(&f.gc_delay).unwrap(),
                );
                let met = p99 <= GOAL_MS;
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "p99 {} vs GC p99 {}; per round, new leader − GC delay: p99 {p99:+.0} ms; a waiting \
                         candidate deleted the dead leader's lock itself in {} of {} rounds",
                        fmt(pd.p99),
                        fmt(gc.p99),
                        f.deleted_by_candidate,
                        f.pod_deleted.len()
                    ),
                    met: Some(met),
                    cause: if met { String::new() } else { for_life_cause(f) },
                }
            }
            _ => not_measured(g),
        });

        // 2. for-life lock deletion (issue 6).
        let g = "for-life: lock deleted → new leader ≤ 100 ms (p99)";
        goals.push(
            match self.for_life.as_ref().and_then(|f| Summary::of(&f.lock_deleted)) {
                Some(m) => {
                    let met = ms(m.p99) <= GOAL_MS;
                    Goal {
                        goal: g.into(),
                        measured: format!("p50 {} / p99 {}", fmt(m.p50), fmt(m.p99)),
                        met: Some(met),
                        cause: if met {
                            String::new()
                        } else {
                            self.for_life
                                .as_ref()
                                .map_or_else(String::new, lock_deletion_cause)
                        },
                    }
                }
                None => not_measured(g),
            },
        );

        // 3. graceful handover.
        let g = "lease: graceful handover ≤ 100 ms (p99)";
        goals.push(match self.lease(Impl::KubeLeader, Stop::Graceful) {
            Some(l) if !l.samples.is_empty() => {
                let m = Summary::of(&l.samples).unwrap();
                let met = ms(m.p99) <= GOAL_MS;
                let go = self
                    .lease(Impl::ClientGo, Stop::Graceful)
                    .and_then(|g| Summary::of(&g.samples))
                    .map(|g| format!(" (client-go p99 {})", fmt(g.p99)))
                    .unwrap_or_default();
                let go = self.with_http2(go, Stop::Graceful);
                Goal {
                    goal: g.into(),
                    measured: format!("p50 {} / p99 {}{go}", fmt(m.p50), fmt(m.p99)),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        match (Summary::of(&l.to_release), Summary::of(&l.release_to_leader)) {
                            (Some(a), Some(b)) => format!(
                                "SIGTERM → release visible p99 {}; release → next leader p99 {}",
                                fmt(a.p99),
                                fmt(b.p99)
                            ),
                            _ => "no breakdown: the harness's watch missed the release".into(),
                        }
                    },
                }
            }
            _ => not_measured(g),
        });

        // 4. crash takeover.
        let g = "lease: crash takeover ≤ lease duration + 100 ms (p99)";
        goals.push(match self.lease(Impl::KubeLeader, Stop::Crash) {
            Some(l) if !l.samples.is_empty() => {
                let m = Summary::of(&l.samples).unwrap();
                let bound = l.timings.lease + Duration::from_millis(100);
                let met = m.p99 <= bound;
                let go = self
                    .lease(Impl::ClientGo, Stop::Crash)
                    .and_then(|g| Summary::of(&g.samples))
                    .map(|g| format!(" (client-go p99 {})", fmt(g.p99)))
                    .unwrap_or_default();
                let go = self.with_http2(go, Stop::Crash);
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "p99 {} with lease duration {}{go}",
                        fmt(m.p99),
                        fmt(l.timings.lease)
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        Summary::of(&l.renewal_to_leader).map_or("no breakdown".into(), |r| {
                            format!(
                                "last renewal seen → next leader p99 {}: {} after expiry",
                                fmt(r.p99),
                                fmt(r.p99.saturating_sub(l.timings.lease))
                            )
                        })
                    },
                }
            }
            _ => not_measured(g),
        });

        // 5. idle follower.
        let g = "idle follower: 0 requests/min";
        goals.push(match self.idle(Impl::KubeLeader) {
            Some(l) => {
                let max = l.followers.iter().map(audit::total).max().unwrap_or(0);
                let met = max == 0;
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{:.2} requests/min per follower (max of {} over {:.0} s)",
                        l.per_minute(max),
                        l.followers.len(),
                        l.window.as_secs_f64()
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        format!("by verb, all followers: {}", verbs(&audit::sum(&l.followers)))
                    },
                }
            }
            None => not_measured(g),
        });

        // 6. leader.
        let g = "leader: ≤ 1 write per retry period and no reads";
        goals.push(match self.idle(Impl::KubeLeader) {
            Some(l) => {
                let periods = l.window.as_secs_f64() / l.timings.retry.as_secs_f64();
                let writes = audit::writes(&l.leader);
                let reads = audit::reads(&l.leader);
                let met = writes as f64 <= periods.floor() + 1.0 && reads == 0;
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{writes} writes in {periods:.1} retry periods ({:.2} per period), {reads} reads",
                        writes as f64 / periods
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        format!("by verb: {}", verbs(&l.leader))
                    },
                }
            }
            None => not_measured(g),
        });

        // 7. sidecar memory.
        let g = "sidecar peak RSS ≤ 8 MiB";
        let sidecar = self.sidecar.as_ref().map(|s| {
            let helper = s
                .supervisor
                .map(|m| format!(" (plus its `__supervise` helper process: {})", mib(m.hwm_kib)))
                .unwrap_or_default();
            let size = format!("; the binary is {} on disk", mib(s.binary_bytes / 1024));
            (
                format!("`kube-leader run`{helper}"),
                higher_peak(s.leader, s.follower),
                size,
            )
        });
        let library = self.idle(Impl::KubeLeader).map(|l| {
            (
                "library candidate (no sidecar measured)".to_owned(),
                max_mem(l),
                String::new(),
            )
        });
        goals.push(match sidecar.or(library) {
            Some((what, m, size)) => {
                let met = m.hwm_kib <= MIB_8;
                Goal {
                    goal: g.into(),
                    measured: format!("{what}: {}", mib(m.hwm_kib)),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        format!(
                            "at the end: {} anonymous (heap, stacks) + {} file-backed (the binary's own pages and \
                             shared libraries){size}",
                            mib(m.anon_kib),
                            mib(m.file_kib)
                        )
                    },
                }
            }
            None => not_measured(g),
        });

        // 8. 1,000 idle followers.
        let g = "1,000 idle followers cost the API server < 1 request/s in total";
        goals.push(match self.one_lock.iter().max_by_key(|o| o.candidates) {
            Some(o) => {
                let rate = followers_only(&o.idle) as f64 / o.window.as_secs_f64();
                let met = rate < 1.0;
                let scale = if o.candidates >= 1000 {
                    String::new()
                } else {
                    format!(" (measured with {} candidates only)", o.candidates)
                };
                Goal {
                    goal: g.into(),
                    measured: format!(
                        "{rate:.2} requests/s from {} idle followers over {:.0} s{scale}",
                        o.candidates - 1,
                        o.window.as_secs_f64()
                    ),
                    met: Some(met),
                    cause: if met {
                        String::new()
                    } else {
                        format!("by verb, all candidates: {}", verbs(&o.idle))
                    },
                }
            }
            None => not_measured(g),
        });
        self.shard_goals(&mut goals);
        goals
    }

    fn goals_table(&self, s: &mut String) {
        let _ = writeln!(s, "### Goals (issues 4 and 13)\n");
        let _ = writeln!(s, "| goal | measured | met? | cause, when not met |");
        let _ = writeln!(s, "| --- | --- | --- | --- |");
        for g in self.goals() {
            let met = match g.met {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "not measured",
            };
            let _ = writeln!(s, "| {} | {} | {met} | {} |", g.goal, g.measured, g.cause);
        }
        s.push('\n');
    }
}

fn for_life_cause(f: &ForLifeResult) -> String {
    match (Summary::of(&f.pod_to_lock_gone), Summary::of(&f.lock_gone_to_leader)) {
        (Some(a), Some(b)) => format!(
            "Pod deleted → lock gone p99 {} (by a candidate in {} of {} rounds); lock gone → new leader p99 {}",
            fmt(a.p99),
            f.deleted_by_candidate,
            f.pod_deleted.len(),
            fmt(b.p99)
        ),
        _ => "no breakdown: the harness's watch missed the lock's deletion".into(),
    }
}

fn lock_deletion_cause(f: &ForLifeResult) -> String {
    match (Summary::of(&f.deletion_seen), Summary::of(&f.recreated_seen)) {
        (Some(a), Some(b)) => format!(
            "after the delete call, the harness's watch saw the deletion at p99 {} and the new lock at p99 {}; \
             the rest, to the end of `become_leader`, is the new leader's own calls after its create",
            fmt(a.p99),
            fmt(b.p99)
        ),
        _ => "no breakdown: the harness's watch missed the lock's deletion".into(),
    }
}

fn not_measured(goal: &str) -> Goal {
    Goal {
        goal: goal.into(),
        measured: "—".into(),
        met: None,
        cause: "scenario not run or failed".into(),
    }
}

/// All requests but the leader's renewals: followers never write while idle.
fn followers_only(c: &ByVerb) -> u64 {
    audit::total(c) - c.get("update").copied().unwrap_or(0)
}

fn mean_per_minute(l: &IdleLoad) -> f64 {
    l.per_minute(audit::total(&audit::sum(&l.followers))) / l.followers.len().max(1) as f64
}

fn max_hwm(ms: &[Memory]) -> u64 {
    ms.iter().map(|m| m.hwm_kib).max().unwrap_or(0)
}

fn max_mem(l: &IdleLoad) -> Memory {
    l.follower_memory
        .iter()
        .copied()
        .chain([l.leader_memory])
        .max_by_key(|m| m.hwm_kib)
        .unwrap_or_default()
}

fn verbs(c: &ByVerb) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|(v, n)| format!("{n} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        if a == 0.0 {
            "— (both 0)".into()
        } else {
            "∞".into()
        }
    } else {
        format!("{:.2}×", a / b)
    }
}

/// The one of `a` and `b` with the higher peak RSS.
fn higher_peak(a: Memory, b: Memory) -> Memory {
    if b.hwm_kib > a.hwm_kib {
        b
    } else {
        a
    }
}
