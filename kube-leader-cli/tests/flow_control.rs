//! Flow control for kube-leader's own requests on the real control plane (API Priority and
//! Fairness on, with Kubernetes' suggested configuration): `kube-leader run
//! --elector-service-account` makes its requests as the elector's ServiceAccount by
//! impersonation, and the FlowSchema `kube-leader rbac --flow-schema` prints sends them to the
//! `leader-election` priority level; the requests of the Pod's own ServiceAccount, COMMAND's
//! (through `--fence`'s proxy too), are not sent there. The API server says how it classified
//! each request in its response headers (`X-Kubernetes-PF-FlowSchema-UID`,
//! `X-Kubernetes-PF-PriorityLevel-UID`) and counts them in its metrics
//! (`apiserver_flowcontrol_dispatched_requests_total{flow_schema, priority_level}`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use hyper::http::Request;
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    coordination::v1::Lease,
    core::v1::ServiceAccount,
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
};
use kube::{
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
    Api, Client, Config,
};
use kube_leader_testenv::ControlPlane;

const BIN: &str = env!("CARGO_BIN_EXE_kube-leader");
const LOCK: &str = "flow-lock";
const APP: &str = "app";
const ELECTOR: &str = "app-elector";
const WAIT: Duration = Duration::from_secs(60);

// === helpers ===

/// A new directory for one test's files.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "flow-control-{}-{name}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// `kube-leader ARGS`: its stdout, or a panic with its stderr.
fn kube_leader(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The kubectl of the control-plane binaries.
fn kubectl_path() -> PathBuf {
    let assets = std::env::var("KUBEBUILDER_ASSETS").expect("KUBEBUILDER_ASSETS");
    Path::new(&assets).join("kubectl")
}

/// A kubeconfig (in `dir`) that authenticates as ServiceAccount `name` of `ns` with a token
/// from a TokenRequest, as a Pod's mounted token does.
async fn service_account_kubeconfig(cp: &ControlPlane, dir: &Path, ns: &str, name: &str) -> PathBuf {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(cp.client().await, ns)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .expect("a token")
        .token;
    let path = dir.join(format!("{name}.kubeconfig"));
    fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             insecure-skip-tls-verify: true\nusers:\n- name: {name}\n  user:\n    token: {token}\n\
             contexts:\n- name: {name}\n  context:\n    cluster: c\n    user: {name}\n    \
             namespace: {ns}\ncurrent-context: {name}\n",
            cp.apiserver_url()
        ),
    )
    .unwrap();
    path
}

async fn client_of(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// How the API server classified a GET of the lock by `client` (impersonating `as_user`
/// where given): the UIDs of the FlowSchema and priority level it answers with.
async fn classified(client: &Client, ns: &str, as_user: Option<&str>) -> (String, String) {
    let mut request = Request::get(format!(
        "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{LOCK}"
    ));
    if let Some(user) = as_user {
        request = request.header("Impersonate-User", user);
    }
    let response = client
        .send(request.body(kube::client::Body::empty()).unwrap())
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no {name}: {response:?}"))
    };
    (
        header("X-Kubernetes-PF-FlowSchema-UID"),
        header("X-Kubernetes-PF-PriorityLevel-UID"),
    )
}

