//! A real local Kubernetes control plane: etcd, kube-apiserver and kube-controller-manager.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fmt::Write as _,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, MutexGuard, OnceLock,
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Namespace},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    api::{DeleteParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    Api, Client, Config,
};
use rand::distr::{Alphanumeric, SampleString};

use crate::{
    audit::{self, AuditEvent},
    error::report,
    namespace::{random_suffix, TestNamespace},
    process::{Janitor, Process},
    Assets, Error, KubeVersion, Result,
};

/// How many restricted users (`user-1` .. `user-40`) every control plane has.
pub const RESTRICTED_USERS: usize = 40;

/// The name of the user in the `system:masters` group.
pub const ADMIN: &str = "admin";

const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const CONTROLLER_MANAGER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often a component is started on freshly picked ports when another process took a port
/// between picking and binding it.
const PORT_ATTEMPTS: usize = 3;

/// The prefix of every control plane's directory in the temporary directory.
const DIR_PREFIX: &str = "kube-leader-testenv-";

/// A running etcd, kube-apiserver and kube-controller-manager (garbage collector and namespace
/// controllers), reachable only on 127.0.0.1, with token-authenticated users and a kubeconfig
/// for each.
///
/// Most tests use [`ControlPlane::shared`] and their own [`ControlPlane::namespace`]. A test that
/// disrupts the control plane ([`ControlPlane::restart_apiserver`]) starts its own with
/// [`ControlPlane::start`].
///
/// The processes cannot outlive the test binary: the kernel kills them when it exits, however
/// it exits. Dropping a `ControlPlane` kills them too and removes its directory.
///
/// # Users
///
/// - `admin`, in the `system:masters` group: may do anything. Its requests are not audited.
/// - `user-1` .. `user-40` (uids 101 .. 140), in no group: may do only what the RBAC roles
///   bound to them allow, starting with nothing but discovery. Their requests are recorded in
///   an audit log ([`ControlPlane::audit_events`]), so tests can count them.
pub struct ControlPlane {
    dir: PathBuf,
    assets: Assets,
    etcd_port: u16,
    apiserver_port: u16,
    apiserver_args: Vec<OsString>,
    users: BTreeMap<String, User>,
    audit_log: PathBuf,
    next_unused_user: AtomicUsize,
    started_in: Duration,
    processes: Mutex<Processes>,
    remove_dir_on_drop: bool,
    /// What a control plane serving a kubelet node has beyond the plain one.
    node: Option<NodeSupport>,
    /// The extra flags and features it was started with.
    options: ControlPlaneOptions,
    /// Declared last: dropped after the processes are killed.
    _etcd_data_janitor: Option<Janitor>,
}

/// What a control plane serving a kubelet node ([`crate::Node`]) has beyond the plain one: a
/// CA that the Pods' service-account mounts carry and whose serving certificate is valid for
/// 127.0.0.1, the kubelet's user, and the Pod-facing admission and controllers.
#[derive(Debug, Clone)]
pub(crate) struct NodeSupport {
    /// The node's name; its kubelet authenticates as `system:node:<name>` (group `system:nodes`).
    pub(crate) name: String,
    /// The kubelet's bearer token.
    pub(crate) kubelet_token: String,
    /// The CA certificate (PEM): it signed the API server's serving certificate and the API
    /// server's kubelet client certificate; the kubelet trusts it for client certificates.
    pub(crate) ca_cert: PathBuf,
}

#[derive(Debug)]
struct User {
    token: String,
    kubeconfig: PathBuf,
}

#[derive(Debug, Default)]
struct Processes {
    stopped: bool,
    etcd: Option<Process>,
    apiserver: Option<Process>,
    controller_manager: Option<Process>,
}

/// Extra flags and features of a control plane of its own
/// ([`ControlPlane::start_with_options`]).
///
/// The control plane chooses its components' flags by release ([`KubeVersion`]); these are
/// appended after them, so a flag given here overrides the control plane's own choice of a
/// single-valued flag.
///
/// [`ControlPlaneOptions::coordinated_leader_election`] turns on Kubernetes' coordinated leader
/// election (KEP-4355); the control plane then refuses to start on a release without it and
/// checks, once kube-apiserver is ready, that the feature gate is on and the LeaseCandidate API
/// is served, so that a test needing them fails (naming the release) rather than passes
/// without them.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    apiserver_args: Vec<OsString>,
    controller_manager_args: Vec<OsString>,
    coordinated_leader_election: bool,
}

/// The first release with `coordination.k8s.io/v1beta1` LeaseCandidates and the
/// `CoordinatedLeaderElection` gate in beta (alpha, with `v1alpha1`/`v1alpha2`, in 1.31 and 1.32).
const COORDINATED_LEADER_ELECTION_SINCE: (u32, u32) = (1, 33);

// === impl ControlPlaneOptions ===

