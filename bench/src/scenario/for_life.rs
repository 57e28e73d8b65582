//! Leader for life: three candidates with Pod objects; the leader's Pod is deleted (or its lock
//! is), and the time to the next leader is measured.
//!
//! The candidates are `ForLife` electors in this process, each with a client of its own API user
//! (so the audit log tells who deleted a lock). There is no kubelet: a Pod object stands for each
//! candidate. The signal (the `delete` call) and the next leader's first act (the moment its
//! `become_leader` returns) are both stamped with CLOCK_MONOTONIC here.

use std::time::Duration;

use anyhow::{bail, Context};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    api::{DeleteParams, PostParams},
    Api, Client, ResourceExt,
};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{internal::Environment, ForLife, Leadership};
use kube_leader_testenv::create_pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    audit,
    clock::{between, mono_ns},
    harness::Bench,
    observe::Observer,
};

const LOCK: &str = "bench-lock";
const CANDIDATES: usize = 3;
/// Bound on any one failover; far above the garbage collector's delay.
const ROUND_TIMEOUT: Duration = Duration::from_secs(90);

/// What the leader-for-life scenarios measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct ForLifeResult {
    /// Leader Pod deleted → next leader's first act.
    pub(crate) pod_deleted: Vec<Duration>,
    /// Leader Pod deleted → the garbage collector deleted a probe ConfigMap owned by that Pod:
    /// the GC delay of the same round.
    pub(crate) gc_delay: Vec<Duration>,
    /// Leader Pod deleted → the lock was gone (seen by the harness's watch).
    pub(crate) pod_to_lock_gone: Vec<Duration>,
    /// Lock gone → next leader's first act.
    pub(crate) lock_gone_to_leader: Vec<Duration>,
    /// Rounds in which a waiting candidate deleted the stale lock itself (audit log) rather
    /// than the garbage collector.
    pub(crate) deleted_by_candidate: usize,
    /// Lock deleted by an administrator → next leader's first act.
    pub(crate) lock_deleted: Vec<Duration>,
    /// Lock deleted by an administrator → the old leader's loss token fired.
    pub(crate) loss_seen: Vec<Duration>,
    /// Lock deleted by an administrator → the harness's own watch saw the deletion.
    pub(crate) deletion_seen: Vec<Duration>,
    /// Lock deleted by an administrator → the harness's watch saw the new leader's lock.
    pub(crate) recreated_seen: Vec<Duration>,
}

/// A finished campaign: slot, Pod, when it returned, and how.
type Won = (usize, String, u64, kube_leader::Result<Leadership>);

struct Candidates {
    ns: String,
    clients: Vec<Client>,
    cancel: CancellationToken,
    won_tx: mpsc::UnboundedSender<Won>,
    won_rx: mpsc::UnboundedReceiver<Won>,
    lost_tx: mpsc::UnboundedSender<(usize, u64)>,
    lost_rx: mpsc::UnboundedReceiver<(usize, u64)>,
}

impl Candidates {
    fn campaign(&self, slot: usize, pod: &str) {
        let elector = ForLife::new(self.clients[slot].clone(), LOCK)
            .namespace(self.ns.clone())
            .identity(pod)
            // Not the process's POD_NAME / POD_NAMESPACE: every candidate is named explicitly.
            .environment(Environment::default());
        let (cancel, tx, pod) = (self.cancel.clone(), self.won_tx.clone(), pod.to_owned());
        tokio::spawn(async move {
            let r = elector.become_leader(&cancel).await;
            let _ = tx.send((slot, pod, mono_ns(), r));
        });
    }

    /// Waits for the next campaign to end; it must have won.
    async fn next_leader(&mut self) -> anyhow::Result<(usize, String, u64, Leadership)> {
        let (slot, pod, at, r) = tokio::time::timeout(ROUND_TIMEOUT, self.won_rx.recv())
            .await
            .context("no new leader")?
            .context("campaign channel closed")?;
        let leadership = r.with_context(|| format!("candidate {pod} failed"))?;
        let lost = leadership.lost_token();
        let tx = self.lost_tx.clone();
        tokio::spawn(async move {
            lost.cancelled().await;
            let _ = tx.send((slot, mono_ns()));
        });
        Ok((slot, pod, at, leadership))
    }

    /// When the leader in `slot` learnt of its loss, at or after `after_ns`.
    async fn loss_of(&mut self, slot: usize, after_ns: u64) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, self.lost_rx.recv()).await {
                Ok(Some((s, at))) if s == slot && at >= after_ns => return Some(at),
                Ok(Some(_)) => {}
                _ => return None,
            }
        }
    }
}

