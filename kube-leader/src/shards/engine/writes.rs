//! The writes: every API call of the engine (acquire, renew and release a shard, read it again,
//! create, renew and read the membership Lease), sent on a background future whose [`Reply`]
//! comes back to the loop.

use std::time::Duration;

use futures::{future::BoxFuture, FutureExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::PostParams;
use tokio::time::Instant;
use tracing::debug;

use super::{answers::Reply, table::State, Engine, OwnedOp};
use crate::{
    api::{call, Failure},
    lease::{
        decide::{record_for, Decision},
        record::{now_micro, set_fencing_token, set_writer, LeaseRecord},
        term::Step,
    },
    shards::scheduler::Key,
};

// === impl Engine ===

impl Engine {
    /// Creates or renews the membership Lease.
    pub(super) fn write_member(&mut self) {
        if self.io.busy(Key::Member) || self.stopping() {
            return;
        }
        let record = LeaseRecord {
            holder: Some(self.set.identity.clone()),
            lease_duration: Some(self.set.cfg.lease.lease_duration),
            acquire_time: Some(now_micro()),
            renew_time: Some(now_micro()),
            transitions: 0,
        };
        let secs = self.set.cfg.lease.lease_duration_seconds();
        let api = self.io.api.clone();
        let timeout = self.set.cfg.call_timeout();
        let op = OwnedOp {
            name: self.member.name.clone(),
            ..self.set.op("update")
        };
        let sent = Instant::now();
        match self.member.lease.clone() {
            Some(mut lease) => {
                let keep = LeaseRecord::from_lease(&lease);
                let record = LeaseRecord {
                    acquire_time: keep.acquire_time.or(record.acquire_time),
                    transitions: keep.transitions,
                    ..record
                };
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), secs);
                self.set.label(&mut lease, "member");
                let name = op.name.clone();
                self.io.push(Key::Member, async move {
                    let result = call(
                        op.op(),
                        timeout,
                        api.replace(&name, &PostParams::default(), &lease),
                    )
                    .await;
                    Reply::Member { sent, result }
                });
            }
            None => {
                let mut lease = self.set.new_lease(&self.member.name, &record, "member");
                self.set.label(&mut lease, "member");
                let op = OwnedOp { verb: "create", ..op };
                self.io.push(Key::Member, async move {
                    let result = call(op.op(), timeout, api.create(&PostParams::default(), &lease)).await;
                    Reply::Member { sent, result }
                });
            }
        }
    }

    /// Sends the write queued for shard `index`: a renewal, or the release.
    pub(super) fn write_shard(&mut self, index: u32, now: Instant) {
        if self.io.busy(Key::Shard(index)) {
            // A renewal or read is in flight: a renewal comes again from its timer, a release
            // is queued again when the call returns (see `on_reply`).
            return;
        }
        match self.slots[index as usize].tenure.term().map(|t| t.state()) {
            Some(State::Active | State::Leaving { .. }) => self.send_renewal(index, now),
            Some(State::Releasing) => self.send_release(index),
            Some(State::Gone) | None => {}
        }
    }

    /// Renews held shard `index`, unless its renew deadline has passed (its timer ends the
    /// term then); the call is bounded by that deadline.
    fn send_renewal(&mut self, index: u32, now: Instant) {
        let timeout_cap = self.set.cfg.call_timeout();
        let name = self.set.shard_name(index);
        let api = self.io.api.clone();
        let Some(t) = self.slots[index as usize].tenure.term_mut() else {
            return;
        };
        let Step::Renew {
            lease,
            until: deadline,
        } = t.term.renew(now, now_micro())
        else {
            return;
        };
        let timeout = timeout_cap
            .min(deadline.saturating_duration_since(now))
            .max(Duration::from_millis(1));
        let gen = t.gen;
        let op = OwnedOp {
            verb: "update",
            namespace: self.set.namespace.clone(),
            name: name.clone(),
        };
        let sent = Instant::now();
        self.io.push(Key::Shard(index), async move {
            let result = call(
                op.op(),
                timeout,
                api.replace(&name, &PostParams::default(), &lease),
            )
            .await;
            Reply::Renewed {
                index,
                gen,
                sent,
                result,
            }
        });
    }

    /// Releases shard `index`: no holder, a one-second duration, no fencing token.
    fn send_release(&mut self, index: u32) {
        let timeout_cap = self.set.cfg.call_timeout();
        let name = self.set.shard_name(index);
        let api = self.io.api.clone();
        let Some(t) = self.slots[index as usize].tenure.term_mut() else {
            return;
        };
        let lease = t.term.release_write(None, now_micro());
        let gen = t.gen;
        let op = OwnedOp {
            verb: "update",
            namespace: self.set.namespace.clone(),
            name: name.clone(),
        };
        self.io.push(Key::Shard(index), async move {
            let result = call(
                op.op(),
                timeout_cap,
                api.replace(&name, &PostParams::default(), &lease),
            )
            .await;
            Reply::Released { index, gen, result }
        });
    }

    /// Takes shard `index` as `decision` says (create, take over an expired or released lease).
    pub(super) fn acquire(&mut self, index: u32, decision: Decision) {
        let slot = &self.slots[index as usize];
        let mut record = record_for(
            &decision,
            slot.observed.as_ref(),
            &self.set.identity,
            self.set.cfg.lease.lease_duration,
            now_micro(),
        );
        let sent = Instant::now();
        let fut = self.acquire_call(index, &decision, &mut record);
        debug!(shard = index, ?decision, "acquiring shard");
        self.io.push(Key::Shard(index), async move {
            let result = fut.await;
            Reply::Acquired {
                index,
                decision,
                record,
                sent,
                result,
            }
        });
    }

    /// The write that takes shard `index`: a create, or a replace of the Lease as last seen.
    fn acquire_call(
        &self,
        index: u32,
        decision: &Decision,
        record: &mut LeaseRecord,
    ) -> BoxFuture<'static, Result<Lease, Failure>> {
        let secs = self.set.cfg.lease.lease_duration_seconds();
        let timeout = self.set.cfg.call_timeout();
        let name = self.set.shard_name(index);
        let slot = &self.slots[index as usize];
        let api = self.io.api.clone();
        let op = OwnedOp {
            verb: "update",
            namespace: self.set.namespace.clone(),
            name: name.clone(),
        };
        match (decision, slot.lease.clone()) {
            (Decision::Create, _) | (_, None) => {
                // Created again after a deletion: keep counting (client-go starts at 0).
                record.transitions = slot
                    .transitions_seen
                    .filter(|t| *t < i32::MAX.unsigned_abs())
                    .map_or(0, |t| t + 1);
                let mut lease = self.set.new_lease(&name, record, "shard");
                set_writer(&mut lease, &self.set.instance, record);
                let op = OwnedOp { verb: "create", ..op };
                async move { call(op.op(), timeout, api.create(&PostParams::default(), &lease)).await }
                    .boxed()
            }
            (_, Some(mut lease)) => {
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), secs);
                // The previous term's token does not belong to this one.
                set_fencing_token(&mut lease, None);
                set_writer(&mut lease, &self.set.instance, record);
                self.set.label(&mut lease, "shard");
                async move {
                    call(
                        op.op(),
                        timeout,
                        api.replace(&name, &PostParams::default(), &lease),
                    )
                    .await
                }
                .boxed()
            }
        }
    }

    /// Reads shard `index`'s Lease again (after a conflict), within `timeout`.
    pub(super) fn read(&mut self, index: u32, timeout: Duration) {
        let name = self.set.shard_name(index);
        let api = self.io.api.clone();
        let op = OwnedOp {
            verb: "get",
            namespace: self.set.namespace.clone(),
            name: name.clone(),
        };
        self.io.push(Key::Shard(index), async move {
            let result = call(op.op(), timeout.max(Duration::from_millis(1)), api.get_opt(&name)).await;
            Reply::Read { index, result }
        });
    }

    /// Reads the membership Lease again (after a conflict).
    pub(super) fn read_member(&mut self) {
        let name = self.member.name.clone();
        let api = self.io.api.clone();
        let op = OwnedOp {
            name: name.clone(),
            ..self.set.op("get")
        };
        let timeout = self.set.cfg.call_timeout();
        self.io.push(Key::Member, async move {
            let result = call(op.op(), timeout, api.get_opt(&name)).await;
            Reply::MemberRead { result }
        });
    }
}
