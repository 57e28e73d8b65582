//! `kube-leader run --coordinated VERSION`: the sidecar takes part in Kubernetes' coordinated
//! leader election (a control plane of this test's own, with the `CoordinatedLeaderElection`
//! gate and `coordination.k8s.io/v1beta1` on). The controller in kube-apiserver names the holder;
//! when it prefers another candidate, the leader's COMMAND stops before the Lease is released,
//! and the next COMMAND starts only after it ended.

use super::{
    deleted_lock::{epoch_now, never_together, started_after_stop},
    *,
};

/// `COMMAND` that records its start, and on SIGTERM takes half a second to stop (within the
/// 1 s grace), records its end and exits.
fn work(dir: &Path, id: &str) -> Vec<String> {
    let d = dir.display();
    let on_term = format!("sleep 0.5; date +%s%N > {d}/{id}.stopped; exit 0");
    let mut script = work_script(dir, id, &on_term);
    let body = script.pop().expect("the script");
    script.push(format!("date +%s%N > {d}/{id}.started; {body}"));
    script
}

#[tokio::test(flavor = "multi_thread")]
async fn a_coordinated_sidecar_gives_way_to_the_controllers_choice_and_commands_never_overlap() {
    let cp = ControlPlane::shared_coordinated();
    let ns = cp.namespace().await;
    let dir = scratch_dir("coordinated");
    let mut flags = lease_flags("co", ns.name());
    flags.extend(["--grace", "1s", "--coordinated"]);
    let spawn = |id: &str, version: &str| {
        let mut flags = flags.clone();
        flags.push(version);
        Candidate::spawn_with(cp.kubeconfig_path(), &dir, id, &flags, &work(&dir, id), &[])
    };
    // Alone, a coordinated candidate is the controller's choice.
    let mut newer = spawn("co-new", "1.37.2");
    wait_for("the controller names co-new", WAIT, || {
        newer.leading().then_some(())
    });
    // An older candidate registers: the controller prefers it (the oldest emulation version);
    // co-new stops COMMAND (half a second), then releases the Lease.
    let older = spawn("co-old", "1.36.0");
    let registered = epoch_now();
    assert!(
        never_together(&newer, &older, WAIT),
        "co-old never led; co-new's log:\n{}\nco-old's log:\n{}",
        newer.log_text(),
        older.log_text()
    );
    started_after_stop(&dir, "co-new", "co-old", registered);
    assert_eq!(newer.wait_exit(WAIT).code(), Some(124), "{}", newer.log_text());
    let log = newer.log_text();
    assert!(
        log.contains("coordinated leader election prefers co-old"),
        "the loss names the controller's choice:\n{log}"
    );
    assert!(log.contains("released the lock"), "{log}");
    let lease: Lease = Api::namespaced(cp.client().await, ns.name())
        .get("co")
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("co-old"));
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    drop(older);
    let _ = fs::remove_dir_all(dir);
}
