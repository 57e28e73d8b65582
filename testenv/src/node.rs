//! A real kubelet node beside a control plane: containerd, kubelet and kube-scheduler, so that
//! Pods run.
//!
//! What matters on this kind of machine (root, cgroup v1, overlayfs) is written down in
//! `shared/real-node/NOTES.md`; the comments below name the points where it applies.

use std::{
    ffi::OsString,
    io::{BufRead, BufReader, Write as _},
    net::Ipv4Addr,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Mutex, MutexGuard, OnceLock},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::{
    api::{DeleteParams, PostParams},
    Api,
};

use crate::{
    control_plane::{flag, free_ports, write},
    error::report,
    process::Process,
    Assets, ControlPlane, Error, KubeVersion, Result,
};

/// Where the state of nodes lives: containerd's root, state and socket, the kubelet's root dir.
/// Not under the temporary directory: the test command removes that with `rm -rf`, which would
/// descend into mounts a crashed node left behind. The janitor removes a node's directory only
/// once nothing is mounted under it.
const BASE_DIR: &str = "/var/lib/kube-leader-testenv";

/// The node's name (`--hostname-override`).
const NODE_NAME: &str = "kl-node";

/// The sysctls the kubelet changes (NOTES.md): saved before it starts, restored at teardown.
const SYSCTLS: [&str; 3] = ["vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"];

/// Paths the kubelet and containerd use whatever they are told; removed at teardown if the node
/// created them.
const FIXED_PATHS: [&str; 3] = ["/var/log/pods", "/var/log/containers", "/run/containerd"];

const CONTAINERD_READY_TIMEOUT: Duration = Duration::from_secs(30);
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);
const PROBE_POD_TIMEOUT: Duration = Duration::from_secs(60);

/// A control plane with a real node: containerd (its own configuration, root, state and
/// socket), a kubelet, kube-scheduler, and the controllers a Deployment needs; Pods run.
///
/// Pods must use `hostNetwork: true` (the only CNI plugin is `loopback`: no Pod network), reach
/// the API server with `KUBERNETES_SERVICE_HOST=127.0.0.1` and
/// `KUBERNETES_SERVICE_PORT=<`[`ControlPlane::apiserver_port`]`>` (no Service IPs, no
/// kube-proxy), and images that [`Node::build_image`] imported, with `imagePullPolicy: Never`
/// (there is no registry). The API server's certificate is signed by a CA that the Pods'
/// service-account mounts carry, so in-cluster configuration verifies it.
///
/// One node runs on a machine at a time (the kubelet uses fixed paths, cgroups and sysctls): a
/// second one waits for the first to be torn down.
///
/// # Teardown
///
/// Dropping a `Node`, or the end of the test process however it ends (even SIGKILL), tears
/// everything down: a janitor process, which holds the machine's node lock, then kills the
/// kubelet and every container process, containerd and its shims, unmounts what the node
/// mounted (deepest first), removes its cgroups, `/var/log/pods` and `/var/log/containers`,
/// restores the three sysctls the kubelet changed, and removes the node's directory. A node
/// left behind by a process that the janitor could not outlive is torn down when the next node
/// starts. Its log is `/var/lib/kube-leader-testenv/teardown.log`.
pub struct Node {
    control_plane: ControlPlane,
    name: String,
    ip: Ipv4Addr,
    dir: PathBuf,
    log_dir: PathBuf,
    socket: PathBuf,
    kubelet_args: Vec<OsString>,
    runtime: Runtime,
    version: KubeVersion,
    processes: Mutex<NodeProcesses>,
    janitor: Mutex<Option<NodeJanitor>>,
    started_in: Duration,
}

/// The container runtime's parts: those in the assets directory (`./scripts/k8s-assets.sh`
/// builds containerd 2.x, its shim, `ctr`, runc and `cni/loopback` there), else the machine's
/// (Debian's packages, `./scripts/node-deps.sh`).
#[derive(Clone, Debug)]
struct Runtime {
    containerd: PathBuf,
    ctr: PathBuf,
    runc: PathBuf,
    /// Where the shim and runc are: first on containerd's `PATH` (it starts the shim from there).
    bin_dir: Option<PathBuf>,
    cni_bin_dir: PathBuf,
    /// containerd's release: 2.x reads configuration version 3 (other plugin names) and, from
    /// 2.4, version 4 (the same for what is set here; 3 works with a migration warning).
    containerd_version: KubeVersion,
}

