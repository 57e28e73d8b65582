//! Helpers shared by kube-leader's end-to-end tests.

pub mod balancer;
pub mod chaos;
pub mod checker;
pub mod faults;
pub mod fence_chaos;
pub mod fence_env;
pub mod interop;
pub mod shard_fleet;
pub mod shard_sidecars;

use kube_leader::internal::ForLifeExt as _;
use kube_leader::internal::LeaseElectorExt as _;
use std::time::Duration;

/// CLOCK_MONOTONIC now, in nanoseconds: one clock for every process on this host, so events of
/// several candidates and of the test harness can be ordered exactly.
pub fn mono_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}

/// A Lease candidate with the short timings of the tests, 2 s / 1 s / 200 ms (and the default
/// API timeout, half the renew deadline).
pub fn short_lease_elector(
    client: &kube::Client,
    ns: &str,
    lease: &str,
    id: &str,
) -> kube_leader::LeaseElector {
    kube_leader::LeaseElector::new(client.clone(), lease)
        .namespace(ns)
        .identity(id)
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(Duration::from_secs(2))
                .renew_deadline(Duration::from_secs(1))
                .retry_period(Duration::from_millis(200)),
        )
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `kube-leader` binary in the directory of `exe` (one of this crate's binaries, named by
/// `env!("CARGO_BIN_EXE_…")` in a test); panics with what to build if it is missing.
pub fn kube_leader_bin_beside(exe: &str) -> std::path::PathBuf {
    let bin =
        std::path::Path::new(exe).with_file_name(format!("kube-leader{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p kube-leader-cli` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

/// A test candidate process's log: to stderr, filtered by RUST_LOG, and only if it is set.
pub fn init_process_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
}

/// Installs a test log subscriber once (RUST_LOG, default `kube_leader=debug`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "kube_leader=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Changes one setting of a candidate built by a helper (the tests' shorthand for
/// `e.config(e.settings().clone().successor(..))`).
pub trait Tune: Sized {
    /// The candidate's settings type.
    type Config;
    /// The candidate with `f` applied to its settings.
    #[must_use]
    fn tune(self, f: impl FnOnce(Self::Config) -> Self::Config) -> Self;
}

impl Tune for kube_leader::LeaseElector {
    type Config = kube_leader::LeaseConfig;
    fn tune(self, f: impl FnOnce(Self::Config) -> Self::Config) -> Self {
        let config = f(self.settings().clone());
        self.config(config)
    }
}

impl Tune for kube_leader::ForLife {
    type Config = kube_leader::ForLifeConfig;
    fn tune(self, f: impl FnOnce(Self::Config) -> Self::Config) -> Self {
        let config = f(self.settings().clone());
        self.config(config)
    }
}
