//! The Lease strategy against a real control plane.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    api::{Patch, PatchParams, PostParams},
    Api, Client,
};
use kube_leader::{internal::LeaseRecord, Error, Leadership, LeaseElector, LossReason};
use kube_leader_e2e::{init_tracing, short_lease_elector as elector, wait_for};
use kube_leader_testenv::ControlPlane;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

async fn record(client: &Client, ns: &str, lease: &str) -> LeaseRecord {
    let l = Api::<Lease>::namespaced(client.clone(), ns)
        .get(lease)
        .await
        .unwrap();
    LeaseRecord::from_lease(&l)
}

/// Starts `n` candidates; returns their join handles yielding the Leadership.
fn spawn_candidates(
    client: &Client,
    ns: &str,
    lease: &str,
    ids: &[&str],
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<kube_leader::Result<Leadership>>> {
    ids.iter()
        .map(|id| {
            let e = elector(client, ns, lease, id);
            let s = shutdown.clone();
            tokio::spawn(async move { e.become_leader(&s).await })
        })
        .collect()
}

#[tokio::test]
async fn one_leader_graceful_handover_and_crash_takeover() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let mut pending = spawn_candidates(&client, ns.name(), "lock", &["a", "b", "c"], &shutdown);

    // Exactly one wins.
    let (first, _, rest) = futures::future::select_all(pending).await;
    let first = first.unwrap().unwrap();
    pending = rest;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        pending.iter().all(|h| !h.is_finished()),
        "a second candidate became leader"
    );
    let rec = record(&client, ns.name(), "lock").await;
    assert_eq!(rec.holder.as_deref(), Some(first.term().identity.as_str()));
    assert_eq!(rec.transitions, 0);
    assert!(first.fencing_token() > 0, "a resourceVersion");

    // Graceful release: another takes over at once.
    let t = Instant::now();
    let token_1 = first.fencing_token();
    first.release().await.unwrap();
    let (second, _, rest) = futures::future::select_all(pending).await;
    let handover = t.elapsed();
    let second = second.unwrap().unwrap();
    pending = rest;
    eprintln!("graceful handover took {handover:?}");
    assert!(
        handover < Duration::from_secs(2),
        "handover after release waited for expiry: {handover:?}"
    );
    assert!(
        second.fencing_token() > token_1,
        "the fencing token grows from term to term"
    );
    assert_eq!(
        record(&client, ns.name(), "lock").await.transitions,
        1,
        "a takeover increments leaseTransitions once"
    );

    let third_id = pending.len();
    assert_eq!(third_id, 1);
    let token_2 = second.fencing_token();
    second.release().await.unwrap();
    let (third, _, _) = futures::future::select_all(pending).await;
    let third = third.unwrap().unwrap();
    assert!(third.fencing_token() > token_2);
    assert_eq!(record(&client, ns.name(), "lock").await.transitions, 2);
    third.release().await.unwrap();
}

#[tokio::test]
async fn many_candidates_racing_elect_exactly_one() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let ids: Vec<String> = (0..12).map(|i| format!("racer-{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let handles = spawn_candidates(&client, ns.name(), "race", &refs, &shutdown);
    let leaders = wait_for("a leader", Duration::from_secs(30), || async {
        let done = handles.iter().filter(|h| h.is_finished()).count();
        (done > 0).then_some(done)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let leaders_after = handles.iter().filter(|h| h.is_finished()).count();
    assert_eq!((leaders, leaders_after), (1, 1), "exactly one leader");
    assert_eq!(record(&client, ns.name(), "race").await.transitions, 0);
    shutdown.cancel();
    for h in handles {
        match h.await.unwrap() {
            Ok(l) => drop(l),
            Err(Error::Cancelled { .. }) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}

#[tokio::test]
async fn records_with_null_or_missing_fields_are_handled() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let api = Api::<Lease>::namespaced(client.clone(), ns.name());
    // A Lease with no spec fields at all: free to take.
    let empty: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "empty"}, "spec": {}
    }))
    .unwrap();
    api.create(&PostParams::default(), &empty).await.unwrap();
    let shutdown = CancellationToken::new();
    let l = tokio::time::timeout(
        Duration::from_secs(10),
        elector(&client, ns.name(), "empty", "me").become_leader(&shutdown),
    )
    .await
    .expect("an empty lease is free")
    .unwrap();
    assert_eq!(record(&client, ns.name(), "empty").await.transitions, 1);
    l.release().await.unwrap();

    // A holder without a duration: the candidate falls back to its own 2 s lease duration.
    let odd: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "odd"}, "spec": {"holderIdentity": "ghost"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &odd).await.unwrap();
    let t = Instant::now();
    let l = tokio::time::timeout(
        Duration::from_secs(15),
        elector(&client, ns.name(), "odd", "me").become_leader(&shutdown),
    )
    .await
    .expect("an abandoned lease is taken after expiry")
    .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(1900), "{:?}", t.elapsed());
    let rec = record(&client, ns.name(), "odd").await;
    assert_eq!(rec.holder.as_deref(), Some("me"));
    assert_eq!(rec.lease_duration, Some(Duration::from_secs(2)));
    l.release().await.unwrap();
    let rec = record(&client, ns.name(), "odd").await;
    assert_eq!(rec.holder, None, "release clears the holder");
    assert_eq!(
        rec.lease_duration,
        Some(Duration::from_secs(1)),
        "as client-go's ReleaseOnCancel"
    );
}