impl ControlPlaneOptions {
    /// No extra flags or features: the control plane of [`ControlPlane::start`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a flag to kube-apiserver's command line (for example
    /// `--feature-gates=SomeGate=true`).
    #[must_use]
    pub fn apiserver_arg(mut self, arg: impl Into<OsString>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Appends a flag to kube-controller-manager's command line.
    #[must_use]
    pub fn controller_manager_arg(mut self, arg: impl Into<OsString>) -> Self {
        self.controller_manager_args.push(arg.into());
        self
    }

    /// Turns on coordinated leader election (KEP-4355): kube-apiserver gets
    /// `--feature-gates=CoordinatedLeaderElection=true` and
    /// `--runtime-config=coordination.k8s.io/v1beta1=true` (the LeaseCandidate API).
    ///
    /// With the gate, kube-apiserver itself runs the leader election controller (which elects a
    /// holder among the LeaseCandidates of a Lease and sets its `spec.strategy` and
    /// `spec.preferredHolder`) and the LeaseCandidate garbage collector; kube-controller-manager
    /// needs nothing (here it does not elect a leader of its own). Without the gate the API
    /// server drops `spec.strategy` and `spec.preferredHolder` from every Lease written.
    ///
    /// Needs Kubernetes 1.33 or later: starting fails, naming the release, on older binaries,
    /// and when kube-apiserver does not report the gate on or does not serve
    /// `coordination.k8s.io/v1beta1` `leasecandidates`.
    #[must_use]
    pub fn coordinated_leader_election(mut self) -> Self {
        self.coordinated_leader_election = true;
        self
    }

    /// Whether [`ControlPlaneOptions::coordinated_leader_election`] was asked for.
    pub fn has_coordinated_leader_election(&self) -> bool {
        self.coordinated_leader_election
    }

    /// Fails if the release `version` lacks something asked for.
    fn check(&self, version: KubeVersion) -> Result<()> {
        let (major, minor) = COORDINATED_LEADER_ELECTION_SINCE;
        if self.coordinated_leader_election && !version.at_least(major, minor) {
            return Err(Error::Unsupported {
                version,
                what: format!(
                    "coordinated leader election with coordination.k8s.io/v1beta1 LeaseCandidates \
                     (the CoordinatedLeaderElection gate is beta from {major}.{minor})"
                ),
            });
        }
        Ok(())
    }

    /// kube-apiserver's extra flags: the features' first, then the caller's.
    fn all_apiserver_args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        if self.coordinated_leader_election {
            args.push("--feature-gates=CoordinatedLeaderElection=true".into());
            args.push("--runtime-config=coordination.k8s.io/v1beta1=true".into());
        }
        args.extend(self.apiserver_args.iter().cloned());
        args
    }
}

/// Which process a readiness check watches.
#[derive(Clone, Copy, Debug)]
enum Component {
    Etcd,
    Apiserver,
    ControllerManager,
}

// === impl ControlPlane ===