/// The API server's count of requests it dispatched through FlowSchema `flow_schema` to
/// priority level `level` (`apiserver_flowcontrol_dispatched_requests_total`).
async fn dispatched(admin: &Client, flow_schema: &str, level: &str) -> u64 {
    let text = admin
        .request_text(Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
        .filter(|l| {
            l.contains(&format!("flow_schema=\"{flow_schema}\""))
                && l.contains(&format!("priority_level=\"{level}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Deletes the cluster-scoped FlowSchema when the test ends, however it ends.
struct DeleteFlowSchema<'a>(&'a ControlPlane, String);

impl Drop for DeleteFlowSchema<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .kubectl()
            .args(["delete", "flowschema", &self.1, "--ignore-not-found"])
            .output();
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// === the tests ===

/// The flags of candidate `c1` for the Lease LOCK in `ns`, with `kubeconfig`'s identity, as
/// the elector's ServiceAccount.
fn candidate_flags<'a>(ns: &'a str, kubeconfig: &'a Path) -> [&'a str; 12] {
    [
        "--strategy",
        "lease",
        "--lock",
        LOCK,
        "--namespace",
        ns,
        "--identity",
        "c1",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--elector-service-account",
        ELECTOR,
    ]
}

/// The whole path: the printed RBAC and FlowSchema applied, a `kube-leader run` candidate with
/// `--elector-service-account` and `--fence` on ServiceAccount `app`'s token. Its Lease
/// requests go to `leader-election` through the FlowSchema; a request of `app` itself, and
/// COMMAND's through the fencing proxy, go where any ServiceAccount's go.
#[tokio::test(flavor = "multi_thread")]
async fn the_electors_requests_go_to_leader_election_and_commands_do_not() {
    let cp = ControlPlane::shared();
    let namespace = cp.namespace().await;
    let ns = namespace.name();
    let admin = cp.client().await;
    let dir = scratch_dir("run");
    let rbac_args = [
        "rbac",
        "--strategy",
        "lease",
        "--lock",
        LOCK,
        "--namespace",
        ns,
        "--service-account",
        APP,
        "--elector-service-account",
        ELECTOR,
    ];
    let rbac = kube_leader(&[&rbac_args[..], &["--fence"]].concat());
    cp.kubectl_with_stdin(&["apply", "-f", "-"], &rbac)
        .unwrap_or_else(|e| panic!("{e}\n{rbac}"));
    let flow_schema = kube_leader(&[&rbac_args[..], &["--flow-schema"]].concat());
    let name = format!("{ELECTOR}-{ns}");
    let _delete = DeleteFlowSchema(cp, name.clone());
    cp.kubectl_with_stdin(&["apply", "-f", "-"], &flow_schema)
        .unwrap_or_else(|e| panic!("{e}\n{flow_schema}"));
    let ours = Api::<FlowSchema>::all(admin.clone()).get(&name).await.unwrap();
    let ours = ours.metadata.uid.unwrap();
    let leader_election = Api::<PriorityLevelConfiguration>::all(admin.clone())
        .get("leader-election")
        .await
        .expect("Kubernetes' suggested priority level leader-election")
        .metadata
        .uid
        .unwrap();
    let service_accounts = Api::<FlowSchema>::all(admin.clone())
        .get("service-accounts")
        .await
        .expect("Kubernetes' suggested FlowSchema service-accounts")
        .metadata
        .uid
        .unwrap();

    // Request by request: as the elector (impersonated by `app`, as kube-leader does), through
    // our FlowSchema into leader-election, once the API server has read it; as `app` itself,
    // COMMAND's identity, where every ServiceAccount's requests go.
    let kubeconfig = service_account_kubeconfig(cp, &dir, ns, APP).await;
    let app = client_of(&kubeconfig).await;
    let elector_user = format!("system:serviceaccount:{ns}:{ELECTOR}");
    let mut seen = (String::new(), String::new());
    for _ in 0..100 {
        seen = classified(&app, ns, Some(&elector_user)).await;
        if seen.0 == ours {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, (ours.clone(), leader_election.clone()), "as the elector");
    let (schema, level) = classified(&app, ns, None).await;
    assert_eq!(schema, service_accounts, "as the Pod's ServiceAccount");
    assert_ne!(level, leader_election, "as the Pod's ServiceAccount");

    // A candidate: kube-leader's requests as the elector; COMMAND asks for the lock through
    // the fencing proxy (as `app`, with its fencing token) and keeps the answer's headers.
    let before = dispatched(&admin, &name, "leader-election").await;
    let out = dir.join("command.out");
    let script = format!(
        "{kubectl} -v=8 get lease {LOCK} -n {ns} > /dev/null 2> {out}.tmp; mv {out}.tmp {out}; exec sleep 600",
        kubectl = kubectl_path().display(),
        out = out.display(),
    );
    let log = dir.join("run.log");
    let child = Command::new(BIN)
        .arg("run")
        .args(candidate_flags(ns, &kubeconfig))
        .args([
            "--fence",
            "--fence-user",
            &format!("system:serviceaccount:{ns}:{APP}"),
            "--lease-duration",
            "4s",
            "--renew-deadline",
            "3s",
            "--retry-period",
            "500ms",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let leases = Api::<Lease>::namespaced(admin.clone(), ns);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let holder = leases
            .get_opt(LOCK)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity);
        if holder.as_deref() == Some("c1") && out.exists() {
            break;
        }
        assert!(
            child.0.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline,
            "no leader c1 whose COMMAND asked (holder {holder:?}); log: {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few renewals (every 500 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = dispatched(&admin, &name, "leader-election").await;
    println!("dispatched through {name} into leader-election: {before} before the candidate, {after} after");
    assert!(
        after >= before + 5,
        "the candidate's Lease requests (create or take, renewals every 500 ms) did not go through \
         {name} into leader-election: {before} before, {after} after; log: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );

    // `kube-leader status` run by COMMAND (its environment names the elector) reads the lock
    // as the elector: `app` itself may not.
    let status = Command::new(BIN)
        .args([
            "status",
            "--strategy",
            "lease",
            "--lock",
            LOCK,
            "--namespace",
            ns,
            "-o",
            "json",
        ])
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .env("KUBE_LEADER_ELECTOR_SERVICE_ACCOUNT", ELECTOR)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && stdout.contains("\"holder\": \"c1\""),
        "{status:?}"
    );

    // COMMAND's request went as `app`, with the fencing headers: not in leader-election.
    let command = fs::read_to_string(&out).unwrap();
    assert!(
        command.contains(&service_accounts) && !command.contains(&ours),
        "COMMAND's request through the fencing proxy was not classified as `app`'s \
         (service-accounts {service_accounts}, ours {ours}):\n{command}"
    );
    drop(child);
    let _ = fs::remove_dir_all(&dir);
}

/// Without `impersonate` on the elector, `kube-leader run` stops at once (exit code 123) and
/// says which permission is missing and which command prints the Role that grants it.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_impersonation_names_the_permission_and_the_rbac_command() {
    let cp = ControlPlane::shared();
    let namespace = cp.namespace().await;
    let ns = namespace.name();
    let dir = scratch_dir("refused");
    // The ServiceAccounts only: no Role lets `app` impersonate the elector.
    for sa in [APP, ELECTOR] {
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(sa.into()),
                ..Default::default()
            },
            ..ServiceAccount::default()
        };
        Api::<ServiceAccount>::namespaced(cp.client().await, ns)
            .create(&PostParams::default(), &account)
            .await
            .unwrap();
    }
    let kubeconfig = service_account_kubeconfig(cp, &dir, ns, APP).await;
    for command in ["run", "elect"] {
        let mut args = vec![command];
        args.extend(candidate_flags(ns, &kubeconfig));
        args.extend(["--connect-timeout", "10s"]);
        if command == "run" {
            args.extend(["--", "true"]);
        } else {
            args.extend(["--status-addr", "127.0.0.1:0"]);
        }
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{command}: {stderr}");
        assert_eq!(out.status.code(), Some(123), "{command}: {stderr}");
        for needed in [
            format!("missing permission: impersonate serviceaccounts {ELECTOR} in namespace {ns}"),
            format!("for system:serviceaccount:{ns}:{APP}"),
            format!(
                "`kube-leader rbac --strategy lease --lock {LOCK} --namespace {ns} --service-account \
                 {APP} --elector-service-account {ELECTOR}` prints the Role that grants it"
            ),
        ] {
            assert!(stderr.contains(&needed), "{command}: no {needed:?} in: {stderr}");
        }
    }
    let _ = fs::remove_dir_all(&dir);
}
