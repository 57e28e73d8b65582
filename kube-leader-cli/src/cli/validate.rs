//! Validation across flags: the timings together, naming the flags.

use std::time::Duration;

use kube_leader::{internal::check_renew_deadline, Error, LeaseConfig};

use super::{RbacArgs, RunArgs, FOR_LIFE_GRACE};

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
        // The library's rules, named by flag: the lock, the namespace, client-go's timing
        // rules for a lease, --grace against an expiring lock, and the options a strategy does
        // not have. Under every strategy the supervisor's heartbeats come every retry period,
        // within the renew deadline.
        let options = self.options();
        options.validate().map_err(|e| flag_error(&e))?;
        check_renew_deadline(self.renew_deadline, self.retry_period).map_err(|e| flag_error(&e))?;
        if self.shards.is_some() {
            options.validate_shards().map_err(|e| flag_error(&e))?;
        }
        self.validate_shards_flags()
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
        if sharded && self.coordinated.is_some() {
            return Err(
                "the argument '--coordinated' cannot be used with '--shards': a shard set balances \
                 its shards itself"
                    .into(),
            );
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

    /// The SIGTERM → SIGKILL grace: `--grace`, else where the lock expires lease duration −
    /// renew deadline (the supervisor's SIGTERM comes a renew deadline after the last renewal
    /// was sent at the latest, so COMMAND is gone a lease duration after it, before any
    /// successor can take the expired lease over: `Candidate::stop_bound`), else (no lease
    /// to outlast) [`FOR_LIFE_GRACE`].
    pub(crate) fn grace(&self) -> Duration {
        self.options().grace_or(FOR_LIFE_GRACE)
    }

    /// The liveness heartbeat of leader for life: `--liveness`, else
    /// [`DEFAULT_LIVENESS`](super::DEFAULT_LIVENESS); `None` when off, and where the lock
    /// expires by itself (a Lease has its renewals).
    #[cfg(test)]
    pub(crate) fn liveness(&self) -> Option<Duration> {
        match self.options().liveness {
            Some(crate::candidate::Liveness::Every(l)) => Some(l),
            _ => None,
        }
    }

    /// The Lease timings.
    pub(crate) fn lease_config(&self) -> LeaseConfig {
        LeaseConfig::default()
            .lease_duration(self.lease_duration)
            .renew_deadline(self.renew_deadline)
            .retry_period(self.retry_period)
    }
}

impl RbacArgs {
    /// The options a Role is printed for, checked as `run` checks them: `--dead-leader-pod` is
    /// for leader for life only, and `--shards` for the lease strategy.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.elector_service_account.as_ref() == Some(&self.service_account) {
            return Err(format!(
                "--elector-service-account {0} is --service-account {0}: the elector needs a \
                 ServiceAccount of its own, apart from the Pod's (COMMAND's)",
                self.service_account
            ));
        }
        self.options().validate().map_err(|e| flag_error(&e))
    }
}

/// A configuration error of the library as a usage error naming the flag that set the field;
/// the other settings its reason names (`` `renew_deadline` ``) are named as flags too.
fn flag_error(e: &Error) -> String {
    match e {
        Error::InvalidConfig { field, reason } => {
            format!("invalid value for {}: {}", flag(field), flags_in(reason))
        }
        other => other.to_string(),
    }
}

/// The flag of a library setting: `'--renew-deadline'`.
fn flag(field: &str) -> String {
    format!("'--{}'", field.replace('_', "-"))
}

/// `reason` with every `` `setting` `` written as its flag.
fn flags_in(reason: &str) -> String {
    let mut parts = reason.split('`');
    let mut out = parts.next().unwrap_or_default().to_string();
    for (i, part) in parts.enumerate() {
        let is_setting = i % 2 == 0 && part.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        if is_setting {
            out.push_str("--");
            out.push_str(&part.replace('_', "-"));
        } else if i % 2 == 0 {
            out.push('`');
            out.push_str(part);
            out.push('`');
        } else {
            out.push_str(part);
        }
    }
    out
}