#[tokio::test]
async fn another_holder_written_over_the_leader_ends_leadership_at_once() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let l = elector(&client, ns.name(), "stolen", "me")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let token = l.lost_token();
    let patch = serde_json::json!({"spec": {"holderIdentity": "intruder"}});
    let t = Instant::now();
    Api::<Lease>::namespaced(client.clone(), ns.name())
        .patch("stolen", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), token.cancelled())
        .await
        .expect("loss");
    eprintln!("loss seen {:?} after another holder was written", t.elapsed());
    assert_eq!(
        l.loss_reason(),
        Some(LossReason::OtherHolder {
            holder: "intruder".into()
        })
    );
    // Nothing is released over the intruder.
    l.release().await.unwrap();
    assert_eq!(
        record(&client, ns.name(), "stolen").await.holder.as_deref(),
        Some("intruder")
    );
}

/// Found by the chaos run: with `leaseTransitions` as the token, a Lease deleted by an
/// administrator and created again by a candidate that never saw it started counting at 0, and
/// fenced stores refused the legitimate leader. The token is a resourceVersion now.
#[tokio::test]
async fn fencing_tokens_grow_across_deletion_and_recreation_and_are_published() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let api = Api::<Lease>::namespaced(client.clone(), ns.name());
    let lock = kube_leader::LockRef::new(ns.name(), "fenced").unwrap();
    let shutdown = CancellationToken::new();
    let a = elector(&client, ns.name(), "fenced", "a")
        .become_leader(&shutdown)
        .await
        .unwrap();
    // Observers learn the token from the first renewal.
    let mut leader = kube_leader::internal::leader::lease_watch(client.clone(), lock.clone());
    let token_a = a.fencing_token();
    tokio::time::timeout(
        Duration::from_secs(5),
        leader.wait_for(|i| i.as_ref().is_some_and(|i| i.fencing_token == Some(token_a))),
    )
    .await
    .expect("the token is published")
    .unwrap();
    let once = kube_leader::internal::leader::lease_current(client.clone(), &lock)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (once.holder.as_deref(), once.fencing_token),
        (Some("a"), Some(token_a))
    );

    // An administrator deletes the Lease; a candidate that never saw it creates it again.
    api.delete("fenced", &Default::default()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), a.lost())
        .await
        .expect("loss");
    let b = tokio::time::timeout(
        Duration::from_secs(10),
        elector(&client, ns.name(), "fenced", "b").become_leader(&shutdown),
    )
    .await
    .expect("b leads")
    .unwrap();
    assert!(
        b.fencing_token() > token_a,
        "token {} after {token_a}",
        b.fencing_token()
    );
    let token_b = b.fencing_token();
    tokio::time::timeout(
        Duration::from_secs(5),
        leader.wait_for(|i| i.as_ref().is_some_and(|i| i.fencing_token == Some(token_b))),
    )
    .await
    .expect("the new token is published")
    .unwrap();
    b.release().await.unwrap();
    let released = kube_leader::internal::leader::lease_current(client.clone(), &lock)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((released.holder, released.fencing_token), (None, None));
}

#[tokio::test]
async fn lease_deleted_while_held_ends_leadership() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let l = elector(&client, ns.name(), "gone", "me")
        .become_leader(&shutdown)
        .await
        .unwrap();
    Api::<Lease>::namespaced(client.clone(), ns.name())
        .delete("gone", &Default::default())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), l.lost())
        .await
        .expect("loss");
    assert_eq!(l.loss_reason(), Some(LossReason::LockDeleted));
}

