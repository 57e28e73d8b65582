//! A hook for metrics and logs of your own: what an elector observes about its own leadership.
//!
//! Set one with [`LeaseElector::observer`](crate::LeaseElector::observer) or
//! [`ForLife::observer`](crate::ForLife::observer). It is called from a background task, never
//! from the election's own path, so a slow observer delays only later observations.
//! client-go's counterpart is its `MetricsProvider` (the `leader_election_master_status` gauge);
//! the `kube-leader` sidecar exports the same figures from the same observations.
//!
//! ```
//! use std::sync::{
//!     atomic::{AtomicI64, AtomicU64, Ordering},
//!     Arc,
//! };
//!
//! use kube_leader::observer::Observation;
//!
//! /// client-go's gauge and a renewal counter, for any metrics library.
//! #[derive(Debug, Default)]
//! struct LeaderMetrics {
//!     master_status: AtomicI64,
//!     renewals: AtomicU64,
//! }
//!
//! let metrics = Arc::new(LeaderMetrics::default());
//! let m = metrics.clone();
//! let observer = move |o: &Observation| match o {
//!     Observation::Leading { .. } => m.master_status.store(1, Ordering::Relaxed),
//!     Observation::Stopped { .. } => m.master_status.store(0, Ordering::Relaxed),
//!     Observation::Renewed { .. } => {
//!         m.renewals.fetch_add(1, Ordering::Relaxed);
//!     }
//!     _ => {}
//! };
//! # fn elector(client: kube::Client, observer: impl kube_leader::observer::Observer) -> kube_leader::LeaseElector {
//! // kube_leader::LeaseElector::new(client, "my-operator").observer(observer)
//! # kube_leader::LeaseElector::new(client, "my-operator").observer(observer)
//! # }
//! ```

use std::{fmt, sync::Arc, time::Duration};

use kube::Client;
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::{
    events::{self, EventRecorder},
    leadership::{Leadership, LossReason, Term},
    lock::LockRef,
    renewals::Renewals,
};

/// Something an elector observed about its own leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observation {
    /// This candidate leads from now on (not reported for a skipped election).
    Leading {
        /// The term: identity, lock, strategy, fencing token, acquisition time.
        term: Term,
    },
    /// This candidate no longer leads.
    Stopped {
        /// The term that ended.
        term: Term,
        /// Why it ended.
        reason: LossReason,
    },
    /// Lease: a renewal was stored.
    Renewed {
        /// The lock.
        lock: LockRef,
        /// From sending the renewal to seeing it stored.
        latency: Duration,
    },
    /// Lease: renewals that failed or came late since the last observation.
    RenewFailed {
        /// The lock.
        lock: LockRef,
        /// How many.
        count: u64,
    },
}

/// Receives [`Observation`]s. Implemented for every `Fn(&Observation) + Send + Sync + 'static`.
pub trait Observer: Send + Sync + 'static {
    /// Called once per observation, in order, from a background task.
    fn observe(&self, observation: &Observation);
}

impl<F> Observer for F
where
    F: Fn(&Observation) + Send + Sync + 'static,
{
    fn observe(&self, observation: &Observation) {
        self(observation);
    }
}

/// What an elector reports to, besides its logs: the user's observer and the Event recorder.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    observer: Option<Arc<dyn Observer>>,
    events: Option<EventRecorder>,
    /// The Events' reporter set by the user; `None`: the running binary's name.
    event_reporter: Option<Arc<str>>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("observer", &self.observer.is_some())
            .field("events", &self.events)
            .finish()
    }
}

// === impl Hooks ===

impl Hooks {
    /// Hooks that record Events through `client` as the default reporter, and call no
    /// observer yet.
    pub(crate) fn new(client: &Client) -> Self {
        Self {
            observer: None,
            events: Some(EventRecorder::new(client.clone(), events::default_reporter())),
            event_reporter: None,
        }
    }

