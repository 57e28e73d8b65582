//! Taking part in Kubernetes' coordinated leader election (KEP-4355). How it works: see
//! [`Coordinated`].

use std::time::Duration;

use k8s_openapi::{
    api::coordination::{
        v1::Lease,
        v1beta1::{LeaseCandidate, LeaseCandidateSpec},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    api::{DeleteParams, Patch, PatchParams, PostParams},
    Api, Client,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::{
    api::{call, Failure, Op},
    error::{invalid, Error, Result},
    lock::LockRef,
    object_watch::ObjectWatch,
    successor::CandidatePod,
};

/// The strategy a coordinated candidate asks for: the one the controller in kube-apiserver
/// implements.
pub const STRATEGY: &str = "OldestEmulationVersion";

/// How often a coordinated candidate renews its `LeaseCandidate` without being pinged.
pub const RENEW_EVERY: Duration = Duration::from_secs(300);

const RBAC_HINT: &str = "a coordinated candidate needs create, get, list, watch, patch and delete on \
    leasecandidates.coordination.k8s.io in the lock's namespace (print the Role with \
    `kube-leader rbac --coordinated VERSION`)";

/// Taking part in Kubernetes' coordinated leader election: this candidate's versions, which the
/// controller compares (the oldest emulation version leads, so that a cluster upgrade keeps its
/// oldest component in charge).
///
/// # How it works
///
/// Taking part in Kubernetes' coordinated leader election (KEP-4355), as client-go's
/// `Coordinated: true` candidates do.
///
/// A candidate keeps a `LeaseCandidate` (coordination.k8s.io/v1beta1, beta since 1.33 and off by
/// default: the `CoordinatedLeaderElection` gate and that API version must be on) named after its
/// identity: the Lease it is a candidate for, its binary and emulation versions, and the strategy
/// `OldestEmulationVersion`. The controller in kube-apiserver pings candidates (`spec.pingTime`)
/// before an election and counts those that answer (renew `spec.renewTime`) within 5 s; it names
/// the holder of the Lease, the candidate with the oldest emulation version. A coordinated
/// candidate never takes the Lease itself: it leads once the controller has named it holder, and
/// from then renews the Lease as any holder; it gives way when the controller names another in
/// `spec.preferredHolder` (see the term's [`LossReason::Yielded`](crate::LossReason::Yielded)).
///
/// The candidate renews its `LeaseCandidate` when pinged and every 5 minutes (client-go's
/// 5 minutes: the controller forces a new election for candidates not renewed in 15 minutes and
/// deletes them after 30), and deletes it when it stops. Where the server does not serve
/// `LeaseCandidate` (the gate off, or a server older than 1.31), the candidate says so once and
/// campaigns as a classic candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Coordinated {
    /// The candidate's binary version (`MAJOR.MINOR[.PATCH]`), `spec.binaryVersion`.
    pub binary_version: String,
    /// The version it emulates (`spec.emulationVersion`); the binary version by default.
    pub emulation_version: String,
}

// === impl Coordinated ===

impl Coordinated {
    /// A candidate of `binary_version`, emulating that version too.
    #[must_use]
    pub fn new(binary_version: impl Into<String>) -> Self {
        let binary_version = binary_version.into();
        Self {
            emulation_version: binary_version.clone(),
            binary_version,
        }
    }

    /// Sets the emulation version.
    #[must_use]
    pub fn emulation_version(mut self, version: impl Into<String>) -> Self {
        self.emulation_version = version.into();
        self
    }

    /// Checks both versions: `MAJOR.MINOR` or `MAJOR.MINOR.PATCH`, numbers, as the controller
    /// reads them (it ignores candidates whose versions it cannot parse).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the version that is not one.
    pub(crate) fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("coordinated.binary_version", &self.binary_version),
            ("coordinated.emulation_version", &self.emulation_version),
        ] {
            if !is_version(v) {
                return Err(invalid(
                    field,
                    format!("{field} {v:?} is not a version: MAJOR.MINOR or MAJOR.MINOR.PATCH, numbers (for example 1.37.2)"),
                ));
            }
        }
        Ok(())
    }
}