#[tokio::test]
async fn shutdown_while_waiting_returns_promptly_and_shutdown_while_leading_releases_after_work() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let leader_shutdown = CancellationToken::new();
    let leader = elector(&client, ns.name(), "sd", "leader")
        .become_leader(&leader_shutdown)
        .await
        .unwrap();

    let follower_shutdown = CancellationToken::new();
    let f = elector(&client, ns.name(), "sd", "follower");
    let s = follower_shutdown.clone();
    let waiting = tokio::spawn(async move { f.become_leader(&s).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    follower_shutdown.cancel();
    let r = waiting.await.unwrap();
    assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "cancel took {:?}",
        t.elapsed()
    );

    // Shutdown while leading: the loss token fires, the lease stays held (renewed) while the
    // work winds down, and is released only when the handle goes.
    leader_shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(2), leader.lost())
        .await
        .expect("loss on shutdown");
    assert_eq!(leader.loss_reason(), Some(LossReason::Cancelled));
    tokio::time::sleep(Duration::from_millis(2500)).await; // longer than the lease duration
    assert_eq!(
        record(&client, ns.name(), "sd").await.holder.as_deref(),
        Some("leader"),
        "the lease must stay held while the work has not stopped"
    );
    leader.release().await.unwrap();
    assert_eq!(record(&client, ns.name(), "sd").await.holder, None);
}

#[tokio::test]
async fn idle_follower_sends_no_requests_and_leader_only_renews() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let (leader_user, follower_user) = (cp.unused_user(), cp.unused_user());
    for user in [&leader_user, &follower_user] {
        let rules = vec![kube_leader_testenv::rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "update"],
        )];
        kube_leader_testenv::bind_role(&admin, ns.name(), user, rules)
            .await
            .unwrap();
    }
    let lc = cp.user_client(&leader_user).await;
    let fc = cp.user_client(&follower_user).await;
    let shutdown = CancellationToken::new();
    let leader = wait_for("RBAC to allow the leader", Duration::from_secs(10), || async {
        elector(&lc, ns.name(), "idle", "leader")
            .become_leader(&shutdown)
            .await
            .ok()
    })
    .await;
    let f = elector(&fc, ns.name(), "idle", "follower");
    let s = shutdown.clone();
    let follower = tokio::spawn(async move { f.become_leader(&s).await });
    tokio::time::sleep(Duration::from_secs(1)).await; // let the follower sync its watch
    let (l0, f0) = (
        cp.request_count(&leader_user).unwrap(),
        cp.request_count(&follower_user).unwrap(),
    );
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let leader_events = cp.audit_events(&leader_user).unwrap();
    let (l1, f1) = (
        cp.request_count(&leader_user).unwrap(),
        cp.request_count(&follower_user).unwrap(),
    );
    eprintln!(
        "over {window:?}: leader {} requests, follower {} requests",
        l1 - l0,
        f1 - f0
    );
    assert_eq!(f1 - f0, 0, "an idle follower must send no request");
    // One write per retry period (200 ms) and no reads: about 20 in 4 s.
    assert!(l1 - l0 <= 25, "leader sent {} requests in {window:?}", l1 - l0);
    let gets = leader_events.iter().filter(|e| e.verb == "get").count();
    assert_eq!(gets, 0, "the leader renews without reading");
    assert!(!follower.is_finished());
    shutdown.cancel();
    drop(leader);
    let _ = follower.await;
}