    /// Sets the user's observer.
    pub(crate) fn set_observer(&mut self, observer: Arc<dyn Observer>) {
        self.observer = Some(observer);
    }

    /// Turns Events on (recorded through `client`) or off.
    pub(crate) fn set_events(&mut self, record: bool, client: &Client) {
        let reporter = self
            .event_reporter
            .clone()
            .unwrap_or_else(events::default_reporter);
        self.events = record.then(|| EventRecorder::new(client.clone(), reporter));
    }

    /// Names the Events' reporter, whether Events are on now or turned on later.
    pub(crate) fn set_event_reporter(&mut self, reporter: Arc<str>, client: &Client) {
        self.event_reporter = Some(reporter);
        let record = self.events.is_some();
        self.set_events(record, client);
    }

    /// Reports a new term and, in a background task, its renewals (Lease: `renewals`) and its
    /// end. `lock_uid` names the lock object in the Events. Nothing for a skipped election.
    pub(crate) fn follow(
        &self,
        leadership: &Leadership,
        lock_uid: Option<String>,
        restarted: bool,
        renewals: Option<watch::Receiver<Renewals>>,
    ) {
        if leadership.is_skipped() || (self.observer.is_none() && self.events.is_none()) {
            return;
        }
        let term = leadership.term().clone();
        let lost = leadership.lost_token();
        let reason = leadership.loss_watch();
        let hooks = self.clone();
        let span = tracing::Span::current();
        tokio::spawn(
            async move {
                hooks
                    .term(term, lock_uid, restarted, lost, reason, renewals)
                    .await;
            }
            .instrument(span),
        );
    }

    async fn term(
        self,
        term: Term,
        lock_uid: Option<String>,
        restarted: bool,
        lost: tokio_util::sync::CancellationToken,
        mut reason: watch::Receiver<Option<LossReason>>,
        renewals: Option<watch::Receiver<Renewals>>,
    ) {
        self.notify(&Observation::Leading { term: term.clone() });
        if let Some(events) = &self.events {
            // Leader for life: a restarted leader continues on its own lock.
            let message = if restarted {
                format!("{} continues as leader after a restart", term.identity)
            } else {
                format!("{} became leader", term.identity)
            };
            events.record(&term, lock_uid.as_deref(), &message).await;
        }
        if let Some(renewals) = renewals {
            self.renewals(&term.lock, renewals, &lost).await;
        }
        lost.cancelled().await;
        let why = match reason.wait_for(Option::is_some).await {
            Ok(r) => r.clone().unwrap_or(LossReason::Released),
            // The keeper is gone without a word: it said so in the log.
            Err(_) => LossReason::KeeperStopped {
                why: "ended without a reason".into(),
            },
        };
        self.notify(&Observation::Stopped {
            term: term.clone(),
            reason: why,
        });
        if let Some(events) = &self.events {
            events
                .record(
                    &term,
                    lock_uid.as_deref(),
                    &format!("{} stopped leading", term.identity),
                )
                .await;
        }
    }

    /// Lease: reports renewals until leadership is lost.
    async fn renewals(
        &self,
        lock: &LockRef,
        mut renewals: watch::Receiver<Renewals>,
        lost: &tokio_util::sync::CancellationToken,
    ) {
        if self.observer.is_none() {
            return;
        }
        let mut seen = renewals.borrow_and_update().clone();
        loop {
            tokio::select! {
                biased;
                () = lost.cancelled() => return,
                changed = renewals.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            let now = renewals.borrow_and_update().clone();
            if now.successes > seen.successes {
                if let Some(latency) = now.last_latency {
                    self.notify(&Observation::Renewed {
                        lock: lock.clone(),
                        latency,
                    });
                }
            }
            if now.failures > seen.failures {
                self.notify(&Observation::RenewFailed {
                    lock: lock.clone(),
                    count: now.failures - seen.failures,
                });
            }
            seen = now;
        }
    }

    fn notify(&self, observation: &Observation) {
        if let Some(o) = &self.observer {
            o.observe(observation);
        }
    }
}