impl ControlPlane {
    /// The control plane shared by all tests of this test binary, started on first use.
    ///
    /// It is never dropped: its processes and etcd's data die with the test binary; its logs
    /// stay in [`ControlPlane::dir`] for a post-mortem until the next test run removes them.
    ///
    /// Do not stop or restart it: tests run in parallel on it. Give each test its own namespace
    /// ([`ControlPlane::namespace`]) or randomly named objects.
    ///
    /// Blocks until the control plane is ready (a few seconds); may be called from inside a
    /// `#[tokio::test]`.
    ///
    /// # Panics
    ///
    /// If the control plane cannot start, for example because the binaries are missing (the
    /// message then says to run `./scripts/testenv-assets.sh`). Every later call panics with the
    /// same message rather than trying again.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| {
            let control_plane = ControlPlane::start().map_err(|e| report(&e))?;
            eprintln!(
                "kube-leader-testenv: shared control plane (Kubernetes {}) ready in {:.1?} at {} \
                 (logs under {})",
                control_plane.kubernetes_version(),
                control_plane.started_in,
                control_plane.apiserver_url(),
                control_plane.dir.display(),
            );
            Ok(control_plane)
        });
        match shared {
            Ok(control_plane) => control_plane,
            Err(message) => panic!("the shared test control plane could not start: {message}"),
        }
    }

    /// A second control plane shared by every test in this process, with coordinated leader
    /// election on ([`ControlPlaneOptions::coordinated_leader_election`]), started on first use.
    ///
    /// # Panics
    ///
    /// As [`shared`](Self::shared), and where the release lacks coordinated leader election
    /// (the message names it).
    pub fn shared_coordinated() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| {
            let options = ControlPlaneOptions::new().coordinated_leader_election();
            Assets::from_env()
                .and_then(|assets| ControlPlane::start_with_options(assets, options))
                .map_err(|e| report(&e))
        });
        match shared {
            Ok(control_plane) => control_plane,
            Err(message) => panic!("coordinated leader election needs a control plane with it: {message}"),
        }
    }

    /// Starts a control plane of its own, with the binaries found by [`Assets::from_env`].
    ///
    /// Blocks until it is ready: etcd is healthy, kube-apiserver's `/readyz` passes and it stores
    /// a ConfigMap, and kube-controller-manager's garbage collector has deleted a probe object.
    /// May be called from inside a `#[tokio::test]` (it waits on a thread of its own).
    pub fn start() -> Result<Self> {
        Self::start_with(Assets::from_env()?)
    }

    /// Starts a control plane of its own from the given binaries; see [`ControlPlane::start`].
    pub fn start_with(assets: Assets) -> Result<Self> {
        Self::start_with_options(assets, ControlPlaneOptions::new())
    }

    /// Starts a control plane of its own from the given binaries, with extra flags or features
    /// ([`ControlPlaneOptions`]); see [`ControlPlane::start`].
    ///
    /// ```no_run
    /// use kube_leader_testenv::{Assets, ControlPlane, ControlPlaneOptions};
    ///
    /// let options = ControlPlaneOptions::new().coordinated_leader_election();
    /// // Fails, naming the release, on binaries older than 1.33.
    /// let control_plane = ControlPlane::start_with_options(Assets::from_env()?, options)?;
    /// # Ok::<(), kube_leader_testenv::Error>(())
    /// ```
    pub fn start_with_options(assets: Assets, options: ControlPlaneOptions) -> Result<Self> {
        Self::start_on_thread(assets, None, options)
    }

    /// Starts a control plane that serves a kubelet node named `node_name`; see
    /// [`crate::Node`].
    pub(crate) fn start_for_node(assets: Assets, node_name: &str) -> Result<Self> {
        Self::start_on_thread(assets, Some(node_name.to_owned()), ControlPlaneOptions::new())
    }

    fn start_on_thread(
        assets: Assets,
        node_name: Option<String>,
        options: ControlPlaneOptions,
    ) -> Result<Self> {
        std::thread::Builder::new()
            .name("kube-leader-testenv-start".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Error::io("start a tokio runtime for", "the control plane", e))?;
                runtime.block_on(Self::boot(assets, node_name, options))
            })
            .map_err(|e| Error::io("start a thread for", "the control plane", e))?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    async fn boot(assets: Assets, node_name: Option<String>, options: ControlPlaneOptions) -> Result<Self> {
        let started = Instant::now();
        // Before anything starts: an old release fails here, naming itself.
        options.check(assets.version()?)?;
        remove_stale_dirs();
        let dir = new_dir()?;
        let mut control_plane = ControlPlane {
            dir,
            assets,
            etcd_port: 0,
            apiserver_port: 0,
            apiserver_args: Vec::new(),
            users: BTreeMap::new(),
            audit_log: PathBuf::new(),
            next_unused_user: AtomicUsize::new(1),
            started_in: Duration::ZERO,
            processes: Mutex::default(),
            remove_dir_on_drop: false,
            node: node_name.map(|name| NodeSupport {
                name,
                kubelet_token: random_token(),
                ca_cert: PathBuf::new(),
            }),
            options,
            _etcd_data_janitor: None,
        };
        // On failure the processes are killed and etcd's data removed (by drop), but the logs
        // stay, because the error names them; the next run removes them.
        control_plane.boot_etcd().await?;
        control_plane.boot_apiserver().await?;
        control_plane.check_features().await?;
        control_plane.boot_controller_manager().await?;
        control_plane.started_in = started.elapsed();
        control_plane.remove_dir_on_drop = true;
        tracing::info!(
            url = %control_plane.apiserver_url(),
            dir = %control_plane.dir.display(),
            started_in = ?control_plane.started_in,
            "control plane ready"
        );
        Ok(control_plane)
    }

    async fn boot_etcd(&mut self) -> Result<()> {
        let dir = self.component_dir("etcd")?;
        self._etcd_data_janitor = Some(Janitor::spawn(&dir.join("data"))?);
        for attempt in 1..=PORT_ATTEMPTS {
            // An earlier attempt may have initialised a member with other peer URLs.
            let _ = std::fs::remove_dir_all(dir.join("data"));
            let [client_port, peer_port] = free_ports::<2>()?;
            let client_url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let args: Vec<OsString> = vec![
                "--name=default".into(),
                flag("--data-dir", dir.join("data")),
                format!("--listen-client-urls={client_url}").into(),
                format!("--advertise-client-urls={client_url}").into(),
                format!("--listen-peer-urls={peer_url}").into(),
                format!("--initial-advertise-peer-urls={peer_url}").into(),
                format!("--initial-cluster=default={peer_url}").into(),
                "--logger=zap".into(),
                "--log-outputs=stderr".into(),
            ];
            let process = Process::spawn("etcd", &self.assets.binary("etcd"), &args, &dir)?;
            self.processes().etcd = Some(process);
            self.etcd_port = client_port;
            match self
                .wait_ready(Component::Etcd, ETCD_READY_TIMEOUT, || etcd_healthy(client_port))
                .await
            {
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    tracing::debug!(attempt, "etcd lost a port race; trying other ports");
                }
                result => return result,
            }
        }
        unreachable!("the last attempt returns")
    }

    async fn boot_apiserver(&mut self) -> Result<()> {
        let dir = self.component_dir("kube-apiserver")?;
        let key = dir.join("service-account.key");
        let public_key = dir.join("service-account.pub");
        openssl(&["genrsa", "-out"], &key, &["2048"])?;
        openssl(
            &["rsa", "-in"],
            &key,
            &["-pubout", "-out", &public_key.to_string_lossy()],
        )?;

        let mut tokens = String::new();
        let admin_token = random_token();
        writeln!(tokens, "{admin_token},{ADMIN},1,\"system:masters\"").unwrap();
        self.users.insert(
            ADMIN.into(),
            User {
                token: admin_token,
                kubeconfig: self.dir.join("kubeconfig").join(ADMIN),
            },
        );
        for i in 1..=RESTRICTED_USERS {
            let name = format!("user-{i}");
            let token = random_token();
            writeln!(tokens, "{token},{name},{}", 100 + i).unwrap();
            let kubeconfig = self.dir.join("kubeconfig").join(&name);
            self.users.insert(name, User { token, kubeconfig });
        }
        if let Some(node) = &self.node {
            writeln!(
                tokens,
                "{},system:node:{},kubelet-{},\"system:nodes\"",
                node.kubelet_token, node.name, node.name
            )
            .unwrap();
        }
        let token_file = dir.join("tokens.csv");
        write(&token_file, tokens)?;

        let audit_policy = dir.join("audit-policy.yaml");
        write(&audit_policy, audit::policy(RESTRICTED_USERS))?;
        self.audit_log = dir.join("audit.log");

        let kubeconfig_dir = self.dir.join("kubeconfig");
        std::fs::create_dir_all(&kubeconfig_dir)
            .map_err(|e| Error::io("create directory", &kubeconfig_dir, e))?;

        for attempt in 1..=PORT_ATTEMPTS {
            let [port] = free_ports::<1>()?;
            self.apiserver_port = port;
            self.write_kubeconfigs()?;
            self.apiserver_args = vec![
                format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port).into(),
                format!("--secure-port={port}").into(),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                flag("--token-auth-file", &token_file),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                flag("--service-account-key-file", &public_key),
                flag("--service-account-signing-key-file", &key),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                // The reconciler would put 127.0.0.1 into the endpoints of Service `kubernetes`,
                // which validation refuses (loopback), and log that error every 10 s.
                "--endpoint-reconciler-type=none".into(),
                "--profiling=false".into(),
                // API Priority and Fairness on, as in every cluster since 1.20 (its default), so
                // that overload is answered with its 429s and Retry-After (issue 13).
                "--enable-priority-and-fairness=true".into(),
                flag("--audit-policy-file", &audit_policy),
                flag("--audit-log-path", &self.audit_log),
                // Each event is written before the response, so a test reads its own requests.
                "--audit-log-mode=blocking".into(),
            ];
            let node_args = self.node_apiserver_args(&dir)?;
            self.apiserver_args.extend(node_args);
            self.apiserver_args.extend(self.options.all_apiserver_args());
            match self.start_apiserver().await {
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    tracing::debug!(attempt, "kube-apiserver lost a port race; trying another port");
                }
                result => return result,
            }
        }
        unreachable!("the last attempt returns")
    }

    /// The API server's flags that differ for a node: a CA-signed serving certificate for
    /// 127.0.0.1 (Pods verify it with their service-account `ca.crt`), the kubelet's client
    /// certificate, Node authorization, ServiceAccount admission on (the plain control plane turns
    /// it off: no ServiceAccount controller runs there). Without a node: a self-signed certificate
    /// and RBAC only.
    fn node_apiserver_args(&mut self, dir: &Path) -> Result<Vec<OsString>> {
        let Some(node) = &mut self.node else {
            return Ok(vec![
                flag("--cert-dir", dir.join("certs")),
                "--authorization-mode=RBAC".into(),
                // No ServiceAccount controller runs, so Pods could not get their default one.
                "--disable-admission-plugins=ServiceAccount".into(),
            ]);
        };
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).map_err(|e| Error::io("create directory", &pki, e))?;
        let ca = pki.join("ca");
        if !pki.join("ca.crt").exists() {
            certificate(&pki, "ca", "/CN=kube-leader-testenv-ca", None)?;
            certificate(
                &pki,
                "apiserver",
                "/CN=kube-apiserver",
                Some((
                    &ca,
                    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
                )),
            )?;
            certificate(
                &pki,
                "kubelet-client",
                "/O=system:masters/CN=kube-apiserver-kubelet-client",
                Some((&ca, "extendedKeyUsage=clientAuth")),
            )?;
        }
        node.ca_cert = pki.join("ca.crt");
        Ok(vec![
            flag("--tls-cert-file", pki.join("apiserver.crt")),
            flag("--tls-private-key-file", pki.join("apiserver.key")),
            flag("--client-ca-file", pki.join("ca.crt")),
            flag("--kubelet-client-certificate", pki.join("kubelet-client.crt")),
            flag("--kubelet-client-key", pki.join("kubelet-client.key")),
            // Otherwise `kubectl logs/exec` make the API server resolve the node's name through
            // the machine's DNS server.
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
        ])
    }

    async fn boot_controller_manager(&mut self) -> Result<()> {
        let dir = self.component_dir("kube-controller-manager")?;
        let mut args: Vec<OsString> = vec![
            flag("--kubeconfig", self.kubeconfig_path()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            // No serving at all: readiness is proven by the garbage collector working.
            "--secure-port=0".into(),
        ];
        if !self.assets.version()?.at_least(1, 24) {
            // The insecure port (on by default before 1.24, which removed the flag).
            args.push("--port=0".into());
        }
        let version = self.assets.version()?;
        match &self.node {
            None => args.push("--controllers=garbagecollector,namespace".into()),
            Some(node) => args.extend([
                // What a Deployment of real Pods needs: ServiceAccounts and their tokens, the
                // Deployment and ReplicaSet controllers, the garbage collector, namespace
                // deletion, Pod GC, and node lifecycle (NotReady, taints). From 1.21 on, Pods'
                // service-account volumes are projected (bound tokens) and take `ca.crt` from
                // each namespace's ConfigMap `kube-root-ca.crt`, which root-ca-cert-publisher
                // writes.
                format!(
                    "--controllers=serviceaccount-token,serviceaccount,garbagecollector,namespace,deployment,replicaset,podgc,nodelifecycle{}",
                    if version.at_least(1, 21) { ",root-ca-cert-publisher" } else { "" }
                )
                .into(),
                flag("--root-ca-file", &node.ca_cert),
                flag(
                    "--service-account-private-key-file",
                    self.dir.join("kube-apiserver").join("service-account.key"),
                ),
                // A stopped kubelet makes its node NotReady after this long (default 40 s).
                "--node-monitor-grace-period=16s".into(),
                "--node-monitor-period=2s".into(),
            ]),
        }
        args.extend(self.options.controller_manager_args.iter().cloned());
        let process = Process::spawn(
            "kube-controller-manager",
            &self.assets.binary("kube-controller-manager"),
            &args,
            &dir,
        )?;
        self.processes().controller_manager = Some(process);

        // A ConfigMap owned by an object that does not exist: the garbage collector deletes it
        // once its informers have synced.
        let client = self.probe_client(ADMIN).await?;
        let config_maps = Api::<ConfigMap>::namespaced(client, "default");
        let probe = ConfigMap {
            metadata: ObjectMeta {
                generate_name: Some("kube-leader-testenv-gc-probe-".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "kube-leader-testenv-gc-probe-owner".into(),
                    uid: format!("kube-leader-testenv-{}", random_suffix(12)),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let probe = config_maps
            .create(&PostParams::default(), &probe)
            .await
            .map_err(|e| Error::kube("create the garbage-collector probe ConfigMap in default", e))?;
        let name = probe.metadata.name.unwrap_or_default();
        self.wait_ready(
            Component::ControllerManager,
            CONTROLLER_MANAGER_READY_TIMEOUT,
            || async {
                match config_maps.get_opt(&name).await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err(format!(
                        "the garbage collector has not yet deleted ConfigMap default/{name}, whose owner does not exist"
                    )),
                    Err(e) => Err(format!("get ConfigMap default/{name}: {}", report(&e))),
                }
            },
        )
        .await
    }

    /// Checks, on the ready kube-apiserver, what the options asked for: for coordinated leader
    /// election, the gate reported on in `/metrics` (`kubernetes_feature_enabled`) and
    /// `leasecandidates` served in `coordination.k8s.io/v1beta1`.
    async fn check_features(&self) -> Result<()> {
        if !self.options.coordinated_leader_election {
            return Ok(());
        }
        let version = self.assets.version()?;
        let unsupported = |why: String| Error::Unsupported {
            version,
            what: format!("coordinated leader election: {why}"),
        };
        let client = self.probe_client(ADMIN).await?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| unsupported(format!("GET /metrics: {e}")))?;
        let metrics = client
            .request_text(request)
            .await
            .map_err(|e| Error::kube("GET /metrics of kube-apiserver", e))?;
        let gate_on = metrics.lines().any(|line| {
            line.starts_with("kubernetes_feature_enabled{")
                && line.contains("name=\"CoordinatedLeaderElection\"")
                && line.trim_end().ends_with(" 1")
        });
        if !gate_on {
            return Err(unsupported(
                "kube-apiserver does not report the CoordinatedLeaderElection feature gate on \
                 (kubernetes_feature_enabled in /metrics)"
                    .into(),
            ));
        }
        let served = match client
            .list_api_group_resources("coordination.k8s.io/v1beta1")
            .await
        {
            Ok(list) => list.resources.iter().any(|r| r.name == "leasecandidates"),
            Err(kube::Error::Api(e)) if e.code == 404 => false,
            Err(e) => return Err(Error::kube("list coordination.k8s.io/v1beta1 resources", e)),
        };
        if !served {
            return Err(unsupported(
                "kube-apiserver does not serve coordination.k8s.io/v1beta1 leasecandidates".into(),
            ));
        }
        Ok(())
    }

    /// Polls `probe` until it succeeds, the component's process exits, or `timeout` passes.
    async fn wait_ready<F, Fut>(&self, component: Component, timeout: Duration, mut probe: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let started = Instant::now();
        loop {
            if let Some(e) = self.with_process(component, Process::exited)? {
                return Err(e);
            }
            let last_problem = match probe().await {
                Ok(()) => {
                    tracing::debug!(?component, waited = ?started.elapsed(), "ready");
                    return Ok(());
                }
                Err(problem) => problem,
            };
            if started.elapsed() >= timeout {
                return Err(self
                    .with_process(component, |p| Some(p.not_ready(started.elapsed(), last_problem)))?
                    .expect("not_ready always returns an error"));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Runs `f` on the component's process, or fails with [`Error::Stopped`] if it is not running.
    fn with_process<T>(
        &self,
        component: Component,
        f: impl FnOnce(&mut Process) -> Option<T>,
    ) -> Result<Option<T>> {
        let mut processes = self.processes();
        let process = match component {
            Component::Etcd => processes.etcd.as_mut(),
            Component::Apiserver => processes.apiserver.as_mut(),
            Component::ControllerManager => processes.controller_manager.as_mut(),
        };
        Ok(f(process.ok_or(Error::Stopped)?))
    }

    fn processes(&self) -> MutexGuard<'_, Processes> {
        // A panic while holding the lock leaves the processes in a usable state.
        self.processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn component_dir(&self, component: &str) -> Result<PathBuf> {
        let dir = self.dir.join(component);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        Ok(dir)
    }

    fn write_kubeconfigs(&self) -> Result<()> {
        for (name, user) in &self.users {
            write(
                &user.kubeconfig,
                kubeconfig(&self.apiserver_url(), name, &user.token),
            )?;
        }
        Ok(())
    }

    /// A client with short timeouts, for readiness probes.
    async fn probe_client(&self, user: &str) -> Result<Client> {
        let mut config = self.config(user).await?;
        config.connect_timeout = Some(Duration::from_secs(2));
        config.read_timeout = Some(Duration::from_secs(5));
        config.write_timeout = Some(Duration::from_secs(5));
        Client::try_from(config).map_err(|e| Error::kube("build a client", e))
    }

    /// The client configuration of `user` (`admin` or `user-1` .. `user-40`), read from its
    /// kubeconfig.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads a file.
    pub async fn config(&self, user: &str) -> Result<Config> {
        let path = self.user_kubeconfig_path(user)?.to_owned();
        let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| Error::Kubeconfig {
            path: path.clone(),
            source: Box::new(e),
        })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig {
                path,
                source: Box::new(e),
            })
    }

    /// A new client for `admin` (group `system:masters`), bound to the calling tokio runtime.
    ///
    /// Each call builds a new client, so each `#[tokio::test]` (each with its own runtime) has
    /// its own; never share a client across runtimes.
    ///
    /// # Panics
    ///
    /// If the admin kubeconfig cannot be loaded, which would be a bug in this crate.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn client(&self) -> Client {
        self.user_client(ADMIN).await
    }

    /// A new client for `user` (`admin` or `user-1` .. `user-40`), bound to the calling tokio
    /// runtime; see [`ControlPlane::client`].
    ///
    /// # Panics
    ///
    /// If `user` is unknown.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn user_client(&self, user: &str) -> Client {
        let config = self
            .config(user)
            .await
            .unwrap_or_else(|e| panic!("no client for {user}: {}", report(&e)));
        Client::try_from(config).unwrap_or_else(|e| panic!("no client for {user}: {}", report(&e)))
    }

    /// Creates a namespace `kl-<random>` and returns its guard, which deletes it (best effort)
    /// when dropped.
    ///
    /// # Panics
    ///
    /// If the namespace cannot be created.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: a namespace created just before cancellation is left behind
    /// (it dies with the control plane).
    pub async fn namespace(&self) -> TestNamespace {
        let config = self
            .config(ADMIN)
            .await
            .unwrap_or_else(|e| panic!("no admin client: {}", report(&e)));
        let client =
            Client::try_from(config.clone()).unwrap_or_else(|e| panic!("no admin client: {}", report(&e)));
        let name = format!("kl-{}", random_suffix(10));
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("kube-leader-testenv".to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client)
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("could not create namespace {name}: {}", report(&e)));
        TestNamespace::new(name, config)
    }

    /// Hands out a restricted user (`user-1` .. `user-40`) that no other caller of this method on
    /// this control plane got, so that a test can count that user's requests alone.
    ///
    /// # Panics
    ///
    /// When all 40 users have been handed out.
    pub fn unused_user(&self) -> String {
        let i = self.next_unused_user.fetch_add(1, Ordering::Relaxed);
        assert!(
            i <= RESTRICTED_USERS,
            "all {RESTRICTED_USERS} restricted users of this control plane are in use"
        );
        format!("user-{i}")
    }

    /// The admin kubeconfig (`insecure-skip-tls-verify`, token authentication).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.users[ADMIN].kubeconfig
    }

    /// The kubeconfig of `user` (`admin` or `user-1` .. `user-40`).
    pub fn user_kubeconfig_path(&self, user: &str) -> Result<&Path> {
        Ok(&self.user(user)?.kubeconfig)
    }

    /// The bearer token of `user` (`admin` or `user-1` .. `user-40`).
    pub fn user_token(&self, user: &str) -> Result<&str> {
        Ok(&self.user(user)?.token)
    }

    fn user(&self, user: &str) -> Result<&User> {
        self.users
            .get(user)
            .ok_or_else(|| Error::UnknownUser(user.to_owned()))
    }

    /// The API server's URL, `https://127.0.0.1:<port>` (self-signed certificate).
    pub fn apiserver_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port)
    }

    /// The Kubernetes release of the binaries (see [`Assets::version`]), for what differs
    /// between releases: for example the PodDisruptionBudget is `policy/v1beta1` only before 1.21.
    pub fn kubernetes_version(&self) -> KubeVersion {
        self.assets
            .version()
            .expect("the version was read when the control plane started")
    }

    /// The API server's port on 127.0.0.1. It stays the same across restarts.
    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    /// The directory holding the logs, data and kubeconfigs of this control plane.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What this control plane has for a node, if it serves one.
    pub(crate) fn node_support(&self) -> Option<&NodeSupport> {
        self.node.as_ref()
    }

    /// The CA certificate (PEM) that the API server's
    /// serving certificate is signed by, if this control plane serves a node (else its
    /// certificate is self-signed and clients skip verification).
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.node.as_ref().map(|node| node.ca_cert.as_path())
    }

    /// How long [`ControlPlane::start`] took, until every component was ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// A `kubectl` command with the admin kubeconfig, for debugging and for tests of the CLI.
    #[must_use]
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.assets.binary("kubectl"));
        command.arg(flag("--kubeconfig", self.kubeconfig_path()));
        command
    }

    /// Runs `kubectl ARGS` as admin with `stdin` on its standard input: its stdout, or an error
    /// with its stderr if it failed.
    pub fn kubectl_with_stdin(&self, args: &[&str], stdin: &str) -> std::io::Result<String> {
        use std::{io::Write, process::Stdio};
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?
            .write_all(stdin.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "kubectl {args:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The audit events of the requests made by `user` (`user-1` .. `user-40`; `admin`'s requests
    /// are not audited), in the order the API server wrote them.
    ///
    /// Each request yields one event at the `ResponseComplete` stage (and, for a watch, an
    /// earlier one at `ResponseStarted`); count distinct [`AuditEvent::audit_id`]s, or use
    /// [`ControlPlane::request_count`]. The API server writes an event before it answers.
    pub fn audit_events(&self, user: &str) -> Result<Vec<AuditEvent>> {
        self.user(user)?;
        audit::read(&self.audit_log, user)
    }

    /// How many requests `user` (`user-1` .. `user-40`) has made so far; see
    /// [`ControlPlane::audit_events`].
    pub fn request_count(&self, user: &str) -> Result<usize> {
        Ok(audit::count_requests(&self.audit_events(user)?))
    }

    /// Kills kube-apiserver and starts it again on the same port and etcd, then waits until it
    /// is ready. Clients keep working after a few failed requests.
    ///
    /// Use it on a control plane of your own ([`ControlPlane::start`]), not the shared one.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: cancelled after the kill, the API server may stay down until
    /// [`ControlPlane::start_apiserver`] is called.
    pub async fn restart_apiserver(&self) -> Result<()> {
        self.stop_apiserver();
        self.start_apiserver().await
    }

    /// Kills kube-apiserver (SIGKILL, as a crash would); [`ControlPlane::start_apiserver`] brings
    /// it back. Does nothing if it is not running.
    pub fn stop_apiserver(&self) {
        if let Some(mut apiserver) = self.processes().apiserver.take() {
            apiserver.kill();
        }
    }

    /// Starts kube-apiserver (again) on its port and waits until it is ready; does nothing if it
    /// runs.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: the process keeps starting; call again to wait for it.
    pub async fn start_apiserver(&self) -> Result<()> {
        {
            let mut processes = self.processes();
            if processes.stopped {
                return Err(Error::Stopped);
            }
            let running = processes
                .apiserver
                .as_mut()
                .is_some_and(|apiserver| apiserver.exited().is_none());
            if !running {
                let dir = self.dir.join("kube-apiserver");
                let binary = self.assets.binary("kube-apiserver");
                processes.apiserver = Some(Process::spawn(
                    "kube-apiserver",
                    &binary,
                    &self.apiserver_args,
                    &dir,
                )?);
            }
        }
        let client = self.probe_client(ADMIN).await?;
        self.wait_ready(Component::Apiserver, APISERVER_READY_TIMEOUT, || async {
            apiserver_ready(&client).await
        })
        .await
    }

    /// Kills every process of this control plane. Idempotent. Dropping the control plane does this
    /// too, and removes its directory.
    pub fn stop(&self) {
        let mut processes = self.processes();
        processes.stopped = true;
        // Dependents first, so their logs do not fill with connection errors.
        for process in [
            processes.controller_manager.take(),
            processes.apiserver.take(),
            processes.etcd.take(),
        ]
        .into_iter()
        .flatten()
        {
            drop(process);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        if self.remove_dir_on_drop {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("apiserver_url", &self.apiserver_url())
            .field("etcd_port", &self.etcd_port)
            .field("dir", &self.dir)
            .field("assets", &self.assets)
            .field("started_in", &self.started_in)
            .finish_non_exhaustive()
    }
}

// === readiness probes ===

/// etcd answers `GET /health` with `{"health":"true"}`.
async fn etcd_healthy(port: u16) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let check = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        std::io::Result::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(response)) if response.contains(r#""health":"true""#) => Ok(()),
        Ok(Ok(response)) => Err(format!(
            "GET /health answered {:?}",
            response.lines().last().unwrap_or_default()
        )),
        Ok(Err(e)) => Err(format!("GET /health: {e}")),
        Err(_) => Err("GET /health timed out".into()),
    }
}

/// `/readyz` passes, and a ConfigMap can be stored in `default` (which the API server creates
/// shortly after it starts serving).
async fn apiserver_ready(client: &Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| format!("GET /readyz: {}", report(&e)))?;

    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let probe = ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("kube-leader-testenv-probe-".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let created = config_maps
        .create(&PostParams::default(), &probe)
        .await
        .map_err(|e| format!("create a ConfigMap in default: {}", report(&e)))?;
    let name = created.metadata.name.unwrap_or_default();
    config_maps
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| format!("delete ConfigMap default/{name}: {}", report(&e)))?;
    Ok(())
}