/// The candidate as a process, to pause (SIGSTOP) and kill it.
struct Candidate {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Candidate {
    fn spawn(cp: &ControlPlane, ns: &str, lease: &str, id: &str) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lease-candidate"))
            .args([
                cp.kubeconfig_path().to_str().unwrap(),
                ns,
                lease,
                id,
                "2000",
                "1000",
                "200",
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    async fn next_event(&mut self, timeout: Duration) -> serde_json::Value {
        let line = tokio::time::timeout(timeout, self.lines.next_line())
            .await
            .expect("candidate event")
            .unwrap()
            .expect("candidate output");
        serde_json::from_str(&line).unwrap()
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }
}

#[tokio::test]
async fn paused_leader_stops_at_once_when_resumed() {
    use nix::sys::signal::Signal;
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let mut a = Candidate::spawn(cp, ns.name(), "pause", "a");
    let ev = a.next_event(Duration::from_secs(30)).await;
    assert_eq!(ev["event"], "started_leading");
    let mut b = Candidate::spawn(cp, ns.name(), "pause", "b");
    a.signal(Signal::SIGSTOP);
    let ev = b.next_event(Duration::from_secs(30)).await;
    assert_eq!(
        ev["event"], "started_leading",
        "b takes over the paused leader's lease"
    );
    let b_start = ev["mono_ns"].as_u64().unwrap();
    let resumed = kube_leader_e2e::mono_ns();
    a.signal(Signal::SIGCONT);
    let ev = a.next_event(Duration::from_secs(10)).await;
    assert_eq!(ev["event"], "stopped_leading");
    let stop = ev["mono_ns"].as_u64().unwrap();
    let after_resume = Duration::from_nanos(stop.saturating_sub(resumed));
    eprintln!("resumed leader stopped {after_resume:?} after SIGCONT (b led since {b_start})");
    assert!(after_resume < Duration::from_secs(1), "{after_resume:?}");
    a.signal(Signal::SIGTERM);
    b.signal(Signal::SIGTERM);
    let _ = a.child.wait().await;
    let _ = b.child.wait().await;
}

#[tokio::test]
async fn killed_leader_is_taken_over_after_expiry() {
    use nix::sys::signal::Signal;
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let mut a = Candidate::spawn(cp, ns.name(), "crash", "a");
    let first = a.next_event(Duration::from_secs(30)).await;
    assert_eq!(first["event"], "started_leading");
    let mut b = Candidate::spawn(cp, ns.name(), "crash", "b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = kube_leader_e2e::mono_ns();
    a.signal(Signal::SIGKILL);
    let ev = b.next_event(Duration::from_secs(10)).await;
    assert_eq!(ev["event"], "started_leading");
    assert!(
        ev["fencing_token"].as_u64() > first["fencing_token"].as_u64(),
        "{first} then {ev}"
    );
    let takeover = Duration::from_nanos(ev["mono_ns"].as_u64().unwrap() - killed);
    eprintln!("SIGKILL to new leader: {takeover:?} (lease duration 2 s)");
    assert!(
        takeover >= Duration::from_millis(1000),
        "took over before expiry: {takeover:?}"
    );
    let _ = a.child.wait().await;
    b.signal(Signal::SIGTERM);
    let _ = b.child.wait().await;
}

#[tokio::test]
async fn sigterm_releases_and_the_follower_takes_over_at_once() {
    use nix::sys::signal::Signal;
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let mut a = Candidate::spawn(cp, ns.name(), "term", "a");
    assert_eq!(
        a.next_event(Duration::from_secs(30)).await["event"],
        "started_leading"
    );
    let mut b = Candidate::spawn(cp, ns.name(), "term", "b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = kube_leader_e2e::mono_ns();
    a.signal(Signal::SIGTERM);
    let ev = b.next_event(Duration::from_secs(10)).await;
    assert_eq!(ev["event"], "started_leading");
    let handover = Duration::from_nanos(ev["mono_ns"].as_u64().unwrap() - sent);
    eprintln!("SIGTERM to new leader: {handover:?}");
    assert!(handover < Duration::from_millis(1500), "{handover:?}");
    assert!(a.child.wait().await.unwrap().success());
    b.signal(Signal::SIGTERM);
    let _ = b.child.wait().await;
}

#[tokio::test]
async fn invalid_config_is_a_typed_error() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let e = LeaseElector::new(client.clone(), "x")
        .namespace("default")
        .identity("me")
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(Duration::from_secs(1))
                .renew_deadline(Duration::from_secs(2)),
        )
        .become_leader(&shutdown)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    let e = LeaseElector::new(client, "Not_A_Name")
        .namespace("default")
        .identity("me")
        .become_leader(&shutdown)
        .await;
    assert!(matches!(e, Err(Error::InvalidLockName { .. })));
}

#[tokio::test]
async fn saturated_transitions_are_taken_over_and_undecodable_records_are_clear_errors() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let api = Api::<Lease>::namespaced(client.clone(), ns.name());
    let full: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "full"}, "spec": {"holderIdentity": "", "leaseTransitions": i32::MAX}
    }))
    .unwrap();
    api.create(&PostParams::default(), &full).await.unwrap();
    let shutdown = CancellationToken::new();
    // leaseTransitions cannot grow past an int32: it stays there, and the fencing token (a
    // resourceVersion) does not depend on it.
    let l = tokio::time::timeout(
        Duration::from_secs(10),
        elector(&client, ns.name(), "full", "me").become_leader(&shutdown),
    )
    .await
    .expect("a prompt takeover")
    .unwrap();
    assert_eq!(
        record(&client, ns.name(), "full").await.transitions,
        i32::MAX.unsigned_abs()
    );
    assert!(l.fencing_token() > 0);
    l.release().await.unwrap();

    // A time the Kubernetes client types cannot represent (written raw with kubectl): a typed
    // error naming the Lease, not a silent hang.
    cp.kubectl_with_stdin(
        &["-n", ns.name(), "apply", "-f", "-"],
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: far-future}\n\
         spec: {holderIdentity: \"\", renewTime: \"9999-12-31T23:00:00.000000Z\"}\n",
    )
    .unwrap();
    let e = tokio::time::timeout(
        Duration::from_secs(10),
        elector(&client, ns.name(), "far-future", "me").become_leader(&shutdown),
    )
    .await
    .expect("a prompt error, not a hang")
    .unwrap_err();
    assert!(matches!(e, Error::Undecodable { .. }), "{e}");
    assert!(e.to_string().contains("far-future"), "{e}");
}