// === impl Runtime ===

impl Runtime {
    /// Finds the parts, or says in one line which are missing.
    fn find(assets: &Assets) -> Result<Self, String> {
        let in_assets = assets.binary("containerd").is_file();
        let find = |name: &str| -> Option<PathBuf> {
            if in_assets {
                Some(assets.binary(name)).filter(|p| p.is_file())
            } else {
                which(name)
            }
        };
        let hint = if in_assets {
            "(run ./scripts/k8s-assets.sh)"
        } else {
            "(run ./scripts/node-deps.sh)"
        };
        let cni_bin_dir = if in_assets {
            assets.binary("cni")
        } else {
            PathBuf::from("/usr/lib/cni")
        };
        let missing: Vec<String> = ["containerd", "containerd-shim-runc-v2", "runc", "ctr"]
            .iter()
            .filter(|b| find(b).is_none())
            .map(|b| format!("{b} {hint}"))
            .chain(
                Some(cni_bin_dir.join("loopback"))
                    .filter(|p| !p.is_file())
                    .map(|p| format!("{} {hint}", p.display())),
            )
            .collect();
        if !missing.is_empty() {
            return Err(format!("missing {}", missing.join(", ")));
        }
        let containerd = find("containerd").expect("checked");
        let version = Command::new(&containerd)
            .arg("--version")
            .output()
            .map_err(|e| format!("{} --version: {e}", containerd.display()))?;
        // `containerd github.com/containerd/containerd/v2 v2.4.2 ...`, Debian's
        // `containerd github.com/containerd/containerd 1.6.20~ds1 ...`.
        let version = KubeVersion::parse(&String::from_utf8_lossy(&version.stdout)).ok_or_else(|| {
            format!(
                "{} --version printed no version: {:?}",
                containerd.display(),
                String::from_utf8_lossy(&version.stdout).trim()
            )
        })?;
        Ok(Self {
            ctr: find("ctr").expect("checked"),
            runc: find("runc").expect("checked"),
            bin_dir: in_assets.then(|| assets.dir().to_owned()),
            cni_bin_dir,
            containerd_version: version,
            containerd,
        })
    }
}

#[derive(Debug, Default)]
struct NodeProcesses {
    containerd: Option<Process>,
    scheduler: Option<Process>,
    kubelet: Option<Process>,
}

// === impl Node ===

