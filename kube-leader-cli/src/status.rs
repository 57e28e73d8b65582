//! `kube-leader status`: who leads a lock, read once, without being a candidate.

use std::time::{Duration, SystemTime};

use kube_leader::{
    internal::{leader, StrategyExt as _},
    LeaderInfo, LockRef,
};
use serde::Serialize;

use crate::{
    cli::{OutputFormat, StatusArgs},
    cluster,
    exit::{self, Fail, OrExit},
    state::rfc3339,
};

/// What `status -o json` prints.
#[derive(Debug, Serialize)]
struct StatusOut {
    lock: String,
    namespace: String,
    strategy: &'static str,
    /// Whether the lock object exists.
    exists: bool,
    holder: Option<String>,
    since: Option<String>,
    fencing_token: Option<u64>,
    /// Lease: the last renewal, by the holder's clock.
    renewed_at: Option<String>,
    /// Lease: the holder's advertised lease duration.
    lease_duration_seconds: Option<u64>,
    /// Lease: renewal + duration, by the holder's clock (informational: candidates judge expiry
    /// on their own clocks from when they saw the renewal).
    expires_at: Option<String>,
}

/// `kube-leader status`: returns the exit code.
pub(crate) async fn status(args: StatusArgs) -> Result<u8, Fail> {
    let client = cluster::connect(
        &args.cluster,
        args.connect_timeout,
        crate::client::ONE_OFF_RENEW_DEADLINE,
    )
    .await?;
    let namespace = cluster::resolve_namespace(args.lock.namespace.as_deref(), &client);
    let rbac = format!(
        "kube-leader rbac --strategy {} --lock {} --namespace {namespace}",
        args.lock.strategy, args.lock.lock
    );
    let elector = args.elector_service_account.as_deref();
    let client = cluster::as_elector(client, &namespace, elector, &rbac).await?;
    let lock = LockRef::new(namespace, args.lock.lock.clone()).or_exit(exit::USAGE)?;
    let info = leader::current(client, args.lock.strategy, &lock)
        .await
        .map_err(|e| Fail::new(exit::for_error(&e), e))?;
    let out = StatusOut::new(&lock, args.lock.strategy.as_str(), info.as_ref());
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&out).or_exit(exit::INTERNAL)?),
        OutputFormat::Text => print!("{}", out.text(SystemTime::now())),
    }
    Ok(0)
}

impl StatusOut {
    fn new(lock: &LockRef, strategy: &'static str, info: Option<&LeaderInfo>) -> Self {
        let expires = info.and_then(|i| Some(i.renewed_at? + i.lease_duration?));
        Self {
            lock: lock.name.clone(),
            namespace: lock.namespace.clone(),
            strategy,
            exists: info.is_some(),
            holder: info.and_then(|i| i.holder.clone()),
            since: info.and_then(|i| i.acquired_at).map(rfc3339),
            fencing_token: info.and_then(|i| i.fencing_token),
            renewed_at: info.and_then(|i| i.renewed_at).map(rfc3339),
            lease_duration_seconds: info.and_then(|i| i.lease_duration).map(|d| d.as_secs()),
            expires_at: expires.map(rfc3339),
        }
    }

    fn text(&self, now: SystemTime) -> String {
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k:<16}{v}\n"));
        line("lock:", format!("{}/{}", self.namespace, self.lock));
        line("strategy:", self.strategy.to_string());
        let holder = match (&self.holder, self.exists) {
            (Some(h), _) => h.clone(),
            (None, true) => "none (released, or not held)".into(),
            (None, false) => "none (no lock)".into(),
        };
        line("holder:", holder);
        if let Some(since) = &self.since {
            line("since:", format!("{since}{}", relative(since, now)));
        }
        if let Some(t) = self.fencing_token {
            line("fencing token:", t.to_string());
        }
        if let Some(r) = &self.renewed_at {
            line("renewed:", format!("{r}{}", relative(r, now)));
        }
        if let Some(d) = self.lease_duration_seconds {
            line("lease duration:", format!("{d}s"));
        }
        if let Some(e) = &self.expires_at {
            line("expires:", format!("{e}{}", relative(e, now)));
        }
        out
    }
}

/// " (3s ago)" or " (in 12s)", to the second.
fn relative(rfc: &str, now: SystemTime) -> String {
    let Ok(ts) = rfc.parse::<k8s_openapi::jiff::Timestamp>() else {
        return String::new();
    };
    let t = SystemTime::from(ts);
    let round = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs())).to_string();
    match now.duration_since(t) {
        Ok(ago) => format!(" ({} ago)", round(ago)),
        Err(e) => format!(" (in {})", round(e.duration())),
    }
}

#[cfg(test)]
mod tests;
