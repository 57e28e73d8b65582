//! Leader for life: operator-sdk's `leader.Become`, watch-driven, with its flaws fixed.
//!
//! The lock is a ConfigMap whose single owner reference is the leader's Pod; see [`ForLife`].
//!
//! # The lock
//!
//! ```yaml
//! apiVersion: v1
//! kind: ConfigMap
//! metadata:
//!   name: my-operator-lock
//!   labels:
//!     app.kubernetes.io/managed-by: kube-leader
//!     kube-leader.io/strategy: for-life
//!   annotations:
//!     kube-leader.io/holder: my-operator-7d9f-abcde        # the leader Pod
//!     kube-leader.io/acquired-at: "2024-05-06T07:08:09Z"   # its wall clock, RFC 3339
//!     kube-leader.io/fencing-token: "48213"                # resourceVersion at creation
//!   ownerReferences:
//!   - apiVersion: v1
//!     kind: Pod
//!     name: my-operator-7d9f-abcde
//!     uid: 0b1c...
//! ```
//!
//! # Fencing token
//!
//! The `resourceVersion` returned by the create of the lock. With etcd3 storage it is etcd's
//! global revision at that write, and every later lock of the same name is created at a later
//! revision, so every later leader gets a greater token. It is written into the lock
//! (`kube-leader.io/fencing-token`, by an update conditional on the `resourceVersion`) so that a
//! restarted leader and [`current_leader`] read the same number; a lock found without it (the
//! leader crashed between the create and that update) gets its current `resourceVersion`, which
//! still lies between the tokens of the previous and the next leader. Limits: Kubernetes calls
//! resource versions opaque, so this holds for etcd-backed API servers (and those that mimic
//! its revisions), not across an etcd restore from backup, and not between different locks.
//!
//! # Compared with operator-sdk's `leader.Become`
//!
//! - A Pod is recognised by UID, not name: a Pod recreated under the same name (a StatefulSet)
//!   does not "continue" on its predecessor's lock, which would make two leaders.
//! - Waiting candidates watch the lock and the leader Pod; the backoff (1 s doubling to exactly
//!   16 s, 20% jitter) only paces retries after errors, re-reads while a watch fails, and
//!   re-reads of a malformed lock.
//! - A leader Pod that is gone, replaced, `Failed` (any reason) or `Succeeded` makes its lock
//!   stale once its containers are known to be gone: its leader released the lock (marked
//!   `kube-leader.io/released-at`), its graceful deletion completed, the lock's opt-in liveness
//!   heartbeat (`kube-leader.io/renew-time`, see [`ForLifeConfig::liveness`]) has not moved for
//!   its advertised `kube-leader.io/liveness-seconds` plus 2 s, or its grace period plus
//!   2 s has passed since that end was seen (the 1.20 kubelet writes `Failed`/`Evicted` before
//!   it kills the containers, and a force-deleted Pod vanishes while they run). On a 1.27 or
//!   later API server a terminal phase that the kubelet itself wrote is proof too: a current
//!   kubelet writes it only once no container of the Pod can run. The lock is
//!   deleted with a UID precondition, so a newer lock is never deleted.
//! - A leader whose Pod gets a `DisruptionTarget` condition (an eviction, a preemption; 1.31
//!   and later) stops leading at once and hands over, before it is killed.
//! - A leader on a NotReady Node is never replaced, unless the opt-in
//!   [`not_ready_takeover`](ForLifeConfig::not_ready_takeover) says so.
//! - The leader keeps watching its lock and learns when it is deleted or replaced.

mod api;
mod campaign;
mod config;
pub(crate) mod decide;
mod elector;
pub(crate) mod fencing;
pub(crate) mod heartbeat;
pub(crate) mod holder;
mod keeper;
mod kubelet;
mod observe;
mod own_pod;
pub(crate) mod record;
pub(crate) mod steps;

pub use config::MIN_LIVENESS;
pub use config::{DeadLeaderPod, Environment, ForLifeConfig, OutsideCluster};
pub use elector::ForLife;
pub use observe::{current_leader, watch_leader};