/// Runs `pod_rounds` Pod deletions, then `lock_rounds` lock deletions.
pub(crate) async fn run(b: &Bench, pod_rounds: usize, lock_rounds: usize) -> anyhow::Result<ForLifeResult> {
    let users = b.users(CANDIDATES)?;
    let ns = b.for_life_namespace(&users).await?;
    let ns_name = ns.name().to_owned();
    let pods = Api::<Pod>::namespaced(b.admin.clone(), &ns_name);
    let config_maps = Api::<ConfigMap>::namespaced(b.admin.clone(), &ns_name);
    let observer = Observer::config_maps(b.admin.clone(), &ns_name).await?;
    let audit_log = audit::log_path(b.cp.dir());

    let mut clients = Vec::new();
    for user in &users {
        clients.push(b.cp.user_client(user).await);
    }
    let (won_tx, won_rx) = mpsc::unbounded_channel();
    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let mut c = Candidates {
        ns: ns_name.clone(),
        clients,
        cancel: CancellationToken::new(),
        won_tx,
        won_rx,
        lost_tx,
        lost_rx,
    };
    for slot in 0..CANDIDATES {
        let pod = format!("cand-{slot}-0");
        create_pod(&b.admin, &ns_name, &pod).await?;
        c.campaign(slot, &pod);
    }
    let mut leader = c.next_leader().await?;
    let mut result = ForLifeResult::default();

    for round in 0..pod_rounds {
        tokio::time::sleep(b.plan.settle).await;
        let (slot, pod, _, old) = leader;
        let uid = pods.get(&pod).await?.uid().context("Pod without uid")?;
        // A second dependent of the leader Pod: the garbage collector deletes it too, which
        // times the GC in this very round.
        let probe = format!("gc-probe-{round}");
        config_maps
            .create(&PostParams::default(), &owned_config_map(&probe, &pod, &uid))
            .await?;
        let window = audit::Window::open(&audit_log)?;

        let t0 = mono_ns();
        pods.delete(&pod, &DeleteParams::default().grace_period(0))
            .await?;
        let next = c
            .next_leader()
            .await
            .with_context(|| format!("round {round}: Pod {pod} deleted"))?;
        if next.0 == slot {
            bail!("round {round}: the deleted Pod's candidate {pod} led again");
        }
        result.pod_deleted.push(between(t0, next.2));

        let gc = observer
            .wait_for(&probe, t0, ROUND_TIMEOUT, |s| s.holder.is_none())
            .await
            .with_context(|| format!("round {round}: the GC did not delete {probe}"))?;
        result.gc_delay.push(between(t0, gc.mono_ns));
        if let Some(gone) = observer.last_before(LOCK, next.2 + 1, |s| s.holder.is_none()) {
            if gone.mono_ns >= t0 {
                result.pod_to_lock_gone.push(between(t0, gone.mono_ns));
                result.lock_gone_to_leader.push(between(gone.mono_ns, next.2));
            }
        }
        let by_candidate = window.requests()?.iter().any(|r| {
            r.verb == "delete"
                && r.resource.as_deref() == Some("configmaps")
                && r.name.as_deref() == Some(LOCK)
                && r.code.is_some_and(|c| (200..300).contains(&c))
        });
        result.deleted_by_candidate += usize::from(by_candidate);
        drop(old);

        // The deleted Pod's candidate comes back as a new Pod.
        let new_pod = format!("cand-{slot}-{}", round + 1);
        create_pod(&b.admin, &ns_name, &new_pod).await?;
        c.campaign(slot, &new_pod);
        leader = next;
    }

    for round in 0..lock_rounds {
        tokio::time::sleep(b.plan.settle).await;
        let (slot, pod, _, old) = leader;
        // As a user's code does: once the loss is seen (its work stopped at once here), release.
        // A lock deleted under a live leader is taken over only on that word (Safety IV).
        let releasing = tokio::spawn(async move {
            old.lost_token().cancelled().await;
            old.release().await
        });
        let t0 = mono_ns();
        config_maps.delete(LOCK, &DeleteParams::default()).await?;
        let next = c
            .next_leader()
            .await
            .with_context(|| format!("round {round}: lock deleted"))?;
        result.lock_deleted.push(between(t0, next.2));
        if let Some(seen) = observer
            .wait_for(LOCK, t0, Duration::from_secs(5), |s| s.holder.is_none())
            .await
        {
            result.deletion_seen.push(between(t0, seen.mono_ns));
            let new_pod = next.1.clone();
            if let Some(created) = observer
                .wait_for(LOCK, seen.mono_ns, Duration::from_secs(5), move |s| {
                    s.holder.as_deref() == Some(new_pod.as_str())
                })
                .await
            {
                result.recreated_seen.push(between(t0, created.mono_ns));
            }
        }
        if let Some(at) = c.loss_of(slot, t0).await {
            result.loss_seen.push(between(t0, at));
        }
        releasing
            .await
            .context("the old leader's release task")?
            .with_context(|| format!("round {round}: the old leader's release"))?;
        // The old leader's Pod lives: it campaigns again.
        c.campaign(slot, &pod);
        leader = next;
    }

    c.cancel.cancel();
    drop(leader);
    drop(ns);
    Ok(result)
}

/// A ConfigMap whose single owner is the Pod `pod` with `uid`.
fn owned_config_map(name: &str, pod: &str, uid: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.to_owned(),
                uid: uid.to_owned(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}
