//! What the engine is a candidate for, fixed for its life: the set's name, namespace and shard
//! count, this candidate's identity and instance, the settings and the renewal phases; and what
//! follows from them alone (the Leases' names, labels, and the descriptions of calls).

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use crate::{
    lease::record::LeaseRecord,
    shards::{
        config::ShardsConfig,
        engine::OwnedOp,
        names::{ROLE_LABEL, SHARDS_LABEL, SHARD_COUNT_ANNOTATION},
        scheduler::Phases,
    },
};

/// What the engine is a candidate for (see the [module](self)).
pub(super) struct Setup {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) count: u32,
    pub(super) identity: String,
    /// This process's instance id (tells its writes from a twin's).
    pub(super) instance: String,
    pub(super) cfg: ShardsConfig,
    pub(super) phases: Phases,
}

/// What a Lease of the set is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Shard(u32),
    Member,
}

// === impl Setup ===

impl Setup {
    /// The description of a call with `verb` on the set, for errors and logs.
    pub(super) fn op(&self, verb: &'static str) -> OwnedOp {
        OwnedOp {
            verb,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The description of a call with `verb` on the Lease `name`.
    pub(super) fn op_on(&self, verb: &'static str, name: &str) -> OwnedOp {
        OwnedOp {
            verb,
            namespace: self.namespace.clone(),
            name: name.to_string(),
        }
    }

    /// The renew deadline of every Lease of the set.
    pub(super) fn renew_deadline(&self) -> Duration {
        self.cfg.lease.renew_deadline
    }

    /// How long the work on a lost shard has to stop once its loss is told: the lease
    /// duration minus the renew deadline, as for any Lease leader.
    pub(super) fn stop_grace(&self) -> Duration {
        self.cfg
            .lease
            .lease_duration
            .saturating_sub(self.cfg.lease.renew_deadline)
    }

    /// The name of shard `index`'s Lease.
    pub(super) fn shard_name(&self, index: u32) -> String {
        format!("{}-{index}", self.name)
    }

    /// What a Lease of the set is, by its name: a shard (in range) or a membership Lease.
    pub(super) fn classify(&self, lease_name: &str) -> Option<Role> {
        let rest = lease_name.strip_prefix(&self.name)?.strip_prefix('-')?;
        if rest.starts_with("member-") {
            return Some(Role::Member);
        }
        if rest.is_empty()
            || !rest.bytes().all(|b| b.is_ascii_digit())
            || (rest.len() > 1 && rest.starts_with('0'))
        {
            return None;
        }
        rest.parse::<u32>()
            .ok()
            .filter(|i| *i < self.count)
            .map(Role::Shard)
    }

    /// A new Lease of the set, labelled with its `role`.
    pub(super) fn new_lease(&self, name: &str, record: &LeaseRecord, role: &str) -> Lease {
        let mut spec = LeaseSpec::default();
        record.write_to(&mut spec, self.cfg.lease.lease_duration_seconds());
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec),
        };
        self.label(&mut lease, role);
        lease
    }

    /// Labels a Lease as one of the set's, with its `role`; a membership Lease also
    /// announces this candidate's shard count.
    pub(super) fn label(&self, lease: &mut Lease, role: &str) {
        let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(SHARDS_LABEL.to_string(), self.name.clone());
        labels.insert(ROLE_LABEL.to_string(), role.to_string());
        if role == "member" {
            let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(SHARD_COUNT_ANNOTATION.to_string(), self.count.to_string());
        }
    }
}
