//! The renewal schedule of one process: renewals spread evenly over the retry period, a
//! process-wide pause when the API server says it is overloaded (429 with `Retry-After`, 5xx),
//! and per-shard retries that never give up a shard's renew deadline for that pause.
//!
//! Shard `i` of `M` is renewed at the phase `i/M` of every retry period (counted from one
//! epoch for the whole process), so that 1,000 shards are 1,000 writes evenly spaced over the
//! period, not 1,000 writes at once every period (client-go's timers, one per Lease, drift into
//! bursts). The first renewal after an acquisition comes at the shard's next phase at least an
//! eighth of a retry period later: between `retry/8` and `9·retry/8` after the acquisition,
//! below the `1.2 × retry` that the renew deadline must exceed.
//!
//! Failed renewals are retried with a jittered exponential backoff from `retry/4` up to the
//! retry period, but never so late that no attempt is left before the shard's renew deadline.
//! An overloaded API server (429, 5xx) pauses every renewal that is not urgent, and every
//! acquisition, until its `Retry-After` (or a backoff) has passed; a renewal is urgent once half
//! its renew deadline has gone by, and is then sent anyway: a shard is only ever lost by its own
//! renew deadline (fail-stop), never by the pause.

use std::{collections::BTreeSet, time::Duration};

use tokio::time::Instant;

use crate::backoff::Backoff;

/// What a scheduled wake-up is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Key {
    /// This candidate's membership Lease.
    Member,
    /// A shard.
    Shard(u32),
    /// Look at the whole set again (a lease may have expired, a member gone).
    Rebalance,
}

/// The renewal phases of one process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phases {
    /// The start of the first period.
    pub(crate) epoch: Instant,
    pub(crate) retry: Duration,
    /// How many phases a period is cut into (shards, plus one for the membership Lease).
    pub(crate) slots: u32,
}

impl Phases {
    /// Where in the period slot `slot` renews.
    pub(crate) fn offset(&self, slot: u32) -> Duration {
        let nanos =
            self.retry.as_nanos() * u128::from(slot % self.slots.max(1)) / u128::from(self.slots.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The renewal after one sent at `sent`: slot `slot`'s first phase at or after
    /// `sent + retry/8`.
    pub(crate) fn next_after(&self, slot: u32, sent: Instant) -> Instant {
        let earliest = sent + self.retry / 8;
        let first = self.epoch + self.offset(slot);
        if earliest <= first {
            return first;
        }
        let retry = self.retry.as_nanos().max(1);
        let periods = (earliest - first).as_nanos().div_ceil(retry);
        let nanos = u64::try_from(periods * retry).unwrap_or(u64::MAX);
        first + Duration::from_nanos(nanos)
    }
}

/// The process-wide pause after the API server said it is overloaded.
#[derive(Debug, Clone)]
pub(crate) struct Throttle {
    until: Option<Instant>,
    backoff: Backoff,
    cap: Duration,
}

impl Throttle {
    /// A throttle whose pauses back off from `initial` to `cap` when the API server gives no
    /// `Retry-After` (an explicit one is honoured up to `cap` too).
    pub(crate) fn new(initial: Duration, cap: Duration) -> Self {
        Self {
            until: None,
            backoff: Backoff::new(initial, cap),
            cap,
        }
    }

    /// The API server answered 429 or 5xx at `now`, with `Retry-After` if it gave one.
    pub(crate) fn overloaded(&mut self, now: Instant, retry_after: Option<Duration>) {
        let pause = match retry_after {
            Some(d) => d.min(self.cap),
            None => self.backoff.next_delay(),
        };
        let until = now + pause;
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// A call succeeded: the next overload starts backing off from the beginning.
    pub(crate) fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// Until when non-urgent calls wait, if they do at `now`.
    pub(crate) fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|u| *u > now)
    }
}

/// The renewal state of one held Lease.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    slot: u32,
    /// When the last successful renewal (or the acquisition) was sent.
    pub(crate) last_sent: Instant,
    /// When to renew next.
    pub(crate) next: Instant,
    backoff: Backoff,
}

impl Renewal {
    /// A Lease acquired by a write sent at `sent`.
    pub(crate) fn new(phases: &Phases, slot: u32, sent: Instant) -> Self {
        Self {
            slot,
            last_sent: sent,
            next: phases.next_after(slot, sent),
            backoff: Backoff::new(phases.retry / 4, phases.retry),
        }
    }

