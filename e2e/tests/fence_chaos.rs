//! The fenced chaos run (issue 25): leaders paused past their lease, partitioned, killed and
//! stopped while they keep writing fenced objects at a steady rate, against the real control
//! plane, with two webhook servers: one enforcing, one audit-only.
//!
//! Four candidates on one Lease, each through a fault proxy of its own: two library candidates
//! (`fence-candidate lease`, writing through `Leadership::fenced_client`) and two
//! `kube-leader run --fence` sidecars whose COMMAND (`fence-candidate child`) writes through the
//! loopback proxy. Every 100 ms the leader merge-patches, all at once, `fenced-<i>` (the
//! enforcing rule), its twin `audit-<i>` (the audit-only rule: the same writers, the same
//! tokens) and `plain-<i>` (no rule: the latency pair). A seeded schedule draws `sigterm`,
//! `pause` (SIGSTOP of every process of the leader until another leads and writes, then
//! SIGCONT), `partition` (its proxy blackholes until another leads and writes; the requests it
//! held land when it heals), `kill`, `webhook-down` (the enforcing webhook killed for 1 s) and
//! `steal` (an administrator writes another holder into the Lease while the leader writes: the
//! lock moves under writes in flight, the check-to-commit window).
//!
//! The checker (`kube_leader_e2e::fence_chaos`) reads the lock's and every object's history from
//! watches (resourceVersions and stamped tokens, exact commit order), the writers' reports and
//! the webhooks' `fence check` lines (the lock version each check read). It asserts: no write
//! regresses an enforced object's token; every enforced write that landed after the lock moved
//! to a newer token was checked against the lock before the move (the check-to-commit window);
//! no enforced write lands while its webhook is down. It prints the count of those window
//! writes, the audit side's stale writes that landed (what the same run would have accepted
//! without the fence), the refusals, and the webhook's added latency as paired differences
//! (figures, not asserted: a shared 2-core machine).
//!
//! CI mode (in the test command): a fixed set of faults in a seeded order. Long mode:
//! `KUBE_LEADER_FENCE_CHAOS=long` draws faults by weight until `KUBE_LEADER_FENCE_CHAOS_TRANSITIONS`
//! (default 1000) transitions, or `KUBE_LEADER_FENCE_CHAOS_MAX_SECS` (default 3600);
//! `KUBE_LEADER_FENCE_CHAOS_SEED` replays another schedule. Needs `kube-leader` built
//! (`cargo build -p kube-leader-cli`; `cargo test --workspace` builds it).

use std::time::{Duration, Instant};

use kube_leader_e2e::{
    chaos::{seed_from_env, Rng},
    fence_chaos::{analyze, read_checks, read_writes, Figures, Input, Recorder},
};
use kube_leader_testenv::ControlPlane;

#[path = "fence_chaos/arena.rs"]
mod arena;
#[path = "fence_chaos/setup.rs"]
mod setup;

use arena::{Arena, Flavor, Kind};

/// The lock.
const LOCK: &str = "leader";
/// Objects per side.
const OBJECTS: usize = 4;
/// The seed of the CI mode.
const DEFAULT_SEED: u64 = 0x6665_6e63_6521_2125;
/// The candidates.
const FLAVORS: [Flavor; 4] = [Flavor::Library, Flavor::Library, Flavor::Sidecar, Flavor::Sidecar];
/// The long mode's draw.
const WEIGHTS: [(Kind, u32); 6] = [
    (Kind::Sigterm, 12),
    (Kind::Pause, 4),
    (Kind::Partition, 4),
    (Kind::Kill, 1),
    (Kind::WebhookDown, 1),
    (Kind::Steal, 3),
];
/// The CI mode's faults (shuffled by the seed).
const CI: [(Kind, usize); 6] = [
    (Kind::Sigterm, 5),
    (Kind::Pause, 3),
    (Kind::Partition, 3),
    (Kind::Kill, 1),
    (Kind::WebhookDown, 1),
    (Kind::Steal, 2),
];

/// Lease timings, and how often the leader writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    lease: Duration,
    renew: Duration,
    retry: Duration,
    write: Duration,
}

