//! The answers: what the API server answered to the engine's calls, folded into its state.
//! An acquisition that succeeds begins a term (see [`acquired`](super::acquired)); a renewal
//! that fails is retried until the renew deadline, a conflict read again first (409 means
//! "re-read and decide again").

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{jittered, newer, table::Event, table::State, Engine};
use crate::{
    api::Failure,
    error::Result,
    lease::{
        decide::{Decision, Observed},
        record::LeaseRecord,
        term::Step,
    },
    shards::scheduler::Key,
};

/// An answer from the API server.
pub(super) enum Reply {
    Acquired {
        index: u32,
        decision: Decision,
        record: LeaseRecord,
        sent: Instant,
        result: Result<Lease, Failure>,
    },
    Renewed {
        index: u32,
        gen: u64,
        sent: Instant,
        result: Result<Lease, Failure>,
    },
    Released {
        index: u32,
        gen: u64,
        result: Result<Lease, Failure>,
    },
    Read {
        index: u32,
        result: Result<Option<Lease>, Failure>,
    },
    Member {
        sent: Instant,
        result: Result<Lease, Failure>,
    },
    MemberRead {
        result: Result<Option<Lease>, Failure>,
    },
}

// === impl Engine ===

impl Engine {
    /// Pauses the schedule if `failure` says the API server is overloaded.
    pub(super) fn overloaded(&mut self, failure: &Failure, now: Instant) {
        if let Some(retry_after) = failure.overload() {
            self.io.throttle.overloaded(now, retry_after);
        }
    }

    /// An API call returned.
    pub(super) fn on_reply(&mut self, reply: Reply, now: Instant) {
        let index = match &reply {
            Reply::Acquired { index, .. } | Reply::Renewed { index, .. } | Reply::Read { index, .. } => {
                Some(*index)
            }
            _ => None,
        };
        self.answer(reply, now);
        // What waited for the call on the shard to return: a release goes out now; a term
        // that is not ours any more and whose work stopped ends (its `Leadership` may have been
        // dropped during the call: during a renewal sent before the loss, or during a failed
        // attempt to take the shard again), and the shard is looked at again.
        if let Some(index) = index.filter(|i| !self.io.busy(Key::Shard(*i))) {
            match self.slots[index as usize].tenure.term().map(|t| t.state()) {
                Some(State::Releasing) => {
                    self.io.queue_release(now, Key::Shard(index));
                }
                Some(State::Gone) => {
                    self.replan();
                    self.finish_term(index, now);
                }
                _ => {}
            }
        }
    }

    /// Folds an answer into the state of its shard or of the membership Lease (its call is
    /// over: the edge no longer counts its key [`busy`](super::io::Io::busy)).
    fn answer(&mut self, reply: Reply, now: Instant) {
        match reply {
            Reply::Acquired {
                index,
                decision,
                record,
                sent,
                result,
            } => self.on_acquired(index, decision, record, sent, result, now),
            Reply::Renewed {
                index,
                gen,
                sent,
                result,
            } => self.on_renewed(index, gen, sent, result, now),
            Reply::Released { index, gen, result } => self.on_released(index, gen, result, now),
            Reply::Read { index, result } => self.on_read(index, result, now),
            Reply::MemberRead { result } => self.on_member_read(result, now),
            Reply::Member { sent, result } => self.on_member_written(sent, result, now),
        }
    }

    /// The release of shard `index` (term `gen`) was answered: the term ends.
    fn on_released(&mut self, index: u32, gen: u64, result: Result<Lease, Failure>, now: Instant) {
        match &result {
            Ok(lease) => {
                debug!(shard = index, "released shard");
                let lease = lease.clone();
                self.absorb_shard(index, lease, now);
            }
            Err(e) => {
                self.overloaded(e, now);
                debug!(shard = index, error = ?e, "could not release the shard; it will expire");
            }
        }
        if self.slots[index as usize]
            .tenure
            .term()
            .is_some_and(|t| t.gen == gen)
        {
            self.apply(index, Event::Released, now);
            self.finish_term(index, now);
        }
    }

    /// A re-read of shard `index` was answered.
    fn on_read(&mut self, index: u32, result: Result<Option<Lease>, Failure>, now: Instant) {
        match result {
            Ok(Some(lease)) => self.absorb_shard(index, lease, now),
            Ok(None) => self.gone(index, now, self.slots[index as usize].observed.is_none()),
            Err(e) => {
                self.overloaded(&e, now);
                debug!(shard = index, error = ?e, "re-read failed");
            }
        }
        self.io.wake_at(now, Key::Shard(index));
        self.replan();
    }