    /// When this Lease stops being held unless renewed: the fail-stop rule.
    pub(crate) fn deadline(&self, renew_deadline: Duration) -> Instant {
        self.last_sent + renew_deadline
    }

    /// From when on a renewal is sent even while the API server asked to wait: half the renew
    /// deadline after the last success.
    pub(crate) fn urgent_from(&self, renew_deadline: Duration) -> Instant {
        self.last_sent + renew_deadline / 2
    }

    /// A renewal sent at `sent` succeeded.
    pub(crate) fn succeeded(&mut self, phases: &Phases, sent: Instant) {
        self.last_sent = sent;
        self.next = phases.next_after(self.slot, sent);
        self.backoff.reset();
    }

    /// A renewal failed at `now`: retry after a backoff, but leave at least `last_try` before the
    /// renew deadline for one more attempt.
    pub(crate) fn failed(&mut self, now: Instant, renew_deadline: Duration, last_try: Duration) {
        let delay = self.backoff.next_delay();
        let latest = self.deadline(renew_deadline).checked_sub(last_try).unwrap_or(now);
        self.next = (now + delay).min(latest).max(now);
    }

    /// When to send the renewal that is due at `now`: `None` now, or the later instant to wait
    /// for while the API server asked to pause (never later than [`Renewal::urgent_from`]).
    pub(crate) fn hold_back(
        &self,
        now: Instant,
        throttle: &Throttle,
        renew_deadline: Duration,
    ) -> Option<Instant> {
        let until = throttle.paused_until(now)?;
        let urgent = self.urgent_from(renew_deadline);
        (now < urgent).then(|| until.min(urgent))
    }
}

/// Wake-ups, in order; a key may be scheduled several times (each wake-up re-examines it).
#[derive(Debug, Default)]
pub(crate) struct Timers {
    set: BTreeSet<(Instant, Key)>,
}

impl Timers {
    pub(crate) fn at(&mut self, when: Instant, key: Key) {
        self.set.insert((when, key));
    }

