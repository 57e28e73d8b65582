//! A waiting leader-for-life candidate says why it waits, and for which proof until when, under
//! the sidecar's default log filter (which keeps the rest of the library at warnings).

use super::*;

/// The leader's `kube-leader` is SIGKILLed (its supervisor kills COMMAND; nothing is released)
/// and its Pod force-deleted: the garbage collector deletes the lock, and the follower must
/// wait for the leader's liveness heartbeat to lapse (or the Pod's grace), since a force
/// deletion proves nothing. Its log says so, with the time left, where it used to say only
/// "no leader".
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_says_which_proof_it_waits_for_and_until_when() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("waiting");
    for pod in ["wt1", "wt2"] {
        create_pod(&client, ns.name(), pod).await.unwrap();
    }
    let flags = ["--lock", "wt", "--namespace", ns.name(), "--grace", "1s"];
    // The default log filter: RUST_LOG empty.
    let spawn = |id: &str| {
        let work = work_script(&dir, id, "exit 0");
        Candidate::spawn_with(
            cp.kubeconfig_path(),
            &dir,
            id,
            &flags,
            &work,
            &[("POD_NAME", id), ("RUST_LOG", "")],
        )
    };
    let leader = spawn("wt1");
    wait_for("wt1 leads", WAIT, || leader.leading().then_some(()));
    let follower = spawn("wt2");
    wait_for("wt2 says that wt1 leads", WAIT, || {
        follower
            .log_text()
            .contains(r#""reason":"wt1 leads""#)
            .then_some(())
    });

    signal(leader.pid(), "KILL");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    pods.delete("wt1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let line = wait_for("wt2 says which proof it waits for", WAIT, || {
        follower.logs().into_iter().find(|l| {
            l["reason"]
                .as_str()
                .is_some_and(|r| r.contains("wt1") && r.contains("may still run"))
        })
    });
    // The sidecar's leader keeps a liveness heartbeat by default: its lapse is the first proof
    // by time (the Pod's grace the next, without one).
    let next = line["next"].as_str().unwrap_or_default().to_string();
    assert!(
        (next.contains("liveness heartbeat lapses") || next.contains("grace period"))
            && next.contains(" in "),
        "the wait names the proof it waits for and when it holds: {line}"
    );
    assert_eq!(line["target"], "kube_leader::waiting", "{line}");
    eprintln!("wt2: {} ({next})", line["reason"]);
    let _ = fs::remove_dir_all(dir);
}
