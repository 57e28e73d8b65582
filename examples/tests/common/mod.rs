//! Running an example binary as its users run it: a kubeconfig, flags, environment, a log file.
// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::{
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use kube_leader_testenv::ControlPlane;

/// How long a test waits for what an example should do.
pub(crate) const SOON: Duration = Duration::from_secs(60);

/// An example's binary, built beside this test by `cargo test --workspace --all-targets`.
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p kube-leader-examples --examples`",
        bin.display()
    );
    bin
}

/// A running example; killed if the test fails before it stopped it.
pub(crate) struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Replica {
    /// Starts example `name` against `cp` (its admin kubeconfig), logging to
    /// `<control plane dir>/<name>-<tag>.log`.
    pub(crate) fn start(
        cp: &ControlPlane,
        name: &str,
        tag: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let log = std::fs::File::create(cp.dir().join(format!("{name}-{tag}.log"))).unwrap();
        let child = Command::new(example(name))
            .args(args)
            .envs(env.iter().copied())
            .env("KUBECONFIG", cp.kubeconfig_path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        Self(child)
    }

    /// Sends `signal`, then waits for the exit.
    pub(crate) async fn signal_and_wait(mut self, signal: nix::sys::signal::Signal) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        self.wait().await
    }

    /// Waits for the exit.
    pub(crate) async fn wait(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < SOON, "the example did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub(crate) async fn terminate(self) {
        let status = self.signal_and_wait(nix::sys::signal::Signal::SIGTERM).await;
        assert!(status.success(), "the example exited with {status} after SIGTERM");
    }
}
