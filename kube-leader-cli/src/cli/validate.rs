//! Validation across flags: the timings together, naming the flags.

use std::time::Duration;

use kube_leader::{lease::check_renew_deadline, Error, LeaseConfig};

use super::{RbacArgs, RunArgs, StrategyArg, DEFAULT_LIVENESS, FOR_LIFE_GRACE};

impl RunArgs {
    /// Checks the timings together, naming the flags: client-go's rules for a lease, and for
    /// both strategies a heartbeat period shorter than the supervisor's deadline.
    pub(crate) fn validate(&self) -> Result<(), String> {
        for (flag, d) in [
            ("--lease-duration", self.lease_duration),
            ("--renew-deadline", self.renew_deadline),
            ("--retry-period", self.retry_period),
            ("--connect-timeout", self.connect_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("invalid value for '{flag}': must be greater than zero"));
            }
        }
        let ms = |d: Duration| humantime::format_duration(d).to_string();
        // The library's rules, named by flag: client-go's for a lease; under both strategies
        // the supervisor's heartbeats come every retry period, within the renew deadline.
        match self.lock.strategy {
            StrategyArg::Lease => self.lease_config().validate(),
            StrategyArg::ForLife => check_renew_deadline(self.renew_deadline, self.retry_period),
        }
        .map_err(|e| flag_error(&e))?;
        if self.shards.is_some() && self.lock.strategy != StrategyArg::Lease {
            return Err("invalid value for '--shards': shards are Leases: add --strategy lease".into());
        }
        self.validate_shards_flags()?;
        if self.lock.strategy == StrategyArg::Lease {
            let bound = self.lease_duration.saturating_sub(self.renew_deadline);
            match self.grace {
                Some(grace) if grace > bound && !self.allow_grace_beyond_lease => {
                    return Err(format!(
                        "invalid value for '--grace': {} outlasts the lease: a COMMAND slow on SIGTERM \
                         could still run when another candidate takes over the expired lease; at most \
                         --lease-duration − --renew-deadline = {} (or accept the risk with \
                         --allow-grace-beyond-lease)",
                        ms(grace),
                        ms(bound)
                    ));
                }
                _ => {}
            }
        }
        self.validate_not_ready_takeover()?;
        self.validate_liveness()?;
        validate_dead_leader_pod(self.lock.strategy, self.dead_leader_pod.is_some())
    }

    /// `--liveness`: leader for life only, and at least the library's 1 s.
    fn validate_liveness(&self) -> Result<(), String> {
        if self.liveness.is_some() && self.lock.strategy != StrategyArg::ForLife {
            return Err(
                "invalid value for '--liveness': only for --strategy for-life (a Lease \
                 has its renewals)"
                    .into(),
            );
        }
        match self.liveness() {
            Some(l) if l < Duration::from_secs(1) => Err(format!(
                "invalid value for '--liveness': at least 1s (a heartbeat every third of it), \
                 or off; got {}",
                humantime::format_duration(l)
            )),
            _ => Ok(()),
        }
    }

    /// The liveness heartbeat of leader for life: `--liveness`, else [`DEFAULT_LIVENESS`];
    /// `None` when off, and for a lease.
    pub(crate) fn liveness(&self) -> Option<Duration> {
        match (self.lock.strategy, self.liveness) {
            (StrategyArg::ForLife, Some(l)) => l.0,
            (StrategyArg::ForLife, None) => Some(DEFAULT_LIVENESS),
            (StrategyArg::Lease, _) => None,
        }
    }

    /// Flags that have no meaning with `--shards` (a status server, the Pod label and readiness
    /// name one lock's leader) are refused rather than ignored; `--on-shards-change` only
    /// applies with `--shards`.
    fn validate_shards_flags(&self) -> Result<(), String> {
        let sharded = self.shards.is_some();
        let single_lock = [
            ("--status-addr", self.status_addr.is_some()),
            ("--label-pod", self.label_pod),
            ("--ready-only-when-leader", self.ready_only_when_leader),
        ];
        if let Some((flag, _)) = single_lock.iter().find(|(_, set)| sharded && *set) {
            return Err(format!(
                "the argument '{flag}' cannot be used with '--shards': it tells one lock's leader, \
                 and a shard candidate holds several (each shard's holder is in its Lease: \
                 kube-leader status --lock SET-N)"
            ));
        }
        if sharded && self.watch_own_pod {
            return Err(
                "the argument '--watch-own-pod' cannot be used with '--shards' (yet): a shard \
                        candidate hands its shards over on the kubelet's SIGTERM"
                    .into(),
            );
        }
        if !sharded && self.on_shards_change != crate::cli::OnChange::Restart {
            return Err("the argument '--on-shards-change' needs '--shards'".into());
        }
        Ok(())
    }

    /// `--not-ready-takeover`: leader for life only, and more than zero.
    fn validate_not_ready_takeover(&self) -> Result<(), String> {
        match self.not_ready_takeover {
            Some(_) if self.lock.strategy != StrategyArg::ForLife => Err(
                "invalid value for '--not-ready-takeover': only for --strategy for-life (a Lease \
                 expires by itself)"
                    .into(),
            ),
            Some(d) if d.is_zero() => {
                Err("invalid value for '--not-ready-takeover': must be greater than zero".into())
            }
            _ => Ok(()),
        }
    }

    /// The SIGTERM → SIGKILL grace: `--grace`, else for a lease lease duration − renew
    /// deadline (the supervisor's SIGTERM comes a renew deadline after the last renewal was
    /// sent at the latest, so COMMAND is gone a lease duration after it, before any successor
    /// can take the expired lease over), else (leader for life: no lease to outlast)
    /// [`FOR_LIFE_GRACE`].
    pub(crate) fn grace(&self) -> Duration {
        match (self.grace, self.lock.strategy) {
            (Some(grace), _) => grace,
            (None, StrategyArg::Lease) => self.lease_duration.saturating_sub(self.renew_deadline),
            (None, StrategyArg::ForLife) => FOR_LIFE_GRACE,
        }
    }

    /// The Lease timings.
    pub(crate) fn lease_config(&self) -> LeaseConfig {
        LeaseConfig::new(self.lease_duration, self.renew_deadline, self.retry_period)
    }
}

impl RbacArgs {
    /// `--dead-leader-pod` is for the Role of leader for life only.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let strategy = match self.shards {
            Some(_) => StrategyArg::Lease,
            None => self.lock.strategy,
        };
        validate_dead_leader_pod(strategy, self.dead_leader_pod.is_some())
    }
}

/// `--dead-leader-pod`: leader for life only (a Lease holder's Pod is never deleted). Shared by
/// `run` and `rbac`.
fn validate_dead_leader_pod(strategy: StrategyArg, set: bool) -> Result<(), String> {
    if set && strategy != StrategyArg::ForLife {
        return Err(format!(
            "invalid value for '--dead-leader-pod': only for --strategy for-life (the {} strategy \
             never deletes a Pod)",
            strategy.as_str()
        ));
    }
    Ok(())
}

/// A configuration error of the library as a usage error naming the flag that set the field.
fn flag_error(e: &Error) -> String {
    match e {
        Error::InvalidConfig { field, reason } => {
            format!("invalid value for '--{}': {reason}", field.replace('_', "-"))
        }
        other => other.to_string(),
    }
}
