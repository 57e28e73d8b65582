//! `kubectl delete pod` on the leader, round after round on one Deployment, with the time of
//! each step of the handover: where the time between the deletion and the next leader's
//! COMMAND goes.
//!
//! Rounds: `KUBE_LEADER_NODE_DELETE_ROUNDS` (default 3; `scripts/node-bench.sh` runs 20). Before
//! each round the Deployment has settled: its three Pods run (the replacement of the last
//! round's leader included) and every status server names the leader, so two candidates are
//! waiting. Steps, all on the host's CLOCK_MONOTONIC (kube-leader's log lines carry wall-clock
//! timestamps, converted on the same host):
//! - `kubectl`: the `kubectl delete pod --wait=false` process, start to exit (its own start-up
//!   and discovery included: the deletion is stored by the time it exits);
//! - `noticed`: the old leader learns that its Pod is going: the kubelet's SIGTERM reached it
//!   ("forwarding signal to COMMAND") or it saw its own Pod's deletion (a leader for life);
//! - `stopped`: COMMAND's stop record (it got SIGTERM);
//! - `released`: the old leader released its lock;
//! - `next`: the next leader's COMMAND wrote its start record.

use std::time::Duration;

use kube_leader_e2e::{mono_ns, wait_for};

use super::{figure, ms, say, Deployed, NodeEnv, Strategy};

/// The rounds' figures: `node: figure LABEL delete_<step> MS` per round.
pub(super) async fn run(env: &'static NodeEnv, strategy: Strategy) {
    run_on(&Deployed::apply(env, strategy).await).await;
}

/// The rounds on a Deployment already applied (a strategy's overlay or a deploy/patterns one).
pub(super) async fn run_on(deployed: &Deployed) {
    let rounds: usize = std::env::var("KUBE_LEADER_NODE_DELETE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let strategy = deployed.strategy;
    let s = deployed.label();
    let mut leader = deployed.leader_after(0).await;
    let mut replacements_led = 0;
    for round in 1..=rounds {
        let waiting = settle(deployed, &leader).await;
        let youngest = youngest(deployed, &waiting).await;
        let deleted = mono_ns();
        deployed.kubectl(&["delete", "pod", &leader, "--wait=false"]);
        let kubectl_done = mono_ns();
        let next = deployed.leader_after(deleted).await;
        let next_start = deployed.start_after(&next, deleted);
        let logs = &deployed.logs;
        let since = |t: Option<u64>| t.map_or("?".to_owned(), |t| ms(t.saturating_sub(deleted)));
        let (noticed, stopped, released) = if strategy == Strategy::ClientGo {
            (None, None, None)
        } else {
            let signalled = logs.logged_at(&leader, "forwarding signal to COMMAND", deleted);
            let saw_pod = logs.logged_at(&leader, "this candidate's Pod", deleted);
            let noticed = [signalled, saw_pod].into_iter().flatten().min();
            let stopped = logs.end_of(&leader, deleted).map(|r| r.mono_ns);
            let released = wait_for("the old leader to release", Duration::from_secs(10), || {
                let at = logs.logged_at(&leader, "released the lock", deleted);
                async move { at }
            })
            .await;
            (noticed, stopped, Some(released))
        };
        let replacement = !waiting.contains(&next);
        replacements_led += usize::from(replacement);
        say(&format!(
            "{s}: delete round {round}/{rounds}: kubectl exited {}, noticed {}, COMMAND stopped {}, \
             released {}, next leader's COMMAND {} ({next}, {})",
            ms(kubectl_done - deleted),
            since(noticed),
            since(stopped),
            since(released),
            ms(next_start - deleted),
            if replacement {
                "the replacement Pod"
            } else {
                "a waiting candidate"
            },
        ));
        if std::env::var_os("KUBE_LEADER_NODE_RUST_LOG").is_some() {
            for pod in [&leader, &next] {
                for (at, message) in logs.messages_between(pod, deleted, next_start + 50_000_000) {
                    say(&format!("  {pod} +{}: {message}", ms(at - deleted)));
                }
            }
        }
        figure(s, "delete_round_to_next", next_start - deleted);
        figure(s, "delete_round_kubectl", kubectl_done - deleted);
        for (name, at) in [
            ("delete_round_noticed", noticed),
            ("delete_round_stopped", stopped),
            ("delete_round_released", released),
        ] {
            if let Some(at) = at {
                figure(s, name, at.saturating_sub(deleted));
            }
        }
        if let Some(released) = released {
            figure(
                s,
                "delete_round_released_to_next",
                next_start.saturating_sub(released),
            );
        }
        deployed.history().report(mono_ns()).assert_safe();
        if super::prefer_youngest(strategy) {
            // A drain: the leader's Pod deleted while newer Pods exist (from round 2 on, the
            // last round's replacement): the youngest leads next, not an older Pod that a
            // rollout or drain would stop next.
            assert_eq!(
                next, youngest,
                "{s}: the leader's successor is the youngest waiting candidate"
            );
        }
        leader = next;
    }
    if strategy != Strategy::ClientGo {
        assert_eq!(
            replacements_led, 0,
            "{s}: a waiting candidate takes over at once, not the replacement Pod"
        );
    }
}

/// The youngest of `waiting` by its Pod's creation time (whole seconds; ties go to the greater
/// name, as kube-leader's choice of a successor does).
async fn youngest(deployed: &Deployed, waiting: &[String]) -> String {
    let pods = deployed.pods().await;
    pods.into_iter()
        .filter_map(|p| Some((p.metadata.creation_timestamp?.0, p.metadata.name?)))
        .filter(|(_, name)| waiting.contains(name))
        .max()
        .map(|(_, name)| name)
        .expect("a waiting candidate")
}

/// Waits until the Deployment's Pods all run, none is being deleted, and every status server
/// names `leader`; the waiting candidates' names.
async fn settle(deployed: &Deployed, leader: &str) -> Vec<String> {
    wait_for("the Deployment to settle", Duration::from_secs(120), || async {
        let pods = deployed.pods().await;
        let running = pods
            .iter()
            .filter(|p| super::phase(p) == "Running" && p.metadata.deletion_timestamp.is_none())
            .count();
        if running != super::REPLICAS || pods.len() != super::REPLICAS {
            return None;
        }
        deployed.one_leader(leader, false).await.ok()?;
        Some(
            pods.into_iter()
                .filter_map(|p| p.metadata.name)
                .filter(|name| name != leader)
                .collect(),
        )
    })
    .await
}
