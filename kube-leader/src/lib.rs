//! # kube-leader
//!
//! Leader election for Kubernetes workloads, on [kube-rs](https://kube.rs).
//!
//! Pick an elector, call `become_leader`, and work while the [`Leadership`] it returns lasts:
//!
//! - [`LeaseElector`]: client-go's `leaderelection` on a `coordination.k8s.io/v1` Lease. It
//!   works beside Go candidates on the same Lease. Followers watch instead of polling, and the
//!   leader stops leading before anybody else can see its lease as expired.
//! - [`ForLife`]: operator-sdk's leader for life. The leader creates a ConfigMap owned by its
//!   Pod and leads until the Pod is deleted.
//! - [`Shards`]: many Leases per process, spread fairly over the live candidates.
//! - [`Elector`]: a [`LeaseElector`] or a [`ForLife`], for programs that let their users choose.
//!
//! Each elector takes a config ([`LeaseConfig`], [`ForLifeConfig`], [`ShardsConfig`]) with
//! public fields and a setter per field. A [`Leadership`] gives the term's
//! [fencing token](Leadership::fencing_token), a token cancelled when leadership is lost, and
//! a [fenced client](Leadership::fenced_client) for the `kube-leader fence` webhook.
//!
//! The electors record client-go's `LeaderElection` [Events](LeaseElector::events) on the lock
//! and report to an optional [observer]. With the feature `prometheus-client`,
//! `metrics::LeaderMetrics` is such an observer. With the feature `clap`,
//! `args::LeaderElectionArgs` adds Kubernetes components' `--leader-elect*` flags to your parser.
//!
//! The library picks no `k8s-openapi` version feature and no TLS stack: enable one of each in
//! your binary (for example `k8s-openapi/earliest` and kube's `rustls-tls` with `ring`). The
//! feature `http2` adds `client::http2`: an API client over HTTP/2 for a faster handover (it
//! brings rustls with ring).
//!
//! # Quick start
//!
//! Lead a Lease named `my-operator` (in the Pod's namespace, as the Pod's name), work while
//! leading, stop when leadership is lost, and release it on shutdown:
//!
//! ```no_run
//! use kube_leader::LeaseElector;
//! use tokio_util::sync::CancellationToken;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let client = kube::Client::try_default().await?;
//!     let shutdown = CancellationToken::new(); // cancel it on SIGTERM
//!     let leadership = LeaseElector::new(client, "my-operator")
//!         .become_leader(&shutdown)
//!         .await?;
//!     let lost = leadership.lost_token();
//!     tokio::select! {
//!         () = lost.cancelled() => eprintln!("leadership lost: {:?}", leadership.loss_reason()),
//!         () = shutdown.cancelled() => {}
//!         () = work(leadership.fencing_token()) => {}
//!     }
//!     leadership.release().await?; // clears the holder: the next candidate takes over at once
//!     Ok(())
//! }
//!
//! /// Your controller; `fencing_token` is greater for every later leader.
//! async fn work(fencing_token: u64) {
//!     let _ = fencing_token;
//! }
//! ```

mod api;
#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
pub mod args;
mod backoff;
#[cfg(feature = "http2")]
#[cfg_attr(docsrs, doc(cfg(feature = "http2")))]
pub mod client;
mod discovery;
mod elector;
mod error;
mod events;
mod fence;
mod for_life;
#[doc(hidden)]
pub mod internal;
mod leadership;
mod lease;
mod lock;
#[cfg(feature = "prometheus-client")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus-client")))]
pub mod metrics;
#[cfg(test)]
mod model;
mod object_watch;
pub mod observer;
mod rbac;
mod renewals;
mod setters;
mod shards;
mod strategy;
mod successor;
mod time;
mod unelected;

/// The proptest configuration of this crate's properties: `cases` per property, or
/// `PROPTEST_CASES` if set (a long fuzzing run). Failures are not persisted: odd inputs found
/// are kept as regression unit tests beside the code.
#[cfg(test)]
pub(crate) fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

pub use elector::Elector;
pub use error::{Error, Result};
pub use for_life::{DeadLeaderPod, ForLife, ForLifeConfig, OutsideCluster};
pub use leadership::{LeaderInfo, Leadership, LossReason, Strategy, Term};
pub use lease::{Coordinated, LeaseConfig, LeaseElector};
pub use lock::LockRef;
pub use shards::{Assignments, ShardSet, Shards, ShardsConfig};
pub use successor::{CandidatePod, Successor};
