//! Test support for kube-leader: a real local Kubernetes control plane.
//!
//! [`ControlPlane`] runs etcd, kube-apiserver and kube-controller-manager (its garbage collector
//! and namespace controllers) on free ports of 127.0.0.1, from the binaries that
//! `./scripts/testenv-assets.sh` builds (1.37.2 from Go modules by default, `KUBE_LEADER_KUBERNETES`
//! picks another release; or `KUBEBUILDER_ASSETS`; see [`Assets`] and [`KubeVersion`]). There is no
//! kubelet and no scheduler: Pods never run, tests set their phase with [`set_pod_phase`].
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::Api;
//! use kube_leader_testenv::ControlPlane;
//!
//! #[tokio::test]
//! async fn lists_config_maps() {
//!     let control_plane = ControlPlane::shared();
//!     let namespace = control_plane.namespace().await;
//!     let client = control_plane.client().await;
//!     let config_maps = Api::<ConfigMap>::namespaced(client, namespace.name());
//!     assert!(config_maps.list(&Default::default()).await.unwrap().items.is_empty());
//! }
//! ```
//!
//! [`Node`] adds a real kubelet node (containerd, kubelet, kube-scheduler and the controllers a
//! Deployment needs), so that Pods run; where the machine cannot run one, [`Node::shared`] says
//! why in one line and the tests that need it skip.
//!
//! Every process dies with the test binary, however it ends (see [`ControlPlane`]).
//!
//! One [`Error`] type serves the whole crate rather than one per module: it is small, and the
//! modules share most of its variants.

mod assets;
mod audit;
mod control_plane;
mod error;
mod fixtures;
mod namespace;
mod node;
mod process;
mod proxy;

pub use assets::{Assets, KubeVersion, BINARIES, DEBIAN_KUBERNETES_VERSION, KUBERNETES_VERSION};
pub use audit::{audit_policy_with, AuditEvent};
pub use control_plane::{ControlPlane, ControlPlaneOptions, ADMIN, RESTRICTED_USERS};
pub use error::{Error, Result};
pub use fixtures::{bind_role, create_pod, pod, rule, set_pod_condition, set_pod_phase, set_pod_phase_as};
pub use namespace::TestNamespace;
pub use node::Node;
pub use proxy::{Fault, FaultProxy};