    /// A re-read of the membership Lease was answered.
    fn on_member_read(&mut self, result: Result<Option<Lease>, Failure>, now: Instant) {
        match result {
            Ok(lease) => self.member.lease = lease,
            Err(e) => {
                self.overloaded(&e, now);
                debug!(error = ?e, "reading the membership Lease failed");
            }
        }
        self.member_due_at(now);
        self.io.wake_at(now, Key::Member);
    }

    /// A write of the membership Lease was answered; schedules the next one.
    fn on_member_written(&mut self, sent: Instant, result: Result<Lease, Failure>, now: Instant) {
        let retry = self.set.cfg.lease.retry_period;
        match result {
            Ok(lease) => {
                self.io.throttle.succeeded();
                self.member.lease = Some(lease);
                self.member_renewed(sent);
            }
            Err(Failure::NotFound) => {
                self.member.lease = None;
                self.member_due_at(now);
            }
            Err(Failure::Conflict) => {
                // Written meanwhile (a write that timed out but landed, an edit): read
                // it again before the next write.
                self.read_member();
                return;
            }
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "cannot write the membership Lease");
                self.fail(e);
                return;
            }
            Err(e) => {
                self.overloaded(&e, now);
                debug!(error = ?e, "membership renewal failed; retrying");
                self.member_due_at(now + jittered(retry / 2));
            }
        }
        if let Some(next) = self.member.pace.next() {
            self.io.wake_at(next, Key::Member);
        }
    }

    /// A renewal of shard `index` (term `gen`, sent at `sent`) was answered.
    fn on_renewed(
        &mut self,
        index: u32,
        gen: u64,
        sent: Instant,
        result: Result<Lease, Failure>,
        now: Instant,
    ) {
        // The term is over, or the answer is an earlier term's: nothing to do (its call is over
        // all the same).
        if self.slots[index as usize]
            .tenure
            .term()
            .is_none_or(|t| t.gen != gen)
        {
            return;
        }
        match result {
            Ok(written) => self.renewed(index, sent, written),
            Err(Failure::NotFound) => {
                self.gone(index, now, false);
            }
            Err(e) => self.renewal_failed(index, e, now),
        }
    }

    /// Shard `index` was renewed (`written`, sent at `sent`).
    fn renewed(&mut self, index: u32, sent: Instant, written: Lease) {
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.tenure.term_mut() else {
            return;
        };
        self.io.throttle.succeeded();
        // Also when the term is handed back meanwhile: its release needs the new version.
        t.term.renewed(written.clone(), sent);
        if t.live() {
            t.keeper.confirm_until(t.term.confirmed_until());
            self.io.wake_at(t.term.next_renewal(), Key::Shard(index));
            self.io.wake_at(t.term.confirmed_until(), Key::Shard(index));
        }
        let record = t.term.record().clone();
        if slot.lease.as_ref().is_none_or(|l| newer(&written, l)) {
            slot.observed = Some(Observed::update(
                slot.observed.as_ref(),
                record,
                written.metadata.resource_version.clone(),
                sent,
            ));
            slot.lease = Some(written);
        }
    }

    /// Renewing shard `index` failed: retried until its renew deadline; a conflict is read
    /// again first.
    fn renewal_failed(&mut self, index: u32, e: Failure, now: Instant) {
        let timeout = self.set.cfg.call_timeout();
        let Some(t) = self.slots[index as usize].tenure.term_mut() else {
            return;
        };
        let step = t.term.write_failed(&e, now);
        self.io.wake_at(t.term.next_renewal(), Key::Shard(index));
        match step {
            // Re-read and decide again (the read's answer is judged as a watched Lease): still
            // ours (somebody edited metadata) or lost.
            Step::Reread { until } => {
                self.read(index, timeout.min(until.saturating_duration_since(now)));
                return;
            }
            Step::End(reason) => return self.lose(index, reason, now),
            Step::Keep | Step::Renew { .. } => {}
        }
        if let Failure::Fatal(err) = &e {
            warn!(shard = index, error = %err, "renewal refused; retrying until the renew deadline");
        } else {
            debug!(shard = index, error = ?e, "renewal failed; retrying");
        }
        self.overloaded(&e, now);
    }
}