/// `MAJOR.MINOR` or `MAJOR.MINOR.PATCH`, each a number.
fn is_version(v: &str) -> bool {
    let v = v.strip_prefix('v').unwrap_or(v);
    let parts: Vec<&str> = v.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A Lease that Kubernetes' coordinated leader election manages: its `spec.strategy` (the
/// controller writes it, `OldestEmulationVersion` for its own strategy) is set. `None` for a
/// Lease without one: kube-leader's own rules alone apply.
pub(crate) fn coordinated_strategy(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.strategy.as_deref().filter(|s| !s.is_empty())
}

/// The candidate a coordinated Lease names its preferred holder (`spec.preferredHolder`), if it
/// is a coordinated Lease ([`coordinated_strategy`]) and names one other than `identity`: the
/// controller's choice, to which the holder gives way. A `preferredHolder` on a Lease without a
/// strategy has no controller behind it and is ignored (nobody would clear it, and every holder
/// would give way in turn).
pub(crate) fn preferred_other(lease: &Lease, identity: &str) -> Option<String> {
    coordinated_strategy(lease)?;
    lease
        .spec
        .as_ref()?
        .preferred_holder
        .clone()
        .filter(|p| !p.is_empty() && p != identity)
}

/// Whether some kube-leader process wrote `lease`'s record (`record`): its writer annotation
/// carries the record's renewTime, whatever the instance.
pub(crate) fn written_by_any(lease: &Lease, record: &super::record::LeaseRecord) -> bool {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(super::record::INSTANCE_ANNOTATION))
        .and_then(|v| v.split_once(' '))
        .is_some_and(|(_, time)| {
            record.renew_time.is_some() && time.parse::<Timestamp>().ok() == record.renew_time
        })
}

/// This candidate's `LeaseCandidate`, kept in the background until it is withdrawn or dropped.
#[derive(Debug)]
pub(crate) struct Candidacy {
    stop: CancellationToken,
    withdrawn: tokio::sync::watch::Receiver<bool>,
}

impl Candidacy {
    /// Deletes the `LeaseCandidate` now (bounded by the API timeout): a stopping candidate is
    /// elected no more.
    pub(crate) async fn withdraw(mut self) {
        self.stop.cancel();
        let _ = self.withdrawn.wait_for(|w| *w).await;
    }
}

impl Drop for Candidacy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What came of registering a `LeaseCandidate`.
#[derive(Debug)]
pub(crate) enum Registered {
    /// Registered, and kept in the background.
    Yes(Candidacy),
    /// The server does not serve `LeaseCandidate`: campaign as a classic candidate.
    NotServed,
}

/// Registers `identity` as a coordinated candidate for `lock` and keeps the registration: it
/// answers the controller's pings and renews every [`RENEW_EVERY`] until withdrawn, dropped or
/// `shutdown`; then it is deleted.
///
/// # Errors
/// A refused registration (a permission, an invalid object): the candidate cannot take part.
pub(crate) async fn register(
    client: &Client,
    lock: &LockRef,
    identity: &str,
    coordinated: &Coordinated,
    pod: Option<&CandidatePod>,
    api_timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<Registered> {
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &lock.namespace);
    let candidate = LeaseCandidate {
        metadata: ObjectMeta {
            name: Some(identity.to_string()),
            namespace: Some(lock.namespace.clone()),
            owner_references: pod.map(|p| vec![crate::lock::pod_owner_reference(&p.name, &p.uid)]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseCandidateSpec {
            lease_name: lock.name.clone(),
            binary_version: coordinated.binary_version.clone(),
            emulation_version: Some(coordinated.emulation_version.clone()),
            strategy: STRATEGY.to_string(),
            renew_time: Some(MicroTime(Timestamp::now())),
            ping_time: None,
        }),
    };
    let op = op(&lock.namespace, identity, "create");
    match call(op, api_timeout, api.create(&PostParams::default(), &candidate)).await {
        Ok(_) => {}
        // Ours from before a restart (or another process's of this identity): take it over.
        Err(Failure::Conflict) => renew(&api, &lock.namespace, identity, coordinated, api_timeout)
            .await
            .map_err(|f| refused(f, lock, identity))?,
        // The resource itself is unknown: the gate or the API version is off.
        Err(Failure::NotFound) => {
            info!(lock = %lock, "the API server does not serve coordination.k8s.io/v1beta1 \
                LeaseCandidates (the CoordinatedLeaderElection feature gate and that API version \
                must be on, Kubernetes 1.33 or later): campaigning as a classic candidate");
            return Ok(Registered::NotServed);
        }
        Err(f) => return Err(refused(f, lock, identity)),
    }
    info!(lock = %lock, identity, binary_version = %coordinated.binary_version,
        emulation_version = %coordinated.emulation_version,
        "registered as a coordinated candidate: the controller in kube-apiserver names the holder");
    let stop = shutdown.child_token();
    let (tx, withdrawn) = tokio::sync::watch::channel(false);
    let keep = Keep {
        api,
        namespace: lock.namespace.clone(),
        identity: identity.to_string(),
        coordinated: coordinated.clone(),
        api_timeout,
    };
    let task_stop = stop.clone();
    let task = async move {
        keep.run(&task_stop).await;
        keep.delete().await;
        tx.send_replace(true);
    };
    tokio::spawn(task.in_current_span());
    Ok(Registered::Yes(Candidacy { stop, withdrawn }))
}

fn op<'a>(namespace: &'a str, name: &'a str, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: "leasecandidates.coordination.k8s.io",
        namespace,
        name,
        hint: RBAC_HINT,
    }
}

