//! Least privilege and secrets (issue 5): the Role that `kube-leader rbac` prints is exactly
//! what the election needs, a missing permission is named, bearer tokens never reach the logs,
//! and the status server listens on 127.0.0.1.
//!
//! The CLI tests show that a restricted user bound to the printed Role elects with either
//! strategy (`kube-leader-cli/tests/cli.rs`, `rbac_*_role_is_accepted_and_sufficient_*`). Here,
//! for each permission of the printed Role in turn, a user gets the Role without that one
//! permission, and the path that needs it is taken: the election fails with
//! [`Error::Forbidden`] naming the permission, or, for a permission only some paths need, the
//! test says which path and shows what happens without it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use futures::future::join_all;
use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec},
    coordination::v1::{Lease, LeaseSpec},
    core::v1::{ConfigMap, Event, Pod},
    rbac::v1::{PolicyRule, Role},
};
use kube::{
    api::{ListParams, ObjectMeta, PostParams},
    Api, Client,
};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{
    internal::labels::FENCING_TOKEN_ANNOTATION, internal::Environment, Error, ForLife, LeaseElector, LockRef,
    LossReason,
};
use kube_leader_testenv::{bind_role, create_pod, set_pod_phase, ControlPlane, Fault, FaultProxy, ADMIN};
use tokio_util::sync::CancellationToken;

/// Bound on anything that should happen soon (a loaded 2-core machine).
const SOON: Duration = Duration::from_secs(30);

fn kube_leader_bin() -> PathBuf {
    kube_leader_e2e::kube_leader_bin_beside(env!("CARGO_BIN_EXE_chaos-candidate"))
}

/// `kube-leader rbac --strategy STRATEGY --lock LOCK --namespace NS`.
fn printed_rbac(strategy: &str, lock: &str, ns: &str) -> String {
    let out = Command::new(kube_leader_bin())
        .args(["rbac", "--strategy", strategy, "--lock", lock, "--namespace", ns])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "kube-leader rbac: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn kubectl_apply(cp: &ControlPlane, yaml: &str) {
    cp.kubectl_with_stdin(&["apply", "-f", "-"], yaml)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Applies the Roles `kube-leader rbac` prints for each of `locks` (with kubectl, as a user
/// would) and reads their rules back from the API server.
async fn printed_roles(
    cp: &ControlPlane,
    admin: &Client,
    ns: &str,
    strategy: &str,
    locks: &[String],
) -> Vec<Vec<PolicyRule>> {
    let yaml: Vec<String> = locks.iter().map(|l| printed_rbac(strategy, l, ns)).collect();
    let yaml = yaml.join("\n---\n");
    tokio::task::block_in_place(|| kubectl_apply(cp, &yaml));
    let roles: Api<Role> = Api::namespaced(admin.clone(), ns);
    let mut out = Vec::new();
    for lock in locks {
        let role = roles
            .get(&format!("kube-leader-{strategy}-{lock}"))
            .await
            .unwrap();
        out.push(role.rules.unwrap_or_default());
    }
    out
}

/// Every (rule, verb) of a Role.
fn permissions(rules: &[PolicyRule]) -> Vec<(usize, String)> {
    rules
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.verbs.iter().map(move |v| (i, v.clone())))
        .collect()
}

/// `rules` without `verb` in rule `rule` (the rule goes if it has no verb left).
fn without(rules: &[PolicyRule], rule: usize, verb: &str) -> Vec<PolicyRule> {
    rules
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let mut r = r.clone();
            if i == rule {
                r.verbs.retain(|v| v != verb);
            }
            (!r.verbs.is_empty()).then_some(r)
        })
        .collect()
}

/// The resource as kube-leader's errors name it: `leases.coordination.k8s.io`, `configmaps`.
/// What the test calls the rule's resource: `candidate registrations` for the rule of the
/// candidates' registrations (Leases, namespace-wide, with list), else `resource.group`.
fn resource_of(rule: &PolicyRule) -> String {
    let leases = rule
        .resources
        .as_ref()
        .is_some_and(|r| r == &["leases".to_string()]);
    let unnamed = rule.resource_names.as_ref().is_none_or(|n| n.is_empty());
    if leases && unnamed && rule.verbs.iter().any(|v| v == "list") {
        return REGISTRATIONS.into();
    }
    let resource = rule.resources.as_ref().unwrap()[0].clone();
    match rule.api_groups.as_ref().map(|g| g[0].as_str()) {
        Some("") | None => resource,
        Some(group) => format!("{resource}.{group}"),
    }
}

