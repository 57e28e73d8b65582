//! The watch: folding the one list/watch of the set's Leases (and the answers of reads and
//! writes) into what the engine knows of every shard and candidate.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use tokio::time::Instant;

use super::{newer, setup::Role, table::Campaign, Engine};
use crate::{
    leadership::LossReason,
    lease::{
        decide::Observed,
        record::{LeaseRecord, Owner},
        term::Step,
    },
    shards::scheduler::Key,
};

// === impl Engine ===

impl Engine {
    /// Folds a watch event into what is known.
    pub(super) fn on_watch(&mut self, ev: watcher::Event<Lease>, now: Instant) {
        match ev {
            watcher::Event::Init => self.relist_started(),
            watcher::Event::InitApply(l) => self.relist_item(l),
            watcher::Event::InitDone => self.relisted(now),
            watcher::Event::Apply(l) => self.absorb(l, now),
            watcher::Event::Delete(l) => self.deleted(&l, now),
        }
    }

    /// A (re)list is complete: folds in what was listed and forgets what was not.
    fn relisted(&mut self, now: Instant) {
        let listed = self.relist_done();
        let names: BTreeSet<String> = listed.iter().filter_map(|l| l.metadata.name.clone()).collect();
        for l in listed {
            self.absorb(l, now);
        }
        // Known before and not listed now: deleted while the watch was down, by whom
        // and after which holder is unknown (waited out from now).
        for index in 0..self.set.count {
            let name = self.set.shard_name(index);
            let slot = &self.slots[index as usize];
            if slot.lease.is_some() && slot.observed.is_some() && !names.contains(&name) {
                self.gone(index, now, true);
            }
        }
        self.members.retain(|n, _| names.contains(n));
        self.foreign.retain(|n, _| names.contains(n));
        if !names.contains(&self.member.name) {
            self.member.lease = None;
        }
        if self.machine.campaign() == Campaign::Listing {
            self.first_synced(now);
        }
        self.replan();
    }

    /// The first list is complete: schedules the first acquisitions and membership write.
    fn first_synced(&mut self, now: Instant) {
        // Joining a set whose shards are all held: nothing to race for, the others
        // hand over as soon as they see this candidate. Otherwise (candidates
        // starting together) let them see each other first.
        let fallback = self.set.cfg.lease.lease_duration;
        let established = self.slots.iter().all(|s| {
            s.observed
                .as_ref()
                .is_some_and(|o| o.record.holder.is_some() && now < o.expires_at(fallback))
        });
        let settle = if established {
            Duration::ZERO
        } else {
            self.set.cfg.settle_in_force()
        };
        self.campaign_to(Campaign::From(now + settle));
        self.io.wake_at(now + settle, Key::Rebalance);
        self.io.wake_at(now, Key::Member);
    }

    /// A Lease of the set was deleted.
    fn deleted(&mut self, l: &Lease, now: Instant) {
        let name = l.metadata.name.clone().unwrap_or_default();
        match self.set.classify(&name) {
            Some(Role::Shard(index)) => self.gone(index, now, false),
            Some(Role::Member) if name == self.member.name => self.member.lease = None,
            Some(Role::Member) => {
                self.members.remove(&name);
                self.foreign.remove(&name);
                self.replan();
            }
            None => {}
        }
    }

    /// Folds a Lease seen (watch or read) into what is known.
    fn absorb(&mut self, lease: Lease, now: Instant) {
        let name = lease.metadata.name.clone().unwrap_or_default();
        match self.set.classify(&name) {
            Some(Role::Shard(index)) => self.absorb_shard(index, lease, now),
            Some(Role::Member) if name == self.member.name => {
                let newer = self.member.lease.as_ref().is_none_or(|m| newer(&lease, m));
                if newer {
                    self.member.lease = Some(lease);
                }
            }
            Some(Role::Member) => {
                let record = LeaseRecord::from_lease(&lease);
                let rv = lease.metadata.resource_version.clone();
                let fallback = self.set.cfg.lease.lease_duration;
                let prev = self.members.get(&name);
                let changed_holder = prev.is_none_or(|p| p.record.holder != record.holder);
                let was_live = prev.is_some_and(|p| now < p.expires_at(fallback));
                let next = Observed::update(prev, record, rv, now);
                // A member renewed after it had expired here (a partition healed, a stopped
                // process group continued) is live again under the same holder: the fair
                // share changes as much as for a new holder.
                let revived = !was_live && now < next.expires_at(fallback);
                self.note_count(&name, &lease, now);
                self.members.insert(name, next);
                if changed_holder || revived {
                    self.replan();
                }
            }
            None => {}
        }
    }

    pub(super) fn absorb_shard(&mut self, index: u32, lease: Lease, now: Instant) {
        let record = LeaseRecord::from_lease(&lease);
        // Ours only if this process wrote it: a twin with the same identity writes another
        // instance id into `INSTANCE_ANNOTATION` (issue 16).
        let owner = Owner::of(&lease, &record, &self.set.identity, &self.set.instance);
        let slot = &mut self.slots[index as usize];
        if let Some(known) = &slot.lease {
            if !newer(&lease, known) && slot.observed.is_some() {
                return;
            }
        }
        let mut lost = None;
        if let Some(t) = slot.tenure.term_mut() {
            // Ours goes on (our own write, echoed before its answer came, or an edit of its
            // metadata); another holder's or a twin's write ends the term.
            if t.live() {
                if let Step::End(reason) = t.term.watched(&lease) {
                    lost = Some(reason);
                }
            }
        }
        let holder_changed = slot
            .observed
            .as_ref()
            .is_none_or(|o| o.record.holder != record.holder);
        slot.transitions_seen = Some(
            slot.transitions_seen
                .map_or(record.transitions, |t| t.max(record.transitions)),
        );
        slot.foreign_self = owner == Owner::Twin;
        slot.observed = Some(Observed::update(
            slot.observed.as_ref(),
            record,
            lease.metadata.resource_version.clone(),
            now,
        ));
        slot.lease = Some(lease);
        slot.deleted = None;
        slot.absent_since = None;
        slot.seen = true;
        if holder_changed {
            // Another holder (or none): whatever held this candidate off is over.
            self.lift_hold_off(index);
            self.replan();
        }
        if let Some(reason) = lost {
            self.lose(index, reason, now);
        }
    }

    /// Shard `index`'s Lease is gone (deleted; `unknown`: found missing by a relist).
    pub(super) fn gone(&mut self, index: u32, now: Instant, unknown: bool) {
        let slot = &mut self.slots[index as usize];
        let last = slot.observed.take();
        slot.lease = None;
        slot.seen = true;
        slot.foreign_self = false;
        if unknown {
            slot.deleted = None;
            slot.absent_since = Some(now);
        } else {
            slot.deleted = last;
            slot.absent_since = None;
        }
        self.lift_hold_off(index);
        self.replan();
        if self.slots[index as usize].tenure.term().is_some_and(|t| t.live()) {
            self.lose(index, LossReason::LockDeleted, now);
        }
    }
}
