//! The API server of the leader-for-life model: the lock ConfigMap and the candidates' Pods as
//! hashable records, converted to the k8s-openapi objects the shipped code reads, and the
//! linearizable store that commits requests.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};

use super::{Proc, Settings, World};
use crate::{
    for_life::record::{lock_config_map, LeaderPod, LockRecord, PodRef, PodView, RELEASED_ANNOTATION},
    lock::{LockRef, LIVENESS_ANNOTATION, RENEW_TIME_ANNOTATION},
    model::wall,
    successor::{preferred_value, PREFERRED_HOLDER_ANNOTATION},
};

/// A Pod: its slot (the candidate it runs) and generation (a Pod recreated under the same
/// name, a StatefulSet's, has a new UID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Pid {
    pub(super) slot: usize,
    pub(super) gen: u8,
}

impl Pid {
    /// The Pod as the real code names it: `p<slot>`, UID `p<slot>-<gen>`.
    pub(super) fn pod_ref(self) -> PodRef {
        PodRef {
            name: format!("p{}", self.slot),
            uid: format!("p{}-{}", self.slot, self.gen),
        }
    }
}

/// The lock ConfigMap as the model's API server stores it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Lock {
    /// The revision of its create (its UID and, as the shipped code reads it, the token).
    pub(super) uid: u64,
    pub(super) rv: u64,
    pub(super) owner: Pid,
    /// Marked released by its leader (`kube-leader.io/released-at`).
    pub(super) released: bool,
    /// The successor the release prefers (a slot).
    pub(super) preferred: Option<usize>,
    /// The liveness heartbeat's renew mark (the revision of the write that renewed it).
    pub(super) beat: Option<u64>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lock uid{} rv{} of p{}-{}",
            self.uid, self.rv, self.owner.slot, self.owner.gen
        )?;
        if self.released {
            write!(f, " RELEASED")?;
        }
        if let Some(p) = self.preferred {
            write!(f, " prefers p{p}")?;
        }
        if let Some(b) = self.beat {
            write!(f, " beat@rv{b}")?;
        }
        Ok(())
    }
}

impl Lock {
    /// The ConfigMap the shipped code reads (the lock as `lock_config_map` writes it, with the
    /// model's annotations).
    pub(super) fn to_cm(&self, s: &Settings) -> ConfigMap {
        let lock = LockRef {
            namespace: "n".into(),
            name: "lock".into(),
        };
        let mut cm = lock_config_map(&lock, &self.owner.pod_ref(), wall(0));
        cm.metadata.uid = Some(format!("lock-{}", self.uid));
        cm.metadata.resource_version = Some(self.rv.to_string());
        let a = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if self.released {
            a.insert(RELEASED_ANNOTATION.into(), wall(1).to_string());
            if let Some(p) = self.preferred {
                a.insert(
                    PREFERRED_HOLDER_ANNOTATION.into(),
                    preferred_value(wall(1), &format!("p{p}")),
                );
            }
        }
        if let (Some(beat), Some(l)) = (self.beat, s.liveness) {
            let secs = l + s.cli_grace;
            a.insert(RENEW_TIME_ANNOTATION.into(), wall(beat as i64).to_string());
            a.insert(LIVENESS_ANNOTATION.into(), secs.to_string());
        }
        cm
    }

    /// The lock as the shipped code reads it.
    pub(super) fn record(&self, s: &Settings) -> LockRecord {
        LockRecord::from_config_map(&self.to_cm(s))
    }
}

/// A Pod as the model's API server stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PodRec {
    pub(super) gen: u8,
    /// Phase `Failed`, reason `Evicted` (written by the 1.20 kubelet before it kills the
    /// containers).
    pub(super) evicted: bool,
    /// A graceful deletion is under way (`deletionTimestamp`, grace above zero).
    pub(super) deleting: bool,
}

impl PodRec {
    /// The Pod the shipped code reads, in slot `slot`.
    pub(super) fn view(&self, slot: usize, s: &Settings) -> PodView {
        let id = Pid { slot, gen: self.gen }.pod_ref();
        let grace = i64::try_from(s.pod_grace).expect("small");
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(id.name),
                uid: Some(id.uid),
                deletion_timestamp: self.deleting.then(|| Time(wall(0))),
                deletion_grace_period_seconds: self.deleting.then_some(grace),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node".into()),
                termination_grace_period_seconds: Some(grace),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(if self.evicted { "Failed" } else { "Running" }.into()),
                reason: self.evicted.then(|| "Evicted".into()),
                ..PodStatus::default()
            }),
        };
        PodView::from_pod(&pod)
    }

    /// What a watch of slot `slot` shows (`None`: no Pod of that name).
    pub(super) fn leader_pod(pod: Option<&PodRec>, slot: usize, s: &Settings) -> LeaderPod {
        pod.map_or(LeaderPod::Absent, |p| LeaderPod::Present(p.view(slot, s)))
    }
}

