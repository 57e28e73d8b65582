//! Unit tests of the scheduler: phases, retries, the throttle, and an overload simulation.

use std::collections::BTreeMap;

use super::*;

const RETRY: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(10);
/// The time a held shard keeps for one last renewal before its deadline.
const LAST_TRY: Duration = Duration::from_secs(1);

fn phases(slots: u32) -> Phases {
    Phases {
        epoch: Instant::now(),
        retry: RETRY,
        slots,
    }
}

/// A held shard's renewals as the engine drives them: the pace its term has ([`Phased`]), the
/// last renewal sent (the term's), and the urgency and pause rules ([`urgent_from`],
/// [`hold_back`]) that `engine/schedule.rs` applies.
struct Held {
    pace: Phased,
    last_sent: Instant,
}

impl Held {
    fn new(p: &Phases, slot: u32, sent: Instant, last_try: Duration) -> Self {
        Self {
            pace: Phased::new(p, slot, sent, last_try),
            last_sent: sent,
        }
    }

    fn next(&self) -> Instant {
        self.pace.next()
    }

    fn deadline(&self) -> Instant {
        self.last_sent + RENEW
    }

    fn succeeded(&mut self, sent: Instant) {
        self.last_sent = sent;
        self.pace.succeeded(sent);
    }

    fn failed(&mut self, now: Instant) {
        let deadline = self.deadline();
        self.pace.failed(now, deadline, None);
    }

    fn hold_back(&self, now: Instant, throttle: &Throttle) -> Option<Instant> {
        hold_back(now, throttle, urgent_from(self.last_sent, RENEW))
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_of_a_thousand_shards_are_spread_evenly() {
    let p = phases(1000);
    // All acquired at once, a little after the epoch.
    tokio::time::advance(Duration::from_millis(3)).await;
    let t0 = Instant::now();
    let mut r: Vec<Held> = (0..1000).map(|i| Held::new(&p, i, t0, LAST_TRY)).collect();
    let mut per_bucket: BTreeMap<u128, usize> = BTreeMap::new();
    // Renew each when due, with instant success, for 5 periods.
    for _ in 0..5 {
        for x in &mut r {
            let at = x.next();
            assert!(at - x.last_sent >= RETRY / 8, "too early");
            assert!(at - x.last_sent <= RETRY * 9 / 8, "too late");
            if at >= t0 + RETRY {
                let bucket = (at - (t0 + RETRY)).as_millis() / 100;
                *per_bucket.entry(bucket).or_default() += 1;
            }
            x.succeeded(at);
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
    let mut r = Held::new(&p, 3, Instant::now(), LAST_TRY);
    let first = r.next();
    r.succeeded(first);
    assert_eq!(r.next() - first, RETRY);
    // A late success (the API server was slow) keeps the phase.
    let late = r.next() + Duration::from_millis(700);
    r.succeeded(late);
    assert_eq!(
        (r.next() - p.epoch).as_nanos() % RETRY.as_nanos(),
        p.offset(3).as_nanos()
    );
}

#[tokio::test(start_paused = true)]
async fn retries_back_off_but_leave_a_last_attempt_before_the_deadline() {
    let p = phases(1);
    let t0 = Instant::now();
    let last_try = LAST_TRY;
    let mut r = Held::new(&p, 0, t0, last_try);
    let mut now = r.next();
    let mut delays = Vec::new();
    while now < r.deadline() - last_try {
        r.failed(now);
        assert!(r.next() >= now);
        assert!(r.next() <= r.deadline() - last_try);
        delays.push(r.next() - now);
        now = r.next();
    }
    // 0.5 s, 1 s, 2 s, 2 s, ... (less up to 20% jitter), then cut at the deadline.
    assert!(delays[0] <= RETRY / 4 && delays[0] >= RETRY / 5, "{delays:?}");
    assert!(delays.iter().all(|d| *d <= RETRY), "{delays:?}");
    assert_eq!(now, r.deadline() - last_try);
}

#[tokio::test(start_paused = true)]
async fn the_pause_is_honoured_until_a_renewal_becomes_urgent() {
    let p = phases(1);
    let t0 = Instant::now();
    let r = Held::new(&p, 0, t0, LAST_TRY);
    let mut th = Throttle::new(Duration::from_millis(500), Duration::from_secs(15));
    assert_eq!(r.hold_back(t0, &th), None);
    th.overloaded(t0, Some(Duration::from_secs(1)));
    assert_eq!(r.hold_back(t0, &th), Some(t0 + Duration::from_secs(1)));
    // A long Retry-After: waited only until the renewal is urgent (half the deadline).
    th.overloaded(t0, Some(Duration::from_secs(60)));
    assert_eq!(r.hold_back(t0, &th), Some(t0 + RENEW / 2));
    tokio::time::advance(RENEW / 2).await;
    assert_eq!(r.hold_back(Instant::now(), &th), None);
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
    t0: Instant,
    r: Vec<Held>,
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
        let r: Vec<Held> = (0..Self::SHARDS)
            .map(|i| Held::new(&p, i, t0, LAST_TRY))
            .collect();
        let th = Throttle::new(RETRY / 4, Duration::from_secs(15));
        let mut timers = Timers::default();
        for (i, x) in r.iter().enumerate() {
            timers.at(x.next(), Key::Shard(i as u32));
        }
        Self {
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
                x.succeeded(sent);
            } else {
                *refused += 1;
                th.overloaded(now, Some(Duration::from_secs(1)));
                x.failed(now);
            }
            timers.at(x.next(), Key::Shard(i));
            false
        });
    }

    /// Deadlines and due renewals; then sends what waits while calls are free.
    fn due(&mut self, now: Instant) {
        for k in self.timers.due(now) {
            let Key::Shard(i) = k else { continue };
            let x = &self.r[i as usize];
            if now >= x.deadline() {
                self.lost += 1;
                continue;
            }
            if x.next() > now {
                self.timers.at(x.next(), k);
                continue;
            }
            match x.hold_back(now, &self.th) {
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
        assert!(end < x.deadline(), "a shard is past its deadline");
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
