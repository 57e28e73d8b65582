//! kube-controller-manager's own leader election, measured beside the candidates.
//!
//! The test control plane runs its kube-controller-manager with `--leader-elect=false` (its
//! garbage collector and namespace controllers only) and as `admin`, in `system:masters`,
//! whose requests go to API Priority and Fairness's `exempt` level. Neither is how a cluster
//! runs it. So the load scenarios start a second kube-controller-manager of the same release,
//! as a cluster does: authenticated with a client certificate as `system:kube-controller-manager`
//! (the bootstrap RBAC role of that name lets it renew Lease `kube-system/kube-controller-manager`,
//! and the bootstrap FlowSchema `system-leader-election` sends those renewals to the
//! `leader-election` priority level), leader election on at its defaults (`15s/10s/2s`), and
//! one controller of no weight (`ttl-controller`: there are no Nodes). It writes its Lease as every
//! kube-controller-manager does; this is what the candidates' load does to it.
//!
//! The API server gets two flags more for it: `--client-ca-file` (a CA made here, which signed
//! its client certificate) and `--audit-policy-file`, the test control plane's policy plus a
//! rule that records `system:kube-controller-manager`'s Lease requests in `kube-system`.
//! kube-controller-manager exits when it loses its Lease; the supervisor here starts it again
//! and counts the exits.

use std::{
    path::{Path, PathBuf},
    process::{Command as StdCommand, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_leader_testenv::{Assets, ControlPlane, ControlPlaneOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{candidate::guarded, clock::mono_ns};

/// The user kube-controller-manager authenticates as.
pub(crate) const USER: &str = "system:kube-controller-manager";
/// Its Lease, in `kube-system`.
pub(crate) const LEASE: &str = "kube-controller-manager";

/// The files the API server needs for it, made before the control plane starts.
#[derive(Debug, Clone)]
pub(crate) struct Extras {
    dir: PathBuf,
    ca: PathBuf,
    policy: PathBuf,
}

impl Extras {
    /// Makes a CA, a client certificate for [`USER`] and the audit policy in `dir`.
    pub(crate) fn prepare(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "30",
            "-subj",
            "/CN=kube-leader-bench-client-ca",
            "-keyout",
            &path("ca.key"),
            "-out",
            &path("ca.crt"),
        ])?;
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={USER}"),
            "-keyout",
            &path("kcm.key"),
            "-out",
            &path("kcm.csr"),
        ])?;
        std::fs::write(dir.join("kcm.ext"), "extendedKeyUsage=clientAuth\n")?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &path("kcm.csr"),
            "-CA",
            &path("ca.crt"),
            "-CAkey",
            &path("ca.key"),
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            &path("kcm.ext"),
            "-out",
            &path("kcm.crt"),
        ])?;
        let policy = dir.join("audit-policy.yaml");
        std::fs::write(&policy, audit_policy())?;
        Ok(Self {
            dir: dir.to_owned(),
            ca: dir.join("ca.crt"),
            policy,
        })
    }

    /// The API server's extra flags.
    pub(crate) fn options(&self) -> ControlPlaneOptions {
        let flag = |name: &str, p: &Path| format!("{name}={}", p.display());
        ControlPlaneOptions::new()
            .apiserver_arg(flag("--client-ca-file", &self.ca))
            .apiserver_arg(flag("--audit-policy-file", &self.policy))
    }
}

/// The test control plane's audit policy (the restricted users' requests at `Metadata`), with
/// kube-controller-manager's Lease requests first.
fn audit_policy() -> String {
    kube_leader_testenv::audit_policy_with(&format!(
        "- level: Metadata
  users: [\"{USER}\"]
  namespaces: [\"kube-system\"]
  resources:
  - group: coordination.k8s.io
    resources: [\"leases\"]
"
    ))
}

fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let out = StdCommand::new("openssl")
        .args(args)
        .output()
        .context("run openssl")?;
    if !out.status.success() {
        bail!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A kube-controller-manager electing itself, started again whenever it exits.
#[derive(Debug)]
pub(crate) struct ElectedKcm {
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// CLOCK_MONOTONIC of each exit.
    exits: Arc<Mutex<Vec<u64>>>,
    log: PathBuf,
    /// Its Lease holder identity when it first held it.
    pub(crate) identity: String,
}

impl ElectedKcm {
    /// Starts it and waits (up to 90 s) until it holds its Lease.
    pub(crate) async fn start(cp: &ControlPlane, x: &Extras, admin: &Client) -> anyhow::Result<Self> {
        let kubeconfig = x.dir.join("kcm.kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster:
    server: {}
    insecure-skip-tls-verify: true
users:
- name: kcm
  user:
    client-certificate: {}
    client-key: {}
contexts:
- name: kcm
  context:
    cluster: bench
    user: kcm
current-context: kcm
",
                cp.apiserver_url(),
                x.dir.join("kcm.crt").display(),
                x.dir.join("kcm.key").display()
            ),
        )?;
        let binary = Assets::from_env()?.binary("kube-controller-manager");
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=true".into(),
            "--leader-elect-lease-duration=15s".into(),
            "--leader-elect-renew-deadline=10s".into(),
            "--leader-elect-retry-period=2s".into(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
            "--controllers=ttl-controller".into(),
        ];
        let log = x.dir.join("kube-controller-manager.log");
        let file = std::fs::File::create(&log)?;
        let stop = CancellationToken::new();
        let exits: Arc<Mutex<Vec<u64>>> = Arc::default();
        let task = {
            let (stop, exits) = (stop.clone(), exits.clone());
            tokio::spawn(async move {
                loop {
                    let (Ok(out), Ok(err)) = (file.try_clone(), file.try_clone()) else {
                        return;
                    };
                    let mut command = guarded(&binary);
                    command
                        .args(&args)
                        .stdin(Stdio::null())
                        .stdout(out)
                        .stderr(err)
                        .kill_on_drop(true)
                        .process_group(0);
                    let mut child = match command.spawn() {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!("cannot start kube-controller-manager: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = child.wait() => {
                            exits.lock().unwrap_or_else(|p| p.into_inner()).push(mono_ns());
                        }
                        () = stop.cancelled() => {
                            let _ = child.start_kill();
                            let _ = child.wait().await;
                            return;
                        }
                    }
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = stop.cancelled() => return,
                    }
                }
            })
        };
        let api = Api::<Lease>::namespaced(admin.clone(), "kube-system");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        let identity = loop {
            if let Ok(Some(l)) = api.get_opt(LEASE).await {
                if let Some(h) = l.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty()) {
                    break h;
                }
            }
            if tokio::time::Instant::now() > deadline || task.is_finished() {
                stop.cancel();
                bail!(
                    "kube-controller-manager did not take Lease kube-system/{LEASE} within 90 s (log: {})",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        Ok(Self {
            stop,
            task,
            exits,
            log,
            identity,
        })
    }

    /// Exits so far.
    pub(crate) fn exits(&self) -> usize {
        self.exits.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Lines of its log (all its runs) that report a failed renewal or a lost Lease.
    pub(crate) fn renewal_failures_logged(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("failed to renew lease") || l.contains("leaderelection lost"))
            .count()
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// Stops it.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_records_kcm_leases_and_every_restricted_user() {
        let p = audit_policy();
        assert!(p.contains("users: [\"system:kube-controller-manager\"]"), "{p}");
        assert!(p.contains("\"user-1\", \"user-2\""), "{p}");
        assert!(p.contains("\"user-40\"]"), "{p}");
        assert!(p.trim_end().ends_with("- level: None"), "{p}");
    }
}
