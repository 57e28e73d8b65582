//! `kube-leader run --shards M`: hold a fair share of M shard Leases and tell COMMAND which.
//!
//! COMMAND runs for the life of `kube-leader` (not only while it holds shards), and learns
//! its shards the way a program in any language can:
//!
//! - at start, in its environment: `KUBE_LEADER_SHARD_SET` (`0,3,7`), `KUBE_LEADER_SHARD_COUNT`,
//!   `KUBE_LEADER_SHARDS_FILE`, `KUBE_LEADER_SHARDS_ACK`, and `KUBE_LEADER_IDENTITY`,
//!   `KUBE_LEADER_LOCK` (the set's name), `KUBE_LEADER_NAMESPACE`;
//! - on every change, the file `KUBE_LEADER_SHARDS_FILE` is rewritten atomically (written
//!   beside, then renamed) and COMMAND's process group gets `--shards-signal` (SIGHUP). The
//!   file: a line `generation N`, then one line `INDEX FENCING_TOKEN` per held shard. The
//!   signal is held back until COMMAND catches or ignores it (`SigCgt`/`SigIgn` in
//!   `/proc/PID/status`): a program is never ended by being told, however soon after its start
//!   the first change comes; changes meanwhile are told by one signal;
//! - COMMAND acknowledges a generation by writing `N` to `KUBE_LEADER_SHARDS_ACK` once it
//!   has stopped work on every shard that generation no longer lists.
//!
//! A shard leaves the file the moment its loss token fires. A shard that is handed over (a
//! replica joined) or given up on shutdown is renewed until COMMAND acknowledges, and only then
//! released: its successor starts after COMMAND stopped. Without an acknowledgement within
//! `--grace` the shard is not released but left to expire (another lease duration). A shard
//! lost by its renew deadline is not ours any more: COMMAND has `--lease-duration −
//! --renew-deadline` from the file's change until a successor may take it over, and should
//! fence its writes with the shard's token. (Shards mode has no supervisor process: a frozen
//! `kube-leader` cannot tell COMMAND, which must rely on the fencing tokens.)

use std::{collections::BTreeMap, ffi::OsString, path::PathBuf, process::Stdio};

use anyhow::anyhow;
use kube_leader::shards::{Shards, ShardsConfig};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::process::Child;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    cli::RunArgs,
    exit::{self, Fail, OrExit},
    run,
};

mod file;
mod sidecar;
mod signal;

use file::{list, render, write_atomically};
use sidecar::{Sidecar, StopSignals};
pub(crate) use signal::parse_signal;

/// `kube-leader run --shards M`: returns the exit code.
pub(crate) async fn run(args: RunArgs, count: u32, notify: Signal) -> Result<u8, Fail> {
    let mut stops = StopSignals::new().or_exit(1)?;
    let client = run::connect(args.connect_timeout, args.renew_deadline).await?;
    let namespace = run::resolve_namespace(args.lock.namespace.as_deref(), &client);
    let identity = run::resolve_identity(args.identity.as_deref()).ok_or_else(|| {
        Fail::new(
            exit::USAGE,
            anyhow!("no identity: set --identity, or POD_NAME, or a host name"),
        )
    })?;
    let grace = args.grace();
    let shards = candidate(&args, client, &namespace, &identity, count)?;
    let (file, ack) = files(&args.lock.lock);

    let shutdown = CancellationToken::new();
    let assignments = shards
        .start(&shutdown)
        .map_err(|e| Fail::new(exit::for_error(&e), e))?;
    let mut held = assignments.held();
    info!(set = %args.lock.lock, identity = %identity, shards = count, "campaigning for shards");
    // COMMAND starts with the first share, or after a lease duration with what there is.
    let _ = tokio::time::timeout(args.lease_duration, held.wait_for(|s| !s.held.is_empty())).await;
    let generation = 1;
    let current = held.borrow_and_update().clone();
    write_atomically(&file, &render(generation, &current)).or_exit(1)?;

    let env: [(&str, OsString); 8] = [
        ("KUBE_LEADER_SHARD_SET", list(&current).into()),
        ("KUBE_LEADER_SHARD_COUNT", count.to_string().into()),
        ("KUBE_LEADER_SHARDS_FILE", file.clone().into()),
        ("KUBE_LEADER_SHARDS_ACK", ack.clone().into()),
        ("KUBE_LEADER_SHARDS_SIGNAL", notify.as_str().into()),
        ("KUBE_LEADER_IDENTITY", identity.into()),
        ("KUBE_LEADER_LOCK", args.lock.lock.clone().into()),
        ("KUBE_LEADER_NAMESPACE", namespace.into()),
    ];
    let mut child = spawn(&args, &env).inspect_err(|_| shutdown.cancel())?;
    let group = Pid::from_raw(child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
    info!(shards = %list(&current), generation, "COMMAND started");

    let mut sidecar = Sidecar {
        assignments,
        held,
        current,
        generation,
        group,
        notify,
        grace,
        file,
        ack,
        guards: BTreeMap::new(),
        pending: BTreeMap::new(),
        engine_ended: false,
        untold: None,
        warned: false,
    };
    let code = sidecar.until_exit(&mut child, &mut stops).await;
    info!(code, "COMMAND exited; handing every shard back");
    shutdown.cancel();
    hand_back(sidecar, &args).await?;
    Ok(code)
}

/// The shard candidate, its settings checked.
fn candidate(
    args: &RunArgs,
    client: kube::Client,
    namespace: &str,
    identity: &str,
    count: u32,
) -> Result<Shards, Fail> {
    let shards = Shards::new(client, args.lock.lock.clone(), count)
        .namespace(namespace)
        .identity(identity)
        .config(ShardsConfig {
            lease: args.lease_config(),
            handover_grace: args.grace(),
            ..ShardsConfig::default()
        });
    shards.validate().map_err(|e| Fail::new(exit::USAGE, e))?;
    Ok(shards)
}

/// The shard file COMMAND reads and the acknowledgement it writes (none yet).
fn files(set: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir();
    let file = dir.join(format!("kube-leader-{}-{}.shards", set, std::process::id()));
    let ack = file.with_extension("ack");
    let _ = std::fs::remove_file(&ack);
    (file, ack)
}

/// Starts COMMAND with `env` added, in a process group of its own.
fn spawn(args: &RunArgs, env: &[(&str, OsString)]) -> Result<Child, Fail> {
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::NOT_FOUND,
            _ => exit::CANNOT_EXECUTE,
        };
        Fail::new(code, anyhow!(e).context("cannot start COMMAND"))
    })
}

/// COMMAND is gone: hands every shard back, removes the files, and tells how the candidate
/// ended.
async fn hand_back(mut sidecar: Sidecar, args: &RunArgs) -> Result<(), Fail> {
    // COMMAND is gone: nothing acts on any shard any more, nor on one acquired meanwhile.
    sidecar.guards.clear();
    let assignments = &mut sidecar.assignments;
    let _ = tokio::time::timeout(args.lease_duration, async {
        while let Some(shard) = assignments.next().await {
            drop(shard);
        }
    })
    .await;
    let result = match tokio::time::timeout(args.renew_deadline, sidecar.assignments.finish()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            warn!(error = %e, "the shard candidate failed");
            Err(Fail::new(exit::for_error(&e), e))
        }
        Err(_) => {
            warn!("handing the shards back timed out");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(&sidecar.file);
    let _ = std::fs::remove_file(&sidecar.ack);
    result
}
