//! A new term: the answer to an acquisition. A shard acquired in time is handed to the
//! user as its index and its own [`Leadership`], with its fencing token and renewal schedule.

use std::time::SystemTime;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::{sync::oneshot, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{jittered, table::Event, Engine};
use crate::{
    api::Failure,
    error::Result,
    leadership::{Leadership, LossReason, Strategy, Term},
    lease::{
        decide::{Decision, Observed},
        record::LeaseRecord,
        term::{Term as LeaseTerm, Writer},
    },
    lock::{self, LockRef},
    shards::scheduler::{Key, Phased},
};

// === impl Engine ===

impl Engine {
    /// An acquisition of shard `index` (sent at `sent`) was answered.
    pub(super) fn on_acquired(
        &mut self,
        index: u32,
        decision: Decision,
        record: LeaseRecord,
        sent: Instant,
        result: Result<Lease, Failure>,
        now: Instant,
    ) {
        self.replan();
        let lease = match result {
            Ok(lease) => lease,
            Err(e) => return self.acquire_failed(index, &decision, e, now),
        };
        self.io.throttle.succeeded();
        if now >= sent + self.set.renew_deadline() {
            // Answered after its own renew deadline: by the fail-stop rule the term is over
            // before it began, so it is not handed out (issue 16). The Lease names us: it is
            // taken again as a new term by the next decision.
            warn!(
                shard = index,
                "the acquisition was answered after the renew deadline; not acting on it"
            );
            self.absorb_shard(index, lease, now);
            return;
        }
        let (leadership, fencing_token) = self.begin_term(index, record, lease, sent);
        if self.stopping() {
            // Acquired while handing everything back: nobody works on it; released at once
            // (dropping the handle tells the engine so).
            if let Some(t) = self.slots[index as usize].tenure.term() {
                t.keeper.lose(LossReason::Cancelled);
            }
            let until = now + self.set.cfg.lease.shutdown_grace;
            self.apply(index, Event::Leave { until, release: true }, now);
            drop(leadership);
            return;
        }
        info!(shard = index, fencing_token, "acquired shard");
        if !self.io.hand_out(index, leadership) {
            debug!(shard = index, "nobody takes the shards; giving it up");
        }
        self.publish();
    }

    /// An acquisition of shard `index` failed: a race lost, an error; tried again later.
    fn acquire_failed(&mut self, index: u32, decision: &Decision, failure: Failure, now: Instant) {
        let retry = self.set.cfg.lease.retry_period;
        match failure {
            Failure::Conflict if *decision == Decision::Create => {
                // It exists: maybe unlabelled (never seen by our watch). Read it.
                self.hold_off(index, now + retry);
                self.read(index, self.set.cfg.call_timeout());
            }
            Failure::Conflict | Failure::NotFound => {
                debug!(shard = index, "lost a race for the shard");
                self.hold_off(index, now + retry);
                self.io.wake_at(now + retry, Key::Rebalance);
            }
            Failure::Fatal(e) => {
                warn!(shard = index, error = %e, "cannot take shards");
                self.fail(e);
            }
            e => {
                self.overloaded(&e, now);
                debug!(shard = index, error = ?e, "transient error while acquiring; retrying later");
                let later = now + jittered(retry);
                self.hold_off(index, later);
                self.io.wake_at(later, Key::Rebalance);
            }
        }
    }

    /// Begins a term of shard `index` with the Lease just written: its [`Leadership`] (whose
    /// drop tells the loop that the work stopped), its fencing token and its renewals.
    pub(super) fn begin_term(
        &mut self,
        index: u32,
        record: LeaseRecord,
        lease: Lease,
        sent: Instant,
    ) -> (Leadership, u64) {
        let fencing_token = lock::fencing_token(
            lease.metadata.resource_version.as_deref(),
            u64::from(record.transitions),
        );
        let name = self.set.shard_name(index);
        let term = Term {
            identity: self.set.identity.clone(),
            lock: LockRef {
                namespace: self.set.namespace.clone(),
                name,
            },
            strategy: Strategy::Lease,
            fencing_token,
            acquired_at: record.acquired_at().unwrap_or_else(SystemTime::now),
        };
        let (leadership, keeper, done) = Leadership::new(term);
        keeper.confirm_until(sent + self.set.renew_deadline());
        let (released, wait_released) = oneshot::channel();
        let gen = self.new_gen();
        let leadership = leadership.with_task(self.guard(index, gen, done, wait_released));
        let writer = Writer {
            identity: self.set.identity.clone(),
            instance: self.set.instance.clone(),
            lease_duration_seconds: self.set.cfg.lease.lease_duration_seconds(),
            renew_deadline: self.set.renew_deadline(),
            yields_to_coordinated: false,
        };
        let last_try = self.set.cfg.call_timeout().min(self.set.renew_deadline() / 4);
        let pace = Phased::new(&self.set.phases, index, sent, last_try);
        let term = LeaseTerm::new(writer, lease, record, fencing_token, sent, pace);
        self.io.wake_at(term.next_renewal(), Key::Shard(index));
        self.io.wake_at(term.confirmed_until(), Key::Shard(index));
        self.hold(index, &term, sent);
        self.begin(index, (gen, keeper, released), term);
        (leadership, fencing_token)
    }

    /// The task of a term's [`Leadership`]: tells the loop when the work stops (`done`), then
    /// waits until the shard is released.
    fn guard(
        &self,
        index: u32,
        gen: u64,
        done: CancellationToken,
        wait_released: oneshot::Receiver<()>,
    ) -> tokio::task::JoinHandle<Result<()>> {
        let done_tx = self.io.done_sender();
        tokio::spawn(async move {
            done.cancelled().await;
            let _ = done_tx.send((index, gen));
            let _ = wait_released.await;
            Ok(())
        })
    }

    /// Records the Lease of shard `index` as the term `held` wrote it at `sent`.
    fn hold(&mut self, index: u32, held: &LeaseTerm<Phased>, sent: Instant) {
        let record = held.record();
        let slot = &mut self.slots[index as usize];
        slot.observed = Some(Observed::update(
            None,
            record.clone(),
            held.lease().metadata.resource_version.clone(),
            sent,
        ));
        slot.transitions_seen = Some(
            slot.transitions_seen
                .map_or(record.transitions, |t| t.max(record.transitions)),
        );
        slot.lease = Some(held.lease().clone());
        slot.deleted = None;
        slot.absent_since = None;
        slot.seen = true;
        slot.foreign_self = false;
    }
}