/// The rule of the candidates' registrations (`--successor youngest`).
const REGISTRATIONS: &str = "candidate registrations";

/// A candidate without `verb` on its registrations: it elects, renews and releases as before
/// (the registration is an optimisation: warned once); only the preference is lost.
async fn registration_without(
    candidate: impl std::future::Future<Output = kube_leader::Result<kube_leader::Leadership>>,
    verb: &str,
) -> String {
    let l = tokio::time::timeout(SOON, candidate)
        .await
        .expect("no answer")
        .unwrap_or_else(|e| panic!("elects without {verb} on the registrations: {e}"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(l.is_leader());
    l.release().await.unwrap();
    "elects, renews, releases; only the preferred successor of a rollout needs it (warned once)".into()
}

/// Waits until the RBAC authorizer lets `client` do the first thing `rules` allow.
async fn wait_for_rbac(client: &Client, ns: &str, rules: &[PolicyRule]) {
    let Some(rule) = rules.first() else { return };
    let review = SelfSubjectAccessReview {
        metadata: ObjectMeta::default(),
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.into()),
                verb: Some(rule.verbs[0].clone()),
                group: rule.api_groups.as_ref().map(|g| g[0].clone()),
                resource: Some(rule.resources.as_ref().unwrap()[0].clone()),
                name: rule.resource_names.as_ref().map(|n| n[0].clone()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        status: None,
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let allowed = api
            .create(&PostParams::default(), &review)
            .await
            .ok()
            .and_then(|r| r.status)
            .is_some_and(|s| s.allowed);
        if allowed {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Role never took effect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that `result` is the Forbidden error naming `verb resource in namespace ns`.
fn assert_names<T: std::fmt::Debug>(
    result: kube_leader::Result<T>,
    verb: &str,
    resource: &str,
    ns: &str,
) -> String {
    let e = result.expect_err("the election must fail without the permission");
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::Forbidden { verb: v, resource: r, .. } if v == verb && r == resource),
        "without {verb} {resource}: not the Forbidden error naming it: {e:?}"
    );
    let want = format!("missing permission: {verb} {resource} in namespace {ns}");
    assert!(msg.contains(&want), "{msg:?} does not contain {want:?}");
    // The fix, usable by a user of the published crate: the command that prints the Role, and
    // a stable URL, never a path in this repository.
    assert!(
        msg.contains("kube-leader rbac --strategy"),
        "{msg:?} names no fix"
    );
    assert!(!msg.contains(" deploy/"), "{msg:?} points at a repository path");
    want
}

/// A restricted user bound to `rules`, and its client.
async fn user_with(cp: &ControlPlane, admin: &Client, ns: &str, rules: Vec<PolicyRule>) -> (String, Client) {
    let user = cp.unused_user();
    bind_role(admin, ns, &user, rules.clone()).await.unwrap();
    let client = cp.user_client(&user).await;
    wait_for_rbac(&client, ns, &rules).await;
    (user, client)
}

// === Lease ===

fn lease_elector(client: Client, ns: &str, lock: &str) -> LeaseElector {
    LeaseElector::new(client, lock)
        .namespace(ns)
        .identity(format!("{lock}-candidate"))
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(Duration::from_secs(2))
                .renew_deadline(Duration::from_secs(1))
                .retry_period(Duration::from_millis(200)),
        )
}

/// A Lease nobody holds, as an earlier candidate that released it would leave it.
async fn free_lease(admin: &Client, ns: &str, name: &str) {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            lease_duration_seconds: Some(1),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

/// What happens to a Lease candidate without `verb` on `resource` (Leases, or Events).
async fn lease_without(
    admin: Client,
    client: Client,
    ns: String,
    lock: String,
    resource: String,
    verb: String,
) -> String {
    const RESOURCE: &str = "leases.coordination.k8s.io";
    // The registrations' namespace-wide list and watch are the lock watch's too.
    let resource = match (resource.as_str(), verb.as_str()) {
        (REGISTRATIONS, "list" | "watch") => RESOURCE.to_string(),
        (REGISTRATIONS, _) => {
            let elector = lease_elector(client, &ns, &lock);
            let elect = async move { elector.become_leader(&CancellationToken::new()).await };
            return registration_without(elect, &verb).await;
        }
        _ => resource,
    };
    if (resource.as_str(), verb.as_str()) == ("events", "create") {
        let l = lease_elector(client, &ns, &lock)
            .become_leader(&CancellationToken::new())
            .await
            .expect("elects without create events");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(l.is_leader());
        l.release().await.unwrap();
        assert_eq!(
            events_about(&admin, &ns, &lock).await,
            0,
            "an Event without the right"
        );
        return "elects, renews, releases; only the best-effort LeaderElection Events need it \
                (warned once, no Event)"
            .into();
    }
    assert_eq!(resource, RESOURCE, "a resource the printed Role should not have");
    let shutdown = CancellationToken::new();
    let elect = |client: Client| {
        let elector = lease_elector(client, &ns, &lock);
        let shutdown = shutdown.clone();
        async move {
            tokio::time::timeout(SOON, elector.become_leader(&shutdown))
                .await
                .expect("no answer")
        }
    };
    let lock_ref = LockRef::new(ns.clone(), lock.clone()).unwrap();
    match verb.as_str() {
        "create" => {
            let named = assert_names(elect(client.clone()).await, "create", RESOURCE, &ns);
            // Only the first candidate, which finds no Lease, needs it.
            free_lease(&admin, &ns, &lock).await;
            let l = elect(client)
                .await
                .expect("takes over an existing Lease without create");
            l.release().await.unwrap();
            format!("{named}; needed only to create the Lease when it does not exist")
        }
        "get" => {
            let l = elect(client.clone()).await.expect("elects without get");
            tokio::time::sleep(Duration::from_millis(2500)).await;
            assert!(l.is_leader(), "renewals need no get");
            let named = assert_names(
                kube_leader::internal::leader::lease_current(client, &lock_ref).await,
                "get",
                RESOURCE,
                &ns,
            );
            l.release().await.unwrap();
            format!(
                "elects and renews; {named} from `kube-leader status` (current_leader), and the re-read \
                 after a 409 on a renewal or release needs it"
            )
        }
        "list" => assert_names(elect(client).await, "list", RESOURCE, &ns),
        "watch" => {
            // A free lock is taken after the initial list alone; waiting for a held one needs
            // the watch.
            let holder = lease_elector(admin, &ns, &lock).identity("holder");
            let held = holder.become_leader(&shutdown).await.unwrap();
            let named = assert_names(elect(client).await, "watch", RESOURCE, &ns);
            held.release().await.unwrap();
            format!(
                "{named} while another candidate holds the Lease; a candidate that finds it free \
                 leads (the initial list suffices; the leader's renewals need no watch)"
            )
        }
        "update" => {
            free_lease(&admin, &ns, &lock).await;
            let named = assert_names(elect(client.clone()).await, "update", RESOURCE, &ns);
            // On a fresh lock it creates the Lease and leads, but cannot renew: fail-stop.
            Api::<Lease>::namespaced(admin, &ns)
                .delete(&lock, &Default::default())
                .await
                .unwrap();
            let l = elect(client).await.expect("creates the Lease");
            let reason = tokio::time::timeout(SOON, l.lost()).await.expect("loses");
            assert!(matches!(reason, LossReason::RenewDeadline { .. }), "{reason:?}");
            format!(
                "{named} when taking over; a candidate that creates the Lease leads until its renew \
                 deadline (renewals refused, warned)"
            )
        }
        other => panic!("a verb the printed Role should not have: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_role_each_permission_is_needed_and_named() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let full = printed_roles(cp, &admin, ns.name(), "lease", &["lp-full".into()]).await;
    let perms = permissions(&full[0]);
    let locks: Vec<String> = (0..perms.len()).map(|i| format!("lp-{i}")).collect();
    let roles = printed_roles(cp, &admin, ns.name(), "lease", &locks).await;

    let mut runs = Vec::new();
    // With the whole Role: elects and renews past several lease durations.
    let (_, client) = user_with(cp, &admin, ns.name(), full[0].clone()).await;
    let baseline = async {
        let shutdown = CancellationToken::new();
        let l = lease_elector(client, ns.name(), "lp-full")
            .become_leader(&shutdown)
            .await
            .expect("elects with the printed Role");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(l.is_leader());
        l.release().await.unwrap();
        "whole Role: elects, renews, releases".to_string()
    };
    for (i, (rule, verb)) in perms.iter().enumerate() {
        let rules = without(&roles[i], *rule, verb);
        let (_, client) = user_with(cp, &admin, ns.name(), rules).await;
        let resource = resource_of(&roles[i][*rule]);
        let run = lease_without(
            admin.clone(),
            client,
            ns.name().into(),
            locks[i].clone(),
            resource.clone(),
            verb.clone(),
        );
        runs.push(async move { format!("without {verb} {resource}: {}", run.await) });
    }
    let (first, rest) = tokio::join!(baseline, join_all(runs));
    eprintln!(
        "lease, the Role of `kube-leader rbac`:\n  {first}\n  {}",
        rest.join("\n  ")
    );
}

// === leader for life ===

fn for_life_candidate(client: Client, ns: &str, lock: &str, pod: &str) -> ForLife {
    ForLife::new(client, lock)
        .namespace(ns)
        .identity(pod)
        .environment(Environment::default())
        .config(
            kube_leader::ForLifeConfig::default()
                .backoff_cap(Duration::from_secs(2))
                .api_timeout(Duration::from_secs(5)),
        )
}

/// The lock `lock` held by the Pod `holder` (created here), elected with the admin's rights.
/// With `evicted`, that Pod is then `Failed`/`Evicted`.
async fn held_by(admin: &Client, ns: &str, lock: &str, holder: &str, evicted: bool) {
    // A short grace: an evicted leader is taken over only once its grace (+ 2 s) has passed
    // since its end was seen (its containers may still run until then).
    let mut pod = kube_leader_testenv::pod(holder);
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(2);
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&Default::default(), &pod)
        .await
        .unwrap();
    let l = for_life_candidate(admin.clone(), ns, lock, holder)
        .become_leader(&CancellationToken::new())
        .await
        .unwrap();
    // Dropping the handle leaves the lock to the Pod.
    drop(l);
    if evicted {
        set_pod_phase(admin, ns, holder, "Failed", Some("Evicted"))
            .await
            .unwrap();
    }
}

async fn events_about(admin: &Client, ns: &str, lock: &str) -> usize {
    Api::<Event>::namespaced(admin.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={lock}")))
        .await
        .unwrap()
        .items
        .len()
}

/// What happens to a leader-for-life candidate without `verb` on `resource`.
async fn for_life_without(
    admin: Client,
    client: Client,
    ns: String,
    lock: String,
    resource: String,
    verb: String,
) -> String {
    let me = format!("{lock}-me");
    let old = format!("{lock}-old");
    create_pod(&admin, &ns, &me).await.unwrap();
    if resource == REGISTRATIONS {
        let elector = for_life_candidate(client, &ns, &lock, &me);
        return registration_without(
            async move { elector.become_leader(&CancellationToken::new()).await },
            &verb,
        )
        .await;
    }
    let elect = || {
        let elector = for_life_candidate(client.clone(), &ns, &lock, &me);
        async move {
            tokio::time::timeout(SOON, elector.become_leader(&CancellationToken::new()))
                .await
                .expect("no answer")
        }
    };
    let lock_ref = LockRef::new(ns.clone(), lock.clone()).unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    match (resource.as_str(), verb.as_str()) {
        ("configmaps", "get") => {
            let _l = elect().await.expect("elects without get configmaps");
            let named = assert_names(
                kube_leader::internal::leader::for_life_current(client.clone(), &lock_ref).await,
                "get",
                "configmaps",
                &ns,
            );
            format!(
                "elects; {named} from `kube-leader status` (current_leader), and the fallback re-read \
                 (after a lost create race, while a watch fails) needs it"
            )
        }
        ("configmaps", "list" | "create") | ("pods", "get") => {
            assert_names(elect().await, &verb, &resource, &ns)
        }
        ("configmaps", "watch") => {
            held_by(&admin, &ns, &lock, &old, false).await;
            let named = assert_names(elect().await, "watch", "configmaps", &ns);
            format!(
                "{named} while another Pod holds the lock; a candidate that finds no lock leads \
                 (the initial list suffices) and then reads its lock with GET instead (warned)"
            )
        }
        ("configmaps", "update") => {
            let _l = elect().await.expect("elects without update configmaps");
            tokio::time::sleep(Duration::from_secs(2)).await;
            let cm = configmaps.get(&lock).await.unwrap();
            assert!(
                !cm.metadata
                    .annotations
                    .unwrap_or_default()
                    .contains_key(FENCING_TOKEN_ANNOTATION),
                "the fencing token was written without update"
            );
            "elects; only storing the fencing token in the new lock needs it (warned; readers fall \
             back to the lock's resourceVersion, the same number while nobody writes the lock)"
                .into()
        }
        ("configmaps", "delete") => {
            held_by(&admin, &ns, &lock, &old, true).await;
            let named = assert_names(elect().await, "delete", "configmaps", &ns);
            format!("{named} to remove the stale lock of an evicted leader; release() needs it too")
        }
        ("pods", "list" | "watch") => {
            held_by(&admin, &ns, &lock, &old, false).await;
            let named = assert_names(elect().await, &verb, "pods", &ns);
            format!("{named} while another Pod leads (watching the leader Pod)")
        }
        ("pods", "delete") => {
            held_by(&admin, &ns, &lock, &old, true).await;
            let _l = elect()
                .await
                .expect("takes over from an evicted leader without delete pods");
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(
                pods.get_opt(&old).await.unwrap().is_some(),
                "the evicted Pod was deleted"
            );
            "elects (deletes the evicted leader's lock); only deleting the evicted leader's Pod \
             (DeadLeaderPod::DeleteEvicted) needs it: the Pod stays (warned)"
                .into()
        }
        ("events", "create") => {
            let _l = elect().await.expect("elects without create events");
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(
                events_about(&admin, &ns, &lock).await,
                0,
                "an Event was recorded without the right"
            );
            "elects; only the best-effort LeaderElection Events on the lock need it (warned, no Event)".into()
        }
        other => panic!("a permission the printed Role should not have: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn for_life_role_each_permission_is_needed_and_named() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let full = printed_roles(cp, &admin, ns.name(), "for-life", &["fl-full".into()]).await;
    let perms = permissions(&full[0]);
    let locks: Vec<String> = (0..perms.len()).map(|i| format!("fl-{i}")).collect();
    let roles = printed_roles(cp, &admin, ns.name(), "for-life", &locks).await;

    let (_, client) = user_with(cp, &admin, ns.name(), full[0].clone()).await;
    let baseline = {
        let (admin, ns) = (admin.clone(), ns.name().to_string());
        async move {
            create_pod(&admin, &ns, "fl-full-me").await.unwrap();
            let _l = for_life_candidate(client, &ns, "fl-full", "fl-full-me")
                .become_leader(&CancellationToken::new())
                .await
                .expect("elects with the printed Role");
            let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
            let deadline = tokio::time::Instant::now() + SOON;
            loop {
                let cm = configmaps.get("fl-full").await.unwrap();
                let stored = cm
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .contains_key(FENCING_TOKEN_ANNOTATION);
                if stored && events_about(&admin, &ns, "fl-full").await > 0 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no fencing token or no Event"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            "whole Role: elects, stores the fencing token, records the Event".to_string()
        }
    };
    let mut runs = Vec::new();
    for (i, (rule, verb)) in perms.iter().enumerate() {
        let rules = without(&roles[i], *rule, verb);
        let (_, client) = user_with(cp, &admin, ns.name(), rules).await;
        let resource = resource_of(&roles[i][*rule]);
        let run = for_life_without(
            admin.clone(),
            client,
            ns.name().into(),
            locks[i].clone(),
            resource.clone(),
            verb.clone(),
        );
        runs.push(async move { format!("without {verb} {resource}: {}", run.await) });
    }
    let (first, rest) = tokio::join!(baseline, join_all(runs));
    eprintln!(
        "leader for life, the Role of `kube-leader rbac`:\n  {first}\n  {}",
        rest.join("\n  ")
    );
}

// === secrets and the status server ===

/// A process whose stdout and stderr go to one file.
struct Logged {
    child: std::process::Child,
    log: PathBuf,
}

impl Logged {
    fn spawn(mut command: Command, log: PathBuf) -> Self {
        let out = fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        if self.child.try_wait().unwrap().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kube-leader run` with debug logs in JSON.
fn cli(kubeconfig: &Path, args: &[&str], log: PathBuf) -> Logged {
    let mut command = Command::new(kube_leader_bin());
    command
        .args(["run", "--log-format", "json"])
        .args(args)
        .args(["--", env!("CARGO_BIN_EXE_chaos-candidate"), "child", "200"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "debug")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE");
    Logged::spawn(command, log)
}

/// A library candidate with debug logs.
fn library(kubeconfig: &Path, ns: &str, lock: &str, id: &str, log: PathBuf) -> Logged {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chaos-candidate"));
    command
        .args([
            "lease",
            &kubeconfig.display().to_string(),
            ns,
            lock,
            id,
            "2000",
            "1000",
            "200",
            "200",
        ])
        .env("RUST_LOG", "debug");
    Logged::spawn(command, log)
}

#[tokio::test(flavor = "multi_thread")]
async fn bearer_tokens_never_reach_the_logs_and_the_status_server_is_on_loopback() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let dir = std::env::temp_dir().join(format!("kube-leader-secrets-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();

    // A user with the printed Roles of both strategies, and one with nothing.
    let lease_rules = printed_roles(cp, &admin, ns.name(), "lease", &["sec".into()]).await;
    let fl_rules = printed_roles(cp, &admin, ns.name(), "for-life", &["sec-fl".into()]).await;
    let (user, _) = user_with(cp, &admin, ns.name(), lease_rules[0].clone()).await;
    bind_role(&admin, ns.name(), &user, fl_rules[0].clone())
        .await
        .unwrap();
    let nobody = cp.unused_user();
    create_pod(&admin, ns.name(), "sec-pod").await.unwrap();
    let kubeconfig = cp.user_kubeconfig_path(&user).unwrap();
    // Connection errors too: a proxy that resets every connection.
    let proxy = FaultProxy::to_apiserver(cp).unwrap();
    proxy.set(Fault::Reset);
    let reset_kubeconfig = proxy.write_kubeconfig(cp, &user).unwrap();

    let n = ns.name();
    let mut procs = vec![
        cli(
            kubeconfig,
            &[
                "--strategy",
                "lease",
                "--lock",
                "sec",
                "--namespace",
                n,
                "--identity",
                "a",
                "--status-addr",
                "127.0.0.1:0",
                "--lease-duration",
                "2s",
                "--renew-deadline",
                "1s",
                "--retry-period",
                "200ms",
            ],
            dir.join("cli-lease.log"),
        ),
        cli(
            kubeconfig,
            &[
                "--strategy",
                "for-life",
                "--lock",
                "sec-fl",
                "--namespace",
                n,
                "--identity",
                "sec-pod",
                "--renew-deadline",
                "1s",
                "--retry-period",
                "200ms",
            ],
            dir.join("cli-for-life.log"),
        ),
        cli(
            cp.user_kubeconfig_path(&nobody).unwrap(),
            &[
                "--strategy",
                "lease",
                "--lock",
                "sec",
                "--namespace",
                n,
                "--identity",
                "c",
            ],
            dir.join("cli-forbidden.log"),
        ),
        cli(
            &reset_kubeconfig,
            &[
                "--strategy",
                "lease",
                "--lock",
                "sec",
                "--namespace",
                n,
                "--identity",
                "d",
                "--connect-timeout",
                "3s",
            ],
            dir.join("cli-unreachable.log"),
        ),
        library(kubeconfig, n, "sec", "b", dir.join("library.log")),
        library(
            &reset_kubeconfig,
            n,
            "sec",
            "e",
            dir.join("library-unreachable.log"),
        ),
    ];

    // The status server: asked for with `127.0.0.1:0`, it listens on loopback (`:0` would be
    // every interface).
    let deadline = std::time::Instant::now() + SOON;
    let addr: std::net::SocketAddr = loop {
        let found = procs[0].text().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["message"] == "status server listening").then(|| v["addr"].as_str()?.parse().ok())?
        });
        if let Some(addr) = found {
            break addr;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no status server: {}",
            procs[0].text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        addr.ip().is_loopback(),
        "--status-addr 127.0.0.1:0 listens on {addr}"
    );
    // Both lease candidates run; let renewals, watches and errors happen for a while.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for p in &mut procs {
        p.stop();
    }
    let forbidden = procs[2].text();
    assert!(
        forbidden.contains("missing permission"),
        "the user without a Role is told what is missing: {forbidden}"
    );
    assert!(
        !procs[1].text().contains("status server listening"),
        "a status server without --status-addr"
    );

    let tokens = [
        (user.as_str(), cp.user_token(&user).unwrap()),
        (nobody.as_str(), cp.user_token(&nobody).unwrap()),
        (ADMIN, cp.user_token(ADMIN).unwrap()),
    ];
    for p in &procs {
        let text = p.text();
        let debug_lines = text
            .lines()
            .filter(|l| l.contains("DEBUG") || l.contains("\"level\":\"DEBUG\""))
            .count();
        assert!(debug_lines > 0, "{}: no debug logging", p.log.display());
        for (who, token) in tokens {
            assert!(
                !text.contains(token),
                "{}: the bearer token of {who} is logged",
                p.log.display()
            );
        }
        assert!(
            !text.to_ascii_lowercase().contains("authorization: bearer"),
            "{}: an Authorization header is logged",
            p.log.display()
        );
        eprintln!(
            "{}: {} lines, {debug_lines} at debug, no token",
            p.log.display(),
            text.lines().count()
        );
    }
    let _ = fs::remove_dir_all(dir);
}