    /// The earliest wake-up.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.set.first().map(|(t, _)| *t)
    }

    /// Removes and returns every key due at `now`, each once.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Key> {
        let mut keys = Vec::new();
        while let Some((t, k)) = self.set.first().copied() {
            if t > now {
                break;
            }
            self.set.pop_first();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const RETRY: Duration = Duration::from_secs(2);
    const RENEW: Duration = Duration::from_secs(10);

    fn phases(slots: u32) -> Phases {
        Phases {
            epoch: Instant::now(),
            retry: RETRY,
            slots,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_of_a_thousand_shards_are_spread_evenly() {
        let p = phases(1000);
        // All acquired at once, a little after the epoch.
        tokio::time::advance(Duration::from_millis(3)).await;
        let t0 = Instant::now();
        let mut r: Vec<Renewal> = (0..1000).map(|i| Renewal::new(&p, i, t0)).collect();
        let mut per_bucket: BTreeMap<u128, usize> = BTreeMap::new();
        // Renew each when due, with instant success, for 5 periods.
        for _ in 0..5 {
            for x in &mut r {
                let at = x.next;
                assert!(at - x.last_sent >= RETRY / 8, "too early");
                assert!(at - x.last_sent <= RETRY * 9 / 8, "too late");
                if at >= t0 + RETRY {
                    let bucket = (at - (t0 + RETRY)).as_millis() / 100;
                    *per_bucket.entry(bucket).or_default() += 1;
                }
                x.succeeded(&p, at);
            }
        }
        // After the first period every 100 ms of every period carries 50 renewals: 500/s.
        let counts: Vec<usize> = per_bucket.values().copied().collect();
        let steady = &counts[..counts.len() - 1];
        assert!(steady.len() >= 60, "{counts:?}");
        assert!(steady.iter().all(|c| (49..=51).contains(c)), "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn steady_renewals_come_exactly_one_retry_period_apart() {
        let p = phases(10);
        let mut r = Renewal::new(&p, 3, Instant::now());
        let first = r.next;
        r.succeeded(&p, first);
        assert_eq!(r.next - first, RETRY);
        // A late success (the API server was slow) keeps the phase.
        let late = r.next + Duration::from_millis(700);
        r.succeeded(&p, late);
        assert_eq!(
            (r.next - p.epoch).as_nanos() % RETRY.as_nanos(),
            p.offset(3).as_nanos()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_but_leave_a_last_attempt_before_the_deadline() {
        let p = phases(1);
        let t0 = Instant::now();
        let mut r = Renewal::new(&p, 0, t0);
        let last_try = Duration::from_secs(1);
        let mut now = r.next;
        let mut delays = Vec::new();
        while now < r.deadline(RENEW) - last_try {
            r.failed(now, RENEW, last_try);
            assert!(r.next >= now);
            assert!(r.next <= r.deadline(RENEW) - last_try);
            delays.push(r.next - now);
            now = r.next;
        }
        // 0.5 s, 1 s, 2 s, 2 s, ... (less up to 20% jitter), then cut at the deadline.
        assert!(delays[0] <= RETRY / 4 && delays[0] >= RETRY / 5, "{delays:?}");
        assert!(delays.iter().all(|d| *d <= RETRY), "{delays:?}");
        assert_eq!(now, r.deadline(RENEW) - last_try);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pause_is_honoured_until_a_renewal_becomes_urgent() {
        let p = phases(1);
        let t0 = Instant::now();
        let r = Renewal::new(&p, 0, t0);
        let mut th = Throttle::new(Duration::from_millis(500), Duration::from_secs(15));
        assert_eq!(r.hold_back(t0, &th, RENEW), None);
        th.overloaded(t0, Some(Duration::from_secs(1)));
        assert_eq!(r.hold_back(t0, &th, RENEW), Some(t0 + Duration::from_secs(1)));
        // A long Retry-After: waited only until the renewal is urgent (half the deadline).
        th.overloaded(t0, Some(Duration::from_secs(60)));
        assert_eq!(r.hold_back(t0, &th, RENEW), Some(t0 + RENEW / 2));
        tokio::time::advance(RENEW / 2).await;
        assert_eq!(r.hold_back(Instant::now(), &th, RENEW), None);
    }

    #[tokio::test(start_paused = true)]
    async fn without_retry_after_the_pause_backs_off_and_resets() {
        let mut th = Throttle::new(Duration::from_millis(500), Duration::from_secs(4));
        let now = Instant::now();
        let mut pauses = Vec::new();
        for _ in 0..5 {
            th.until = None;
            th.overloaded(now, None);
            pauses.push(th.paused_until(now).unwrap() - now);
        }
        assert!(pauses[0] <= Duration::from_millis(500), "{pauses:?}");
        assert!(pauses[3] > Duration::from_millis(3000), "{pauses:?}");
        assert!(pauses.iter().all(|p| *p <= Duration::from_secs(4)), "{pauses:?}");
        th.succeeded();
        th.until = None;
        th.overloaded(now, None);
        assert!(th.paused_until(now).unwrap() - now <= Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn timers_come_due_in_order_once_each() {
        let mut t = Timers::default();
        let now = Instant::now();
        t.at(now + Duration::from_secs(2), Key::Shard(1));
        t.at(now + Duration::from_secs(1), Key::Shard(2));
        t.at(now + Duration::from_secs(1), Key::Shard(2));
        t.at(now + Duration::from_millis(1500), Key::Shard(2));
        assert_eq!(t.next(), Some(now + Duration::from_secs(1)));
        assert_eq!(t.due(now), vec![]);
        assert_eq!(t.due(now + Duration::from_millis(1500)), vec![Key::Shard(2)]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.due(now + Duration::from_secs(5)), vec![Key::Shard(1)]);
        assert_eq!(t.next(), None);
    }

    /// The simulation of [`an_overloaded_api_server_costs_no_shard`]: 1,000 shards at 15 s /
    /// 10 s / 2 s, at most 16 calls in flight, each taking 10 ms, against an API server whose
    /// capacity drops for a while.
    struct Overload {
        p: Phases,
        t0: Instant,
        r: Vec<Renewal>,
        th: Throttle,
        timers: Timers,
        /// In flight: (answer at, shard, sent at).
        flying: Vec<(Instant, u32, Instant)>,
        waiting: Vec<u32>,
        /// The server accepts `capacity` calls per 100 ms window, the rest get 429.
        window: (u128, usize),
        ok: usize,
        refused: usize,
        lost: usize,
        ok_after: usize,
    }

    impl Overload {
        const SHARDS: u32 = 1000;
        const IN_FLIGHT: usize = 16;
        const LATENCY: Duration = Duration::from_millis(10);

        fn new() -> Self {
            let p = phases(Self::SHARDS);
            let t0 = Instant::now();
            let r: Vec<Renewal> = (0..Self::SHARDS).map(|i| Renewal::new(&p, i, t0)).collect();
            let th = Throttle::new(RETRY / 4, Duration::from_secs(15));
            let mut timers = Timers::default();
            for (i, x) in r.iter().enumerate() {
                timers.at(x.next, Key::Shard(i as u32));
            }
            Self {
                p,
                t0,
                r,
                th,
                timers,
                flying: Vec::new(),
                waiting: Vec::new(),
                window: (0, 0),
                ok: 0,
                refused: 0,
                lost: 0,
                ok_after: 0,
            }
        }

        /// Calls accepted per 100 ms window `at` after the start.
        fn capacity(at: Duration) -> usize {
            if (10..20).contains(&at.as_secs()) {
                20
            } else {
                1000
            }
        }

        /// The answers due by `now`.
        fn answer(&mut self, now: Instant) {
            let Self {
                p,
                t0,
                r,
                th,
                timers,
                flying,
                window,
                ok,
                refused,
                ok_after,
                ..
            } = self;
            let t0 = *t0;
            flying.retain(|&(at, i, sent)| {
                if at > now {
                    return true;
                }
                let w = (at - t0).as_millis() / 100;
                if window.0 != w {
                    *window = (w, 0);
                }
                window.1 += 1;
                let x = &mut r[i as usize];
                if window.1 <= Self::capacity(at - t0) {
                    *ok += 1;
                    if at - t0 >= Duration::from_secs(30) {
                        *ok_after += 1;
                    }
                    th.succeeded();
                    x.succeeded(p, sent);
                } else {
                    *refused += 1;
                    th.overloaded(now, Some(Duration::from_secs(1)));
                    x.failed(now, RENEW, Duration::from_secs(1));
                }
                timers.at(x.next, Key::Shard(i));
                false
            });
        }

        /// Deadlines and due renewals; then sends what waits while calls are free.
        fn due(&mut self, now: Instant) {
            for k in self.timers.due(now) {
                let Key::Shard(i) = k else { continue };
                let x = &self.r[i as usize];
                if now >= x.deadline(RENEW) {
                    self.lost += 1;
                    continue;
                }
                if x.next > now {
                    self.timers.at(x.next, k);
                    continue;
                }
                match x.hold_back(now, &self.th, RENEW) {
                    Some(later) => self.timers.at(later, k),
                    None => self.waiting.push(i),
                }
            }
            while self.flying.len() < Self::IN_FLIGHT && !self.waiting.is_empty() {
                let i = self.waiting.remove(0);
                self.flying.push((now + Self::LATENCY, i, now));
            }
        }

        /// The next thing to happen, or `end`.
        fn next(&self, end: Instant) -> Instant {
            [self.timers.next(), self.flying.iter().map(|f| f.0).min()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(end)
        }
    }

    /// The whole policy against a simulated API server whose capacity drops below the demand
    /// for a while (it answers 429 with `Retry-After: 1` beyond it): 1,000 shards at 15 s / 10 s
    /// / 2 s, at most 16 calls in flight, each taking 10 ms. No shard misses its renew deadline,
    /// and once the capacity is back, the writes go back to one per shard per retry period.
    #[tokio::test(start_paused = true)]
    async fn an_overloaded_api_server_costs_no_shard() {
        const SHARDS: u32 = Overload::SHARDS;
        let mut sim = Overload::new();
        let end = sim.t0 + Duration::from_secs(40);
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            sim.answer(now);
            sim.due(now);
            let next = sim.next(end);
            tokio::time::advance(next.saturating_duration_since(now).max(Duration::from_millis(1))).await;
        }
        let Overload {
            r,
            ok,
            refused,
            lost,
            ok_after,
            ..
        } = sim;
        assert_eq!(lost, 0, "shards lost by their renew deadline");
        for x in &r {
            assert!(end < x.deadline(RENEW), "a shard is past its deadline");
        }
        // The last 10 s: 5 periods of 1,000 renewals.
        let ideal = 5 * SHARDS as usize;
        assert!(
            ok_after <= ideal * 102 / 100 && ok_after >= ideal * 98 / 100,
            "{ok_after} renewals in the last 10 s, ideal {ideal}"
        );
        println!("renewals {ok}, refused {refused} (overload 10 s..20 s), lost {lost}");
        // The pause keeps the refused calls below the demand while overloaded (5,000 renewals
        // in those 10 s, each of which would be refused and retried without it).
        assert!(refused < 5 * SHARDS as usize, "{refused} refused calls");
    }
}