const TIMINGS: Timings = Timings {
    lease: Duration::from_millis(1000),
    renew: Duration::from_millis(600),
    retry: Duration::from_millis(100),
    write: Duration::from_millis(100),
};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_chaos() {
    let long = std::env::var("KUBE_LEADER_FENCE_CHAOS").is_ok_and(|v| v == "long");
    let seed = seed_from_env("KUBE_LEADER_FENCE_CHAOS_SEED", DEFAULT_SEED);
    let target = env_number("KUBE_LEADER_FENCE_CHAOS_TRANSITIONS", 1000) as usize;
    let max = Duration::from_secs(env_number("KUBE_LEADER_FENCE_CHAOS_MAX_SECS", 3600));
    let began = Instant::now();
    let cp = ControlPlane::shared();
    let ns_guard = cp.namespace().await;
    let ns = ns_guard.name().to_owned();
    let writer = cp.unused_user();
    let dir = std::env::temp_dir().join(format!("kube-leader-fence-chaos-{ns}"));
    std::fs::create_dir_all(&dir).expect("the run's directory");
    let bin = kube_leader_e2e::kube_leader_bin_beside(&arena::fence_candidate_bin());
    let setup::Stage {
        enforcing,
        audit,
        configurations,
    } = setup::stage(cp, &bin, &ns, LOCK, &writer, &dir, OBJECTS).await;
    setup::wait_in_force(cp, &writer, &ns, &audit.log).await;
    // The probes' "would refuse" lines are not the run's.
    let probes = read_checks(&audit.log).1;
    let recorder = Recorder::start(&cp.client().await, &ns, LOCK).await;
    println!(
        "fenced chaos: {} mode, seed {seed:#x}, lease {:?} / renew {:?} / retry {:?}, a write \
         tick every {:?}, candidates {FLAVORS:?}, logs in {}",
        if long { "long" } else { "CI" },
        TIMINGS.lease,
        TIMINGS.renew,
        TIMINGS.retry,
        TIMINGS.write,
        dir.display()
    );
    let mut arena = Arena::new(
        cp,
        ns.clone(),
        writer,
        dir.clone(),
        TIMINGS,
        Rng::new(seed),
        recorder,
        enforcing,
    );
    arena.add_slots(&FLAVORS);
    arena.respawn();
    schedule(&mut arena, long, target, max, began).await;
    // The last leader writes a little longer, then everything stops and the watches catch up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    arena.stop_all();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let figures = check(&arena, &audit.log, probes);
    report(&arena, &figures, began.elapsed());
    setup::unstage(cp, &ns, &configurations);
    let errors = arena.errors.clone();
    drop(arena);
    drop(audit);
    assert_safe(&figures);
    assert!(
        errors.is_empty(),
        "faults that did not end with a new leader: {errors:?}"
    );
    if std::env::var_os("KUBE_LEADER_FENCE_CHAOS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    drop(ns_guard);
}

/// Runs the faults: the CI mode's set in a seeded order, or (long) seeded draws until `target`
/// transitions or `max` since `began`.
async fn schedule(arena: &mut Arena, long: bool, target: usize, max: Duration, began: Instant) {
    if long {
        while arena.transitions() < target && began.elapsed() < max {
            let kind = arena.rng.weighted(&WEIGHTS);
            arena.fault(kind).await;
            if arena.counts.values().sum::<usize>() % 50 == 0 {
                println!(
                    "{:?}: {} transitions, faults {:?}",
                    began.elapsed(),
                    arena.transitions(),
                    arena.counts
                );
            }
        }
    } else {
        let mut kinds: Vec<Kind> = CI.iter().flat_map(|&(k, n)| std::iter::repeat_n(k, n)).collect();
        arena.rng.shuffle(&mut kinds);
        for kind in kinds {
            arena.fault(kind).await;
        }
    }
}

/// Reads everything the run recorded and runs the checker.
fn check(arena: &Arena, audit_log: &std::path::Path, probes: usize) -> Figures {
    let recorded = arena.recorder.snapshot();
    let (checks, _) = read_checks(&arena.enforcing.log);
    let (_, would_refuse) = read_checks(audit_log);
    let input = Input {
        lock: recorded.lock,
        objects: recorded.objects,
        writes: arena.outputs.iter().flat_map(|p| read_writes(p)).collect(),
        checks,
        would_refuse: would_refuse.saturating_sub(probes),
        down: arena.down.clone(),
        faults: arena.faults.clone(),
    };
    if recorded.gaps > 0 {
        println!(
            "WARNING: the watches missed versions {} times: the counts may be short",
            recorded.gaps
        );
    }
    analyze(&input)
}

fn report(arena: &Arena, f: &Figures, took: Duration) {
    println!("fenced chaos: {took:.1?}, faults {:?}", arena.counts);
    println!("  leadership transitions: {}", f.transitions);
    println!(
        "  enforced: {} writes landed, {} regressions of an object's token, {} landed after the \
         lock moved (all {} checked before the move: the check-to-commit window), {} refused by \
         the fence, {} refused with the webhook unreachable",
        f.fenced.writes,
        f.fenced.regressions,
        f.fenced.after_lock_moved,
        f.moved_in_window,
        f.refused,
        f.webhook_unreachable
    );
    println!(
        "  audit only (same writers, same tokens): {} writes landed, {} regressed the object's \
         token, {} landed after the lock had moved to a newer token; the webhook logged {} \
         'would refuse'",
        f.audit.writes, f.audit.regressions, f.audit.after_lock_moved, f.would_refuse
    );
    println!(
        "  webhook down ({} times): {} enforced writes landed, {} refused; {} unfenced writes landed",
        arena.down.len(),
        f.down_landed,
        f.down_refused,
        f.down_plain_landed
    );
    println!(
        "  check-to-commit window (the webhook's lock read to the commit, as first seen by the watch or the writer): {}",
        f.window
    );
    println!(
        "  latency, paired per tick, outside faults: fenced {}",
        f.fenced_latency
    );
    println!(
        "                                            unfenced {}",
        f.plain_latency
    );
    println!(
        "                                            added {}",
        f.added_latency
    );
    println!("  added, every pair (faults included): {}", f.added_latency_all);
    if let Some(m) = &f.refusal_example {
        println!("  a refusal, as the writer got it: {m}");
    }
}

/// The safety assertions (figures are printed, not asserted).
fn assert_safe(f: &Figures) {
    assert!(f.transitions > 0, "no leadership transition");
    assert!(f.fenced.writes > 0, "no enforced write landed");
    assert_eq!(
        f.fenced.regressions, 0,
        "an enforced write regressed an object's token"
    );
    assert!(
        f.unexplained.is_empty(),
        "enforced writes landed after the lock moved that no check before the move let through: {:?}",
        f.unexplained
    );
    assert_eq!(
        f.down_landed, 0,
        "an enforced write landed while its webhook was down"
    );
}