/// A request to the API server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Req {
    /// Create the lock if absent.
    Create(Lock),
    /// Replace the lock, on condition that its resourceVersion is `pre`; `beat`: the write
    /// renews the liveness heartbeat.
    Update { lock: Lock, pre: u64, beat: bool },
    /// Delete the lock, on condition of its UID (and resourceVersion, if given).
    Delete { uid: u64, rv: Option<u64> },
    /// Read the lock.
    Get,
    /// Delete a Pod, on condition of its UID (a terminal Pod goes at once).
    DeletePod(Pid),
}

/// The API server's answer (`Lost`: a timeout; the request was lost before or after it
/// committed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Answer {
    Ok(Option<Lock>),
    Conflict,
    NotFound,
    Lost,
}

impl World {
    /// The API server handles `req`.
    pub(super) fn apply(&mut self, req: &Req) -> Answer {
        match (req, &self.lock) {
            (Req::Get, l) => Answer::Ok(l.clone()),
            (Req::Create(_), Some(_)) => Answer::Conflict,
            (Req::Create(l), None) => {
                self.revision += 1;
                let mut l = l.clone();
                (l.uid, l.rv) = (self.revision, self.revision);
                l.beat = l.beat.map(|_| self.revision);
                self.set_lock(Some(l.clone()));
                Answer::Ok(Some(l))
            }
            (Req::Update { .. } | Req::Delete { .. }, None) => Answer::NotFound,
            (Req::Update { pre, .. }, Some(cur)) if *pre != cur.rv => Answer::Conflict,
            (Req::Update { lock, beat, .. }, Some(cur)) => {
                self.revision += 1;
                let mut l = lock.clone();
                (l.uid, l.rv) = (cur.uid, self.revision);
                if *beat {
                    l.beat = Some(self.revision);
                }
                self.set_lock(Some(l.clone()));
                Answer::Ok(Some(l))
            }
            (Req::Delete { uid, rv }, Some(cur)) => {
                if *uid != cur.uid || rv.is_some_and(|rv| rv != cur.rv) {
                    return Answer::Conflict;
                }
                self.revision += 1;
                self.set_lock(None);
                Answer::Ok(None)
            }
            (Req::DeletePod(pid), _) => {
                match self.pods[pid.slot] {
                    Some(p) if p.gen == pid.gen => {
                        // Graceful for a running Pod; a terminal Pod goes at once.
                        if p.evicted {
                            self.set_pod(pid.slot, None);
                        } else if !p.deleting {
                            self.end_pod(pid.slot, true);
                        }
                        Answer::Ok(None)
                    }
                    Some(_) => Answer::Conflict,
                    None => Answer::NotFound,
                }
            }
        }
    }

    /// The lock is now `lock`: every running process's lock watch will show it.
    pub(super) fn set_lock(&mut self, lock: Option<Lock>) {
        self.lock = lock.clone();
        for c in self.cands.iter_mut().filter(|c| c.up()) {
            c.lock_q.push_back(lock.clone());
        }
    }

    /// Slot `slot`'s Pod is now `pod`: the Pod watch of its own process, and of every
    /// waiting candidate that watches it as the leader's, will show it.
    pub(super) fn set_pod(&mut self, slot: usize, pod: Option<PodRec>) {
        self.pods[slot] = pod;
        for (i, c) in self.cands.iter_mut().enumerate() {
            let watches = match &c.proc {
                Proc::Down => false,
                _ if i == slot => true,
                Proc::Wait(f) => f.leader.as_ref().is_some_and(|(s, _)| *s == slot),
                Proc::Lead(_) => false,
            };
            if watches {
                c.pod_q.push_back((slot, pod));
            }
        }
    }

    /// Slot `slot`'s Pod ends: deleted gracefully (`graceful`), or else evicted (phase
    /// `Failed`, reason `Evicted`). The kubelet kills its containers within its grace.
    pub(super) fn end_pod(&mut self, slot: usize, graceful: bool) {
        let mut pod = self.pods[slot].expect("a Pod");
        if graceful {
            pod.deleting = true;
        } else {
            pod.evicted = true;
        }
        self.set_pod(slot, Some(pod));
        self.kill_by(slot);
    }

    /// The kubelet kills slot `slot`'s containers by its grace from now (real time).
    pub(super) fn kill_by(&mut self, slot: usize) {
        let by = self.real + i64::try_from(self.grace).expect("small");
        let c = &mut self.cands[slot];
        if !c.dead {
            c.kill_by = Some(c.kill_by.map_or(by, |k| k.min(by)));
        }
    }
}