impl Node {
    /// The node shared by all tests of this test binary, started on first use; `None` if this
    /// machine cannot run a node, after printing one line that says why (once per process, on
    /// stderr, past the test harness's output capture).
    ///
    /// It is never dropped: it is torn down when the test binary exits (see [`Node`]).
    ///
    /// # Panics
    ///
    /// If the machine can run a node but it did not start; every later call panics with the same
    /// message.
    pub fn shared() -> Option<&'static Node> {
        static SHARED: OnceLock<Result<Node, Error>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| {
            let node = Node::start()?;
            eprintln!(
                "kube-leader-testenv: shared node {} ({}) ready in {:.1?}; API server {}, logs under {}",
                node.name,
                node.ip,
                node.started_in,
                node.control_plane.apiserver_url(),
                node.log_dir.display(),
            );
            Ok(node)
        });
        match shared {
            Ok(node) => Some(node),
            Err(Error::NodeUnavailable { reason }) => {
                static SAID: OnceLock<()> = OnceLock::new();
                SAID.get_or_init(|| {
                    // Not eprintln!: the test harness captures that, and a skip must be seen.
                    let _ = writeln!(
                        std::io::stderr(),
                        "kube-leader-testenv: SKIPPED: real-node tests: this machine cannot run a kubelet node: {reason}"
                    );
                });
                None
            }
            Err(e) => panic!("the shared test node could not start: {}", report(e)),
        }
    }

    /// Why this machine cannot run a node, or `None` if it can: it needs root, cgroup v1,
    /// `kubelet` and `kube-scheduler` beside the control-plane binaries, containerd, its runc
    /// shim, runc, ctr and the `loopback` CNI plugin (all in the assets directory, as
    /// `./scripts/k8s-assets.sh` builds them, or all on the machine, as
    /// `./scripts/node-deps.sh` installs them), gcc, busybox (static) and an IPv4 address that
    /// is not loopback. `KUBE_LEADER_NODE=off` turns the node off on purpose.
    pub fn unavailable(assets: &Assets) -> Option<String> {
        if std::env::var("KUBE_LEADER_NODE").is_ok_and(|v| v == "off") {
            return Some("KUBE_LEADER_NODE=off".into());
        }
        if !is_root() {
            return Some("not root (the kubelet and containerd need root)".into());
        }
        if !Path::new("/sys/fs/cgroup/memory").is_dir() || !Path::new("/sys/fs/cgroup/cpu").is_dir() {
            return Some("no cgroup v1 memory and cpu hierarchies under /sys/fs/cgroup".into());
        }
        let missing: Vec<String> = ["kubelet", "kube-scheduler"]
            .iter()
            .filter(|b| !assets.binary(b).is_file())
            .map(|b| format!("{} (run ./scripts/testenv-assets.sh)", assets.binary(b).display()))
            .chain(
                ["gcc", "strip"]
                    .iter()
                    .filter(|b| which(b).is_none())
                    .map(|b| format!("{b} (run ./scripts/node-deps.sh)")),
            )
            .chain(
                ["/bin/busybox", "/bin/dash"]
                    .iter()
                    .filter(|p| !Path::new(p).exists())
                    .map(|p| format!("{p} (run ./scripts/node-deps.sh)")),
            )
            .collect();
        if !missing.is_empty() {
            return Some(format!("missing {}", missing.join(", ")));
        }
        if let Err(reason) = Runtime::find(assets) {
            return Some(reason);
        }
        if let Err(e) = node_ip() {
            return Some(e);
        }
        if let Some(home) = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        {
            let pause = home
                .join("kube-leader/build")
                .join(crate::assets::DEBIAN_KUBERNETES_VERSION)
                .join("build/pause/linux/pause.c");
            if !pause.is_file() && !assets.binary("pause.c").is_file() {
                return Some(format!(
                    "missing {} for the pause image (run ./scripts/testenv-assets.sh)",
                    pause.display()
                ));
            }
        }
        None
    }

    /// Starts a control plane with a node, with the binaries found by [`Assets::from_env`]; fails
    /// with [`Error::NodeUnavailable`] if [`Node::unavailable`] says why it cannot.
    ///
    /// Blocks until the node is Ready and a probe Pod has run (40-60 s from cold on 2 cores).
    /// May be called from inside a `#[tokio::test]` (it waits on a thread of its own).
    pub fn start() -> Result<Self> {
        let assets = Assets::from_env()?;
        if let Some(reason) = Self::unavailable(&assets) {
            return Err(Error::NodeUnavailable { reason });
        }
        std::thread::Builder::new()
            .name("kube-leader-testenv-node".into())
            .spawn(move || Self::boot(assets))
            .map_err(|e| Error::io("start a thread for", "the node", e))?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    fn boot(assets: Assets) -> Result<Self> {
        let started = Instant::now();
        let ip = node_ip().map_err(|reason| Error::NodeUnavailable { reason })?;
        std::fs::create_dir_all(BASE_DIR).map_err(|e| Error::io("create directory", BASE_DIR, e))?;
        let dir = Path::new(BASE_DIR).join(format!("node-{}", std::process::id()));
        // Takes the machine's node lock and tears down nodes left behind; from here on, the
        // janitor tears this one down when it is dropped or this process ends.
        let janitor = NodeJanitor::spawn(&dir)?;
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let mut saved = String::new();
        for key in SYSCTLS {
            let path = Path::new("/proc/sys").join(key);
            let value = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
            saved.push_str(&format!("{key} {}\n", value.trim()));
        }
        write(&dir.join("sysctls"), saved)?;
        for path in FIXED_PATHS {
            if !Path::new(path).exists() {
                write(&dir.join(format!("created{}", path.replace('/', "-"))), "")?;
            }
        }

        let runtime = Runtime::find(&assets).map_err(|reason| Error::NodeUnavailable { reason })?;
        let version = assets.version()?;
        // The release's own pause.c where the assets directory has one (./scripts/k8s-assets.sh).
        let pause_c = assets.binary("pause.c");
        let pause_image = if pause_c.is_file() {
            run_image_script_with_env(&["pause"], &[("KUBE_LEADER_PAUSE_C", pause_c.as_os_str())])?
        } else {
            run_image_script(&["pause"])?
        };
        let control_plane = ControlPlane::start_for_node(assets.clone(), NODE_NAME)?;
        let log_dir = control_plane.dir().join("node");
        std::fs::create_dir_all(&log_dir).map_err(|e| Error::io("create directory", &log_dir, e))?;

        let socket = dir.join("containerd").join("containerd.sock");
        let mut node = Node {
            name: NODE_NAME.to_owned(),
            ip,
            socket,
            log_dir,
            kubelet_args: Vec::new(),
            runtime,
            version,
            processes: Mutex::default(),
            janitor: Mutex::new(Some(janitor)),
            started_in: Duration::ZERO,
            control_plane,
            dir,
        };
        node.boot_containerd(&pause_image.0)?;
        node.import(&pause_image.1)?;

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("start a tokio runtime for", "the node", e))?;
        runtime.block_on(async {
            node.boot_scheduler(&assets)?;
            node.write_kubelet_files(&pause_image.0)?;
            node.start_kubelet().await?;
            node.run_probe_pod(&pause_image.0).await
        })?;
        node.started_in = started.elapsed();
        tracing::info!(node = %node.name, ip = %node.ip, started_in = ?node.started_in, "node ready");
        Ok(node)
    }

    fn boot_containerd(&mut self, pause_image: &str) -> Result<()> {
        let containerd = self.dir.join("containerd");
        let cni = self.dir.join("cni");
        for d in [&containerd, &cni] {
            std::fs::create_dir_all(d).map_err(|e| Error::io("create directory", d, e))?;
        }
        write(
            &cni.join("10-loopback.conflist"),
            r#"{"cniVersion": "0.4.0", "name": "loopback", "plugins": [{"type": "loopback"}]}"#,
        )?;
        let config = containerd.join("config.toml");
        let settings = ContainerdSettings {
            root: containerd.join("root"),
            state: containerd.join("state"),
            socket: self.socket.clone(),
            opt: containerd.join("opt"),
            cni_bin_dir: self.runtime.cni_bin_dir.clone(),
            cni_conf_dir: cni,
            runc: self.runtime.runc.clone(),
            pause_image: pause_image.to_owned(),
        };
        write(
            &config,
            match self.runtime.containerd_version {
                v if v.at_least(2, 4) => settings.config_v3_or_4(4),
                v if v.major >= 2 => settings.config_v3_or_4(3),
                _ => settings.config_v2(),
            },
        )?;
        // containerd starts `containerd-shim-runc-v2` from its PATH, and the shim runc: the
        // assets directory's first.
        let path = match &self.runtime.bin_dir {
            Some(dir) => {
                let mut dirs = vec![dir.clone()];
                dirs.extend(std::env::split_paths(
                    &std::env::var_os("PATH").unwrap_or_default(),
                ));
                std::env::join_paths(dirs)
                    .map_err(|e| Error::io("join PATH with", dir, std::io::Error::other(e)))?
            }
            None => std::env::var_os("PATH").unwrap_or_default(),
        };
        let process = Process::spawn_with_env(
            "containerd",
            &self.runtime.containerd,
            &[flag("--config", &config)],
            &self.log_dir,
            &[("PATH", path.as_os_str())],
        )?;
        self.processes().containerd = Some(process);

        let started = Instant::now();
        loop {
            if let Some(e) = self.processes().containerd.as_mut().and_then(Process::exited) {
                return Err(e);
            }
            if self.socket.exists()
                && self
                    .ctr()
                    .arg("version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            {
                return Ok(());
            }
            if started.elapsed() > CONTAINERD_READY_TIMEOUT {
                let process = self.processes();
                return Err(process
                    .containerd
                    .as_ref()
                    .expect("containerd was started")
                    .not_ready(
                        started.elapsed(),
                        format!("no answer on {}", self.socket.display()),
                    ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn boot_scheduler(&mut self, assets: &Assets) -> Result<()> {
        let mut args: Vec<OsString> = vec![
            flag("--kubeconfig", self.control_plane.kubeconfig_path()),
            "--leader-elect=false".into(),
            // No serving: readiness is proven by the probe Pod being scheduled.
            "--secure-port=0".into(),
        ];
        if !self.version.at_least(1, 24) {
            // The insecure port (on by default before 1.24, which removed the flag).
            args.push("--port=0".into());
        }
        let process = Process::spawn(
            "kube-scheduler",
            &assets.binary("kube-scheduler"),
            &args,
            &self.log_dir,
        )?;
        self.processes().scheduler = Some(process);
        Ok(())
    }

    fn write_kubelet_files(&mut self, pause_image: &str) -> Result<()> {
        let support = self
            .control_plane
            .node_support()
            .expect("the control plane was started for a node")
            .clone();
        let kubelet = self.dir.join("kubelet");
        std::fs::create_dir_all(&kubelet).map_err(|e| Error::io("create directory", &kubelet, e))?;
        let kubeconfig = self.dir.join("kubelet.kubeconfig");
        write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: kubelet
  user:
    token: {token}
contexts:
- name: kubelet
  context:
    cluster: local
    user: kubelet
current-context: kubelet
",
                server = self.control_plane.apiserver_url(),
                ca = support.ca_cert.display(),
                token = support.kubelet_token,
            ),
        )?;
        let [port, healthz_port] = free_ports::<2>()?;
        let config = self.dir.join("kubelet.yaml");
        write(
            &config,
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The API server reaches the kubelet on the node's own address (its InternalIP), nothing else.
address: {ip}
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
readOnlyPort: 0
cgroupDriver: cgroupfs
failSwapOn: false
makeIPTablesUtilChains: false
volumePluginDir: {kubelet}/volume-plugins
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
# Faster than the defaults, for tests: node status every 4 s, a node lease renewed every 2 s
# (the controller manager's grace period is 16 s), volume stats every 5 s (emptyDir eviction).
nodeStatusUpdateFrequency: 4s
nodeLeaseDurationSeconds: 8
syncFrequency: 10s
volumeStatsAggPeriod: 5s
# Small absolute thresholds: a crowded build machine's disk (or memory) does not cause pressure
# evictions, which would hit the tests' Pods; limits still cause evictions.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "100Mi"
  nodefs.inodesFree: "1%"
  imagefs.available: "100Mi"
evictionPressureTransitionPeriod: 5s
containerLogMaxSize: 50Mi
serializeImagePulls: false
{version_specific}"#,
                ip = self.ip,
                kubelet = kubelet.display(),
                ca = support.ca_cert.display(),
                version_specific = if self.version.at_least(1, 31) {
                    // This machine has cgroup v1, which kubelets from 1.35 on refuse unless told
                    // (the setting exists since 1.31).
                    "failCgroupV1: false\n"
                } else {
                    ""
                },
            ),
        )?;
        self.kubelet_args = vec![
            flag("--config", &config),
            flag("--kubeconfig", &kubeconfig),
            format!("--container-runtime-endpoint=unix://{}", self.socket.display()).into(),
        ];
        if !self.version.at_least(1, 24) {
            // Before 1.24 the kubelet defaulted to its built-in dockershim and managed the
            // sandbox image itself; later releases refuse both flags (containerd's
            // configuration pins the sandbox image instead).
            self.kubelet_args.extend([
                "--container-runtime=remote".into(),
                format!("--pod-infra-container-image={pause_image}").into(),
            ]);
        }
        self.kubelet_args.extend([
            format!("--hostname-override={}", self.name).into(),
            // The machine's own interface address: the kubelet refuses loopback.
            format!("--node-ip={}", self.ip).into(),
            flag("--root-dir", &kubelet),
            flag("--cert-dir", kubelet.join("pki")),
            "--v=1".into(),
        ]);
        Ok(())
    }

    /// Starts the kubelet (again, after [`Node::stop_kubelet`]) and waits until the node is
    /// Ready. Does nothing but wait if it runs.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: the kubelet keeps starting; call again to wait for it.
    pub async fn start_kubelet(&self) -> Result<()> {
        {
            let mut processes = self.processes();
            let running = processes.kubelet.as_mut().is_some_and(|k| k.exited().is_none());
            if !running {
                let assets = Assets::from_env()?;
                processes.kubelet = Some(Process::spawn_with_env(
                    "kubelet",
                    &assets.binary("kubelet"),
                    &self.kubelet_args,
                    &self.log_dir,
                    // Required: its built-in ECR credential provider otherwise asks the cloud's
                    // link-local metadata address at start.
                    &[("AWS_EC2_METADATA_DISABLED", "true".as_ref())],
                )?);
            }
        }
        let client = self.control_plane.client().await;
        let nodes = Api::<NodeObject>::all(client);
        let started = Instant::now();
        loop {
            if let Some(e) = self.processes().kubelet.as_mut().and_then(Process::exited) {
                return Err(e);
            }
            let problem = match nodes.get_opt(&self.name).await {
                Ok(Some(node)) if node_ready(&node) => return Ok(()),
                Ok(Some(_)) => "not Ready yet".to_owned(),
                Ok(None) => "not registered yet".to_owned(),
                Err(e) => format!("get node {}: {}", self.name, report(&e)),
            };
            if started.elapsed() > NODE_READY_TIMEOUT {
                let processes = self.processes();
                return Err(processes
                    .kubelet
                    .as_ref()
                    .expect("the kubelet was started")
                    .not_ready(started.elapsed(), format!("node {}: {problem}", self.name)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Kills the kubelet (SIGKILL): its containers keep running, and the node turns NotReady
    /// after the controller manager's grace period (16 s). [`Node::start_kubelet`] brings it back.
    pub fn stop_kubelet(&self) {
        if let Some(mut kubelet) = self.processes().kubelet.take() {
            kubelet.kill();
        }
    }

    /// A Pod that runs the pause image proves the whole chain: scheduler, kubelet, containerd,
    /// CNI, images.
    async fn run_probe_pod(&self, pause_image: &str) -> Result<()> {
        let client = self.control_plane.client().await;
        let pods = Api::<Pod>::namespaced(client, "default");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"generateName": "kube-leader-testenv-node-probe-"},
            "spec": {
                "hostNetwork": true,
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "pause", "image": pause_image, "imagePullPolicy": "Never"}],
            },
        }))
        .expect("a valid Pod");
        let started = Instant::now();
        // ServiceAccount admission refuses Pods until the controller made `default`'s account.
        let name = loop {
            match pods.create(&PostParams::default(), &pod).await {
                Ok(created) => break created.metadata.name.unwrap_or_default(),
                Err(e) if started.elapsed() < PROBE_POD_TIMEOUT => {
                    tracing::debug!(error = %report(&e), "probe Pod not created yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(Error::kube("create the probe Pod in default", e)),
            }
        };
        loop {
            let phase = pods
                .get(&name)
                .await
                .map_err(|e| Error::kube(format!("get Pod default/{name}"), e))?
                .status
                .and_then(|s| s.phase);
            if phase.as_deref() == Some("Running") {
                break;
            }
            if started.elapsed() > PROBE_POD_TIMEOUT {
                let processes = self.processes();
                return Err(processes
                    .kubelet
                    .as_ref()
                    .expect("the kubelet was started")
                    .not_ready(
                        started.elapsed(),
                        format!("probe Pod default/{name} is {phase:?}, not Running"),
                    ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .map_err(|e| Error::kube(format!("delete Pod default/{name}"), e))?;
        Ok(())
    }

    /// Builds an image with `./scripts/image.sh ARGS --no-load` (cached by content) and imports
    /// it into this node's containerd; returns its reference, for Pods with
    /// `imagePullPolicy: Never`. For example `node.build_image(&["node-test", "--binary", path])`.
    pub fn build_image(&self, args: &[&str]) -> Result<String> {
        let (reference, archive) = run_image_script(args)?;
        self.import(&archive)?;
        Ok(reference)
    }

    fn import(&self, archive: &Path) -> Result<()> {
        let mut command = self.ctr();
        command.args(["images", "import"]).arg(archive);
        run(command)
    }

    /// A `ctr` command for this node's containerd, in the kubelet's namespace `k8s.io`.
    #[must_use]
    pub fn ctr(&self) -> Command {
        let mut command = Command::new(&self.runtime.ctr);
        command
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"]);
        command
    }

    /// The socket of this node's containerd (`ctr --address`, `CONTAINERD_ADDRESS`).
    pub fn containerd_address(&self) -> &Path {
        &self.socket
    }

    /// The control plane: the API server, etcd, the controller manager.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address (its InternalIP): this machine's own interface address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// How long [`Node::start`] took, control plane included, until the probe Pod ran.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Where the logs of containerd, the kubelet and kube-scheduler are (beside the control
    /// plane's).
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The directory holding the containers' logs, `/var/log/pods`
    /// (`<namespace>_<pod>_<uid>/<container>/<restart>.log`).
    pub fn pod_log_dir(&self) -> &'static Path {
        Path::new("/var/log/pods")
    }

    fn processes(&self) -> MutexGuard<'_, NodeProcesses> {
        self.processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The kubelet first, so it restarts nothing; the janitor does the rest.
        self.stop_kubelet();
        drop(self.processes().scheduler.take());
        if let Some(janitor) = self.janitor.lock().unwrap_or_else(|p| p.into_inner()).take() {
            janitor.tear_down();
        }
        drop(self.processes().containerd.take());
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("ip", &self.ip)
            .field("dir", &self.dir)
            .field("control_plane", &self.control_plane)
            .field("started_in", &self.started_in)
            .finish_non_exhaustive()
    }
}

// === impl NodeJanitor ===

/// The shell process that holds the machine's node lock and tears the node down when its pipe
/// closes (`node_janitor.sh`).
#[derive(Debug)]
struct NodeJanitor {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl NodeJanitor {
    /// Starts the janitor and waits until it holds the lock (and has torn down what earlier
    /// processes left).
    fn spawn(dir: &Path) -> Result<Self> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(include_str!("node_janitor.sh"))
            .arg("kube-leader-testenv-node-janitor")
            .env("KL_NODE_BASE", BASE_DIR)
            .env("KL_NODE_DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Out of the terminal's process group, so that Ctrl-C does not end it before the
            // test binary; no parent-death signal: it must outlive the test binary.
            .process_group(0)
            .spawn()
            .map_err(|source| Error::Spawn {
                component: "node janitor",
                binary: "sh".into(),
                source,
            })?;
        let pipe = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => line,
            Err(_) => {
                eprintln!(
                    "kube-leader-testenv: waiting for the node lock {BASE_DIR}/node.lock (another node runs on this machine)"
                );
                rx.recv().unwrap_or_default()
            }
        };
        if line.trim() != "locked" {
            return Err(Error::NodeUnavailable {
                reason: format!("the node janitor did not take the lock (see {BASE_DIR}/teardown.log)"),
            });
        }
        Ok(Self { child, pipe })
    }

    /// Closes the pipe and waits until the janitor has torn the node down.
    fn tear_down(mut self) {
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

/// What containerd's configuration file says, in either of its two versions.
struct ContainerdSettings {
    root: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    opt: PathBuf,
    cni_bin_dir: PathBuf,
    cni_conf_dir: PathBuf,
    runc: PathBuf,
    pause_image: String,
}

// === impl ContainerdSettings ===

impl ContainerdSettings {
    /// Configuration version 2, for containerd 1.x (Debian bookworm's 1.6).
    fn config_v2(&self) -> String {
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
# Noise only on this machine.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # Required here: CAP_SYS_RESOURCE is not in the bounding set, and without this every sandbox
  # fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin_dir}"
    conf_dir = "{cni_conf_dir}"
"#,
            root = self.root.display(),
            state = self.state.display(),
            socket = self.socket.display(),
            opt = self.opt.display(),
            pause_image = self.pause_image,
            runc = self.runc.display(),
            cni_bin_dir = self.cni_bin_dir.display(),
            cni_conf_dir = self.cni_conf_dir.display(),
        )
    }

    /// Configuration version 3, for containerd 2.x: the CRI plugin is split into
    /// `io.containerd.cri.v1.images` (the pinned sandbox image), `io.containerd.cri.v1.runtime`
    /// (runc, CNI, the OOM score rule) and `io.containerd.grpc.v1.cri` (the streaming server).
    /// Version 4 (containerd 2.4) moves the `[grpc]` and `[ttrpc]` sections into the plugins
    /// `io.containerd.server.v1.grpc` and `io.containerd.server.v1.ttrpc`.
    fn config_v3_or_4(&self, version: u32) -> String {
        let servers = if version >= 4 {
            format!(
                r#"[plugins."io.containerd.server.v1.grpc"]
  address = "{socket}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{socket}.ttrpc"
"#,
                socket = self.socket.display()
            )
        } else {
            format!(
                r#"[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"
"#,
                socket = self.socket.display()
            )
        };
        format!(
            r#"version = {version}
root = "{root}"
state = "{state}"
# Noise only on this machine (btrfs, zfs and devmapper are not even built in).
disabled_plugins = [
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

{servers}
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_image}"

[plugins."io.containerd.cri.v1.runtime"]
  # Required here: CAP_SYS_RESOURCE is not in the bounding set, and without this every sandbox
  # fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin_dir}"]
    conf_dir = "{cni_conf_dir}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
            root = self.root.display(),
            state = self.state.display(),
            opt = self.opt.display(),
            pause_image = self.pause_image,
            runc = self.runc.display(),
            cni_bin_dir = self.cni_bin_dir.display(),
            cni_conf_dir = self.cni_conf_dir.display(),
        )
    }
}

// === helpers ===

fn node_ready(node: &NodeObject) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The first IPv4 address of an interface that is up and not loopback: the node's InternalIP
/// (the kubelet refuses loopback).
fn node_ip() -> Result<Ipv4Addr, String> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global", "up"])
        .output()
        .map_err(|e| format!("cannot run `ip` to find this machine's address: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse::<Ipv4Addr>().ok()
        })
        .filter(|ip| !ip.is_loopback())
        .ok_or_else(|| "no IPv4 address besides loopback (the kubelet's node IP cannot be loopback)".into())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|uids| uids.split_whitespace().nth(1))
            == Some("0")
    })
}

fn which(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
}

/// The repository's `scripts/image.sh`.
fn image_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testenv lives in the repository")
        .join("scripts")
        .join("image.sh")
}

