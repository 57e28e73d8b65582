//! `kube-leader run --shards M`: hold a fair share of M shard Leases and run COMMAND with its
//! shards, so that no shard is ever worked by two replicas' COMMANDs at once.
//!
//! COMMAND runs under the same supervisor as in plain `run` ([`crate::supervisor`]): its own
//! process group, `PR_SET_PDEATHSIG`, child subreapers, the group killed when it ends, and a
//! deadline enforced outside kube-leader's process: COMMAND's deadline is the earliest
//! confirmed-until (renew deadline from the last renewal's send) of the shards in its current
//! set, then `--grace`; with no shard, kube-leader's own heartbeats. A killed, frozen or
//! panicking (the shipped build aborts) kube-leader, or a stopped supervisor, cannot leave
//! COMMAND working a shard that another replica may take over.
//!
//! COMMAND learns its shards the way a program in any language can:
//!
//! - at start, in its environment: `KUBE_LEADER_SHARD_SET` (`0,3,7`), `KUBE_LEADER_SHARD_COUNT`,
//!   `KUBE_LEADER_SHARDS_FILE`, `KUBE_LEADER_SHARDS_ACK`, `KUBE_LEADER_IDENTITY`,
//!   `KUBE_LEADER_LOCK` (the set's name), `KUBE_LEADER_NAMESPACE`; the file
//!   `KUBE_LEADER_SHARDS_FILE`: a line `generation N`, then one line `INDEX FENCING_TOKEN` per
//!   shard;
//! - on every change of the set, by `--on-shards-change`:
//!   - `restart` (the default): COMMAND is stopped (SIGTERM, `--grace`, SIGKILL), the shards it
//!     gave up are released, and it starts again with the new set;
//!   - `signal:SIG`: the file is rewritten atomically and SIG sent to COMMAND's process group
//!     (held back until COMMAND's handler is installed); COMMAND writes the generation to
//!     `KUBE_LEADER_SHARDS_ACK` once it has stopped work on every shard that generation no
//!     longer lists. Without an acknowledgement within `--grace` COMMAND is restarted.
//!
//! A shard that leaves COMMAND's set is released to a successor only once COMMAND acknowledged
//! a set without it or has stopped; until then it stays in COMMAND's deadline. A shard lost by
//! its renew deadline is not renewed any more: COMMAND's deadline has passed with it, and the
//! supervisor stops COMMAND then (SIGTERM, then SIGKILL by the grace: gone by the lease
//! duration after the last renewal with the default grace, before anybody can take it over).

use std::path::PathBuf;

use anyhow::anyhow;
use kube_leader::internal::Validate as _;
use kube_leader::{Assignments, Shards, ShardsConfig};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    cli::{LogFormat, RunArgs},
    exit::{self, Fail},
    fence::{start_proxy, Proxy, Tokens},
    run::{self, SetUp},
    supervisor::Launch,
};

mod command;
mod file;
mod sidecar;
mod signal;

use sidecar::{Settings, Sidecar, Timings};

/// `kube-leader run --shards M`: returns the exit code.
pub(crate) async fn run(args: RunArgs, count: u32, log_format: LogFormat) -> Result<u8, Fail> {
    // SIGHUP, SIGUSR1 and SIGUSR2 stay uncaught: only the stop signals are forwarded.
    let SetUp {
        signals: mut stops,
        client,
        own: fence_client,
        namespace,
        identity,
        ..
    } = run::set_up(&args, &run::STOPS, false).await?;
    let config = ShardsConfig::default()
        .lease(args.lease_config())
        .handover_grace(args.grace());
    let shards = candidate(client, &args.lock.lock, count, &namespace, &identity, config)?;
    let (file, ack) = files(&args.lock.lock);

    let shutdown = CancellationToken::new();
    let assignments = shards
        .start(&shutdown)
        .map_err(|e| Fail::new(exit::for_error(&e), e))?;
    info!(set = %args.lock.lock, identity = %identity, shards = count,
        on_change = ?args.on_shards_change, "campaigning for shards");
    let fence_user = crate::fence::proxy_user(args.fence, args.fence_user.clone())?;
    let fence = fence_proxy(fence_user, fence_client, &assignments, count).await?;
    let mut env: Vec<(&'static str, String)> = vec![
        ("KUBE_LEADER_SHARD_COUNT", count.to_string()),
        ("KUBE_LEADER_SHARDS_FILE", file.display().to_string()),
        ("KUBE_LEADER_SHARDS_ACK", ack.display().to_string()),
        ("KUBE_LEADER_IDENTITY", identity),
        ("KUBE_LEADER_LOCK", args.lock.lock.clone()),
        ("KUBE_LEADER_NAMESPACE", namespace),
    ];
    if let Some(proxy) = &fence {
        env.push(("KUBECONFIG", proxy.kubeconfig.display().to_string()));
    }
    let launch = Launch {
        grace: args.grace(),
        command: args.command,
        log_format,
    };
    let timings = Timings {
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
    };
    let settings = Settings {
        launch,
        on_change: args.on_shards_change,
        timings,
    };
    let mut sidecar = Sidecar::new(settings, assignments, env, file, ack);
    let code = sidecar.run(&mut stops).await;
    if sidecar.abandoned() {
        // Not a word to the candidate (its shutdown releases): the process exits now.
        sidecar.abandon();
        return Ok(code);
    }
    info!(code, "COMMAND is gone; handing every shard back");
    shutdown.cancel();
    sidecar.hand_back().await?;
    drop(fence);
    Ok(code)
}

/// The shard candidate for `set` of `count` shards, its settings checked.
fn candidate(
    client: kube::Client,
    set: &str,
    count: u32,
    namespace: &str,
    identity: &str,
    config: ShardsConfig,
) -> Result<Shards, Fail> {
    let shards = Shards::new(client, set.to_string(), count)
        .namespace(namespace)
        .identity(identity)
        .config(config);
    shards.validate().map_err(|e| Fail::new(exit::USAGE, e))?;
    Ok(shards)
}

/// `--fence` (as `user`): COMMAND's API requests go through a proxy that adds the token of the
/// shard a context names (`shard-<i>`), while this replica holds it.
async fn fence_proxy(
    user: Option<String>,
    client: kube::Client,
    assignments: &Assignments,
    count: u32,
) -> Result<Option<Proxy>, Fail> {
    let Some(user) = user else {
        return Ok(None);
    };
    let tokens = Tokens::Shards {
        held: assignments.held(),
        count,
    };
    let proxy = start_proxy(client, &user, tokens, &std::env::temp_dir()).await;
    let proxy =
        proxy.map_err(|e| Fail::new(exit::INTERNAL, anyhow!("cannot start the fencing proxy: {e}")))?;
    Ok(Some(proxy))
}

/// The shard file COMMAND reads and the acknowledgement it writes (none yet).
fn files(set: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir();
    let file = dir.join(format!("kube-leader-{}-{}.shards", set, std::process::id()));
    let ack = file.with_extension("ack");
    let _ = std::fs::remove_file(&ack);
    (file, ack)
}

/// Warns about, and otherwise ignores, a failure to write the shard file.
fn warn_file(e: &std::io::Error, file: &std::path::Path) {
    warn!(error = %e, file = %file.display(), "cannot write the shard file");
}