/// Whether a component failed because another process took its port.
fn port_taken(error: &Error) -> bool {
    matches!(error, Error::Exited { tail, .. } if tail.contains("address already in use"))
}

// === files and ports ===

/// Picks `N` distinct free ports on 127.0.0.1. The listeners are closed again, so another
/// process may take a port before the component binds it; callers retry on that.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::io("bind a free port on", "127.0.0.1", e))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(|e| Error::io("bind a free port on", "127.0.0.1", e))?
            .port();
    }
    Ok(ports)
}

/// A new directory `<tmp>/kube-leader-testenv-<pid>-<n>`.
fn new_dir() -> Result<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{n}", std::process::id()));
    if dir.exists() {
        // Left by an earlier process with the same pid.
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io("remove directory", &dir, e))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
    Ok(dir)
}

/// Removes the directories of control planes whose test binary is gone. Best effort.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            tracing::debug!(dir = %entry.path().display(), "removing a stale control-plane directory");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub(crate) fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, contents).map_err(|e| Error::io("write", path, e))
}

pub(crate) fn flag(name: &str, path: impl AsRef<Path>) -> OsString {
    let mut flag = OsString::from(name);
    flag.push("=");
    flag.push(path.as_ref());
    flag
}

fn random_token() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

/// Runs `openssl <before> <path> <after>`.
fn openssl(before: &[&str], path: &Path, after: &[&str]) -> Result<()> {
    let mut command = Command::new("openssl");
    command.args(before).arg(path).args(after);
    let output = command.output().map_err(|e| Error::io("run", "openssl", e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            command: format!("{command:?}"),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Writes `<dir>/<name>.key` (RSA 2048) and `<dir>/<name>.crt` for `subject`: self-signed (a
/// CA) without `signer`, else signed by `signer`'s `<path>.crt`/`<path>.key` with the given
/// extensions (lines of an openssl extension file).
fn certificate(dir: &Path, name: &str, subject: &str, signer: Option<(&Path, &str)>) -> Result<()> {
    let key = dir.join(format!("{name}.key"));
    let crt = dir.join(format!("{name}.crt"));
    let run = |args: Vec<OsString>| -> Result<()> {
        let mut command = Command::new("openssl");
        command.args(&args);
        let output = command.output().map_err(|e| Error::io("run", "openssl", e))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Command {
                command: format!("{command:?}"),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    };
    match signer {
        None => run(vec![
            "req".into(),
            "-x509".into(),
            "-newkey".into(),
            "rsa:2048".into(),
            "-nodes".into(),
            "-days".into(),
            "30".into(),
            "-subj".into(),
            subject.into(),
            "-keyout".into(),
            key.into(),
            "-out".into(),
            crt.into(),
        ]),
        Some((ca, extensions)) => {
            let csr = dir.join(format!("{name}.csr"));
            let ext = dir.join(format!("{name}.ext"));
            write(&ext, format!("{extensions}\n"))?;
            run(vec![
                "req".into(),
                "-newkey".into(),
                "rsa:2048".into(),
                "-nodes".into(),
                "-subj".into(),
                subject.into(),
                "-keyout".into(),
                key.into(),
                "-out".into(),
                csr.clone().into(),
            ])?;
            run(vec![
                "x509".into(),
                "-req".into(),
                "-in".into(),
                csr.into(),
                "-CA".into(),
                ca.with_extension("crt").into(),
                "-CAkey".into(),
                ca.with_extension("key").into(),
                "-CAcreateserial".into(),
                "-days".into(),
                "30".into(),
                "-extfile".into(),
                ext.into(),
                "-out".into(),
                crt.into(),
            ])
        }
    }
}

/// A kubeconfig for `user` with a bearer token, trusting the API server's self-signed
/// certificate.
fn kubeconfig(server: &str, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-leader-testenv
  cluster:
    server: {server}
    insecure-skip-tls-verify: true
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {user}
  context:
    cluster: kube-leader-testenv
    user: {user}
    namespace: default
current-context: {user}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinated_leader_election_needs_1_33_and_says_which_release_lacks_it() {
        let options = ControlPlaneOptions::new().coordinated_leader_election();
        let e = options.check(KubeVersion::V1_20_2).unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains("Kubernetes 1.20.2 does not support coordinated leader election"),
            "{message}"
        );
        let v1_32 = KubeVersion::parse("v1.32.9").unwrap();
        assert!(options.check(v1_32).is_err());
        options.check(KubeVersion::parse("v1.33.0").unwrap()).unwrap();
        options.check(KubeVersion::parse("v1.37.2").unwrap()).unwrap();
        ControlPlaneOptions::new().check(KubeVersion::V1_20_2).unwrap();
    }

    #[test]
    fn options_append_after_the_features_flags() {
        let options = ControlPlaneOptions::new()
            .apiserver_arg("--v=2")
            .coordinated_leader_election()
            .controller_manager_arg("--v=3");
        assert_eq!(
            options.all_apiserver_args(),
            [
                "--feature-gates=CoordinatedLeaderElection=true",
                "--runtime-config=coordination.k8s.io/v1beta1=true",
                "--v=2"
            ]
            .map(OsString::from)
        );
        assert_eq!(options.controller_manager_args, [OsString::from("--v=3")]);
        assert!(ControlPlaneOptions::new().all_apiserver_args().is_empty());
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports::<3>().unwrap();
        assert!(a != b && b != c && a != c);
    }

    #[tokio::test]
    async fn kubeconfig_loads_with_token_and_insecure_tls() {
        let text = kubeconfig("https://127.0.0.1:6443", "user-3", "abc123");
        let kubeconfig = Kubeconfig::from_yaml(&text).unwrap();

        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();

        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert!(config.accept_invalid_certs);
        assert_eq!(config.default_namespace, "default");
    }

    #[test]
    fn port_races_are_recognised() {
        let error = Error::Exited {
            component: "etcd",
            status: std::process::ExitStatus::default(),
            log: PathBuf::from("etcd.log"),
            tail: "listen tcp 127.0.0.1:2379: bind: address already in use".into(),
        };
        assert!(port_taken(&error));
    }
}