fn refused(f: Failure, lock: &LockRef, identity: &str) -> Error {
    match f {
        Failure::Fatal(e) => e,
        other => invalid(
            "coordinated",
            format!("cannot register {identity} as a coordinated candidate for {lock}: {other:?}"),
        ),
    }
}

/// Renews the `LeaseCandidate` (a merge patch: its versions, a fresh `renewTime`).
async fn renew(
    api: &Api<LeaseCandidate>,
    namespace: &str,
    identity: &str,
    coordinated: &Coordinated,
    api_timeout: Duration,
) -> std::result::Result<(), Failure> {
    let patch = serde_json::json!({
        "spec": {
            "renewTime": MicroTime(Timestamp::now()),
            "binaryVersion": coordinated.binary_version,
            "emulationVersion": coordinated.emulation_version,
            "strategy": STRATEGY,
        }
    });
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let fut = api.patch(identity, &params, &patch);
    call(op(namespace, identity, "patch"), api_timeout, fut)
        .await
        .map(|_| ())
}

/// The background task of a registered candidate.
struct Keep {
    api: Api<LeaseCandidate>,
    namespace: String,
    identity: String,
    coordinated: Coordinated,
    api_timeout: Duration,
}

impl Keep {
    /// Answers pings (a `pingTime` after the `renewTime`) and renews every [`RENEW_EVERY`],
    /// until `stop`; a candidate deleted meanwhile (the controller's garbage collection after
    /// 30 minutes without a renewal) is created again at the next renewal.
    async fn run(&self, stop: &CancellationToken) {
        let mut watch = ObjectWatch::new(
            self.api.clone(),
            &self.identity,
            op(&self.namespace, &self.identity, "watch"),
        );
        let mut next = tokio::time::Instant::now() + RENEW_EVERY;
        loop {
            let due = tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(next) => true,
                changed = watch.changed() => match changed {
                    Ok(Some(c)) => pinged(c),
                    Ok(None) => true,
                    Err(Failure::Fatal(e)) => {
                        warn!(error = %e, "cannot watch this candidate's LeaseCandidate; it is \
                            renewed every 5 minutes only, and the controller may count it absent");
                        std::future::pending::<()>().await;
                        false
                    }
                    Err(_) => false,
                },
            };
            if !due {
                continue;
            }
            next = tokio::time::Instant::now() + RENEW_EVERY;
            let renewed = renew(
                &self.api,
                &self.namespace,
                &self.identity,
                &self.coordinated,
                self.api_timeout,
            );
            match renewed.await {
                Ok(()) => debug!(candidate = %self.identity, "renewed the LeaseCandidate"),
                Err(e) => {
                    debug!(candidate = %self.identity, error = ?e, "renewing the LeaseCandidate failed")
                }
            }
        }
    }

    async fn delete(&self) {
        let params = DeleteParams::default();
        let fut = self.api.delete(&self.identity, &params);
        let op = op(&self.namespace, &self.identity, "delete");
        match call(op, self.api_timeout, fut).await {
            Ok(_) | Err(Failure::NotFound) => {
                debug!(candidate = %self.identity, "withdrew the LeaseCandidate")
            }
            Err(e) => debug!(candidate = %self.identity, error = ?e, "withdrawing the LeaseCandidate failed"),
        }
    }
}

/// Whether the controller pinged the candidate after its last renewal.
fn pinged(c: &LeaseCandidate) -> bool {
    let Some(spec) = &c.spec else { return false };
    match (&spec.ping_time, &spec.renew_time) {
        (Some(ping), Some(renew)) => ping.0 > renew.0,
        (Some(_), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_major_minor_and_maybe_patch() {
        assert!(Coordinated::new("1.37.2").validate().is_ok());
        assert!(Coordinated::new("1.36")
            .emulation_version("v1.35.0")
            .validate()
            .is_ok());
        for bad in ["", "1", "1.x", "1.2.3.4", "latest", "1..2"] {
            let err = Coordinated::new(bad).validate().unwrap_err().to_string();
            assert!(err.contains("coordinated.binary_version"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_ping_after_the_renewal_is_answered() {
        let t = |s: i64| Some(MicroTime(Timestamp::from_second(s).unwrap()));
        let c = |ping, renew| LeaseCandidate {
            spec: Some(LeaseCandidateSpec {
                ping_time: ping,
                renew_time: renew,
                ..LeaseCandidateSpec::default()
            }),
            ..LeaseCandidate::default()
        };
        assert!(pinged(&c(t(10), t(5))));
        assert!(!pinged(&c(t(5), t(10))), "answered already");
        assert!(!pinged(&c(None, t(10))));
        assert!(pinged(&c(t(10), None)));
    }
}