/// Runs `scripts/image.sh ARGS --no-load`: the image's reference and its archive.
fn run_image_script(args: &[&str]) -> Result<(String, PathBuf)> {
    run_image_script_with_env(args, &[])
}

/// [`run_image_script`] with more environment variables.
fn run_image_script_with_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Result<(String, PathBuf)> {
    let script = image_script();
    let mut command = Command::new(&script);
    command.args(args).arg("--no-load");
    command.envs(env.iter().copied());
    let output = command.output().map_err(|e| Error::io("run", &script, e))?;
    if !output.status.success() {
        return Err(Error::Command {
            command: format!("{command:?}"),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (reference, archive) = stdout
        .trim()
        .rsplit('\n')
        .next()
        .and_then(|line| line.split_once(' '))
        .ok_or_else(|| Error::Command {
            command: format!("{command:?}"),
            status: output.status,
            stderr: format!("printed no `<reference> <archive>` line: {stdout:?}"),
        })?;
    Ok((reference.to_owned(), PathBuf::from(archive)))
}

fn run(mut command: Command) -> Result<()> {
    let output = command
        .output()
        .map_err(|e| Error::io("run", format!("{command:?}"), e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_ip_is_never_loopback() {
        if let Ok(ip) = node_ip() {
            assert!(!ip.is_loopback());
        }
    }

    #[test]
    fn the_janitor_script_takes_paths_from_the_environment_only() {
        // Teardown kills processes whose command line holds the node's directory; the janitor's
        // own command line (the script text) must hold none.
        let script = include_str!("node_janitor.sh");
        assert!(!script.contains(BASE_DIR));
    }
}
