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

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Stdio,
    time::Duration,
};

use anyhow::anyhow;
use kube_leader::shards::{Shard, ShardSet, Shards, ShardsConfig};
use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use tokio::{
    signal::unix::{signal, SignalKind},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    cli::RunArgs,
    exit::{self, Fail, OrExit},
    run,
};

/// The shard file: `generation N`, then `INDEX FENCING_TOKEN` per held shard.
pub(crate) fn render(generation: u64, set: &ShardSet) -> String {
    let mut s = format!("generation {generation}\n");
    for (index, token) in &set.held {
        s.push_str(&format!("{index} {token}\n"));
    }
    s
}

/// Writes `text` to `path` atomically: a reader sees the old or the new file, never a part.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The generation COMMAND acknowledged (0: none).
fn read_ack(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn list(set: &ShardSet) -> String {
    set.held
        .keys()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `kube-leader run --shards M`: returns the exit code.
pub(crate) async fn run(args: RunArgs, count: u32, notify: Signal) -> Result<u8, Fail> {
    let mut term = signal(SignalKind::terminate()).or_exit(1)?;
    let mut int = signal(SignalKind::interrupt()).or_exit(1)?;
    let mut quit = signal(SignalKind::quit()).or_exit(1)?;
    let client = run::connect(args.connect_timeout).await?;
    let namespace = run::resolve_namespace(args.lock.namespace.as_deref(), &client);
    let identity = run::resolve_identity(args.identity.as_deref()).ok_or_else(|| {
        Fail::new(
            exit::USAGE,
            anyhow!("no identity: set --identity, or POD_NAME, or a host name"),
        )
    })?;
    let grace = args.grace();
    let shards = Shards::new(client, args.lock.lock.clone(), count)
        .namespace(namespace.clone())
        .identity(identity.clone())
        .config(ShardsConfig {
            lease: args.lease_config(),
            handover_grace: grace,
            ..ShardsConfig::default()
        });
    shards.validate().map_err(|e| Fail::new(exit::USAGE, e))?;
    let dir = std::env::temp_dir();
    let file = dir.join(format!(
        "kube-leader-{}-{}.shards",
        args.lock.lock,
        std::process::id()
    ));
    let ack = file.with_extension("ack");
    let _ = std::fs::remove_file(&ack);

    let shutdown = CancellationToken::new();
    let mut assignments = shards
        .start(&shutdown)
        .map_err(|e| Fail::new(exit::for_error(&e), e))?;
    let mut held = assignments.held();
    info!(set = %args.lock.lock, identity = %identity, shards = count, "campaigning for shards");
    // COMMAND starts with the first share, or after a lease duration with what there is.
    let _ = tokio::time::timeout(args.lease_duration, held.wait_for(|s| !s.held.is_empty())).await;
    let mut generation = 1;
    let mut current = held.borrow_and_update().clone();
    write_atomically(&file, &render(generation, &current)).or_exit(1)?;

    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("KUBE_LEADER_SHARD_SET", list(&current))
        .env("KUBE_LEADER_SHARD_COUNT", count.to_string())
        .env("KUBE_LEADER_SHARDS_FILE", &file)
        .env("KUBE_LEADER_SHARDS_ACK", &ack)
        .env("KUBE_LEADER_SHARDS_SIGNAL", notify.as_str())
        .env("KUBE_LEADER_IDENTITY", &identity)
        .env("KUBE_LEADER_LOCK", &args.lock.lock)
        .env("KUBE_LEADER_NAMESPACE", &namespace)
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            shutdown.cancel();
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            return Err(Fail::new(code, anyhow!(e).context("cannot start COMMAND")));
        }
    };
    let group = Pid::from_raw(child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0));
    info!(shards = %list(&current), generation, "COMMAND started");

    // Held shards by index; shards lost, waiting for COMMAND: index → (generation, give up at).
    let mut guards: BTreeMap<u32, Shard> = BTreeMap::new();
    let mut pending: BTreeMap<u32, (u64, Instant)> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut engine_ended = false;
    // A change written to the file but not yet signalled (COMMAND has no handler yet), since.
    let mut untold: Option<Instant> = None;
    let mut warned = false;
    let code = loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                break match status {
                    Ok(s) => exit_code(s),
                    Err(_) => 1,
                };
            }
            _ = term.recv() => forward(group, Signal::SIGTERM),
            _ = int.recv() => forward(group, Signal::SIGINT),
            _ = quit.recv() => forward(group, Signal::SIGQUIT),
            shard = assignments.next(), if !engine_ended => match shard {
                Some(shard) => {
                    let index = shard.index();
                    if !current.held.contains_key(&index) && !shard.leadership().is_leader() {
                        pending.insert(index, (generation, Instant::now() + grace + Duration::from_secs(1)));
                    }
                    guards.insert(index, shard);
                }
                None => {
                    engine_ended = true;
                    warn!("the shard candidate stopped; stopping COMMAND");
                    forward(group, Signal::SIGTERM);
                    let deadline = Instant::now() + grace;
                    tokio::spawn(async move {
                        tokio::time::sleep_until(deadline).await;
                        let _ = killpg(group, Signal::SIGKILL);
                    });
                }
            },
            Ok(()) = held.changed() => {
                let next = held.borrow_and_update().clone();
                if next.held != current.held {
                    generation += 1;
                    let gone: BTreeSet<u32> = current.held.keys().filter(|i| !next.held.contains_key(i)).copied().collect();
                    for index in gone {
                        pending.insert(index, (generation, Instant::now() + grace + Duration::from_secs(1)));
                    }
                    if let Err(e) = write_atomically(&file, &render(generation, &next)) {
                        warn!(error = %e, file = %file.display(), "cannot write the shard file");
                    }
                    untold.get_or_insert_with(Instant::now);
                    if tell(group, notify, &mut untold) {
                        info!(shards = %list(&next), generation, "shards changed; COMMAND told");
                    } else {
                        info!(shards = %list(&next), generation, signal = notify.as_str(), "shards changed; COMMAND is told once it handles the signal");
                    }
                }
                current = next;
            }
            _ = tick.tick(), if !pending.is_empty() || untold.is_some() => {
                let since = untold;
                if since.is_some() && tell(group, notify, &mut untold) {
                    info!(generation, "COMMAND handles the signal now; told");
                } else if since.is_some_and(|t| !warned && t.elapsed() >= grace) {
                    warned = true;
                    warn!(signal = notify.as_str(), pid = group.as_raw(), "COMMAND neither catches nor ignores the shard signal, so it is not sent (its default action would end COMMAND): install a handler (exec the program from a shell wrapper) or choose --shards-signal");
                }
                let acked = read_ack(&ack);
                let now = Instant::now();
                let done: Vec<u32> = pending
                    .iter()
                    .filter(|(_, (g, until))| *g <= acked || now >= *until)
                    .map(|(i, _)| *i)
                    .collect();
                for index in done {
                    let g = pending.remove(&index).map_or(0, |(g, _)| g);
                    if g > acked {
                        warn!(shard = index, generation = g, "COMMAND did not acknowledge in time; the shard was left to expire");
                    }
                    // Not ours any more, or handed back once COMMAND stopped work on it.
                    if !current.held.contains_key(&index) {
                        guards.remove(&index);
                    }
                }
            }
        }
    };
    info!(code, "COMMAND exited; handing every shard back");
    shutdown.cancel();
    // COMMAND is gone: nothing acts on any shard any more, nor on one acquired meanwhile.
    guards.clear();
    let _ = tokio::time::timeout(args.lease_duration, async {
        while let Some(shard) = assignments.next().await {
            drop(shard);
        }
    })
    .await;
    match tokio::time::timeout(args.renew_deadline, assignments.finish()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            warn!(error = %e, "the shard candidate failed");
            let _ = std::fs::remove_file(&file);
            let _ = std::fs::remove_file(&ack);
            return Err(Fail::new(exit::for_error(&e), e));
        }
        Err(_) => warn!("handing the shards back timed out"),
    }
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&ack);
    Ok(code)
}

/// Sends the change signal to COMMAND's group if COMMAND handles it; clears `untold` if sent.
fn tell(group: Pid, signal: Signal, untold: &mut Option<Instant>) -> bool {
    if group.as_raw() <= 0 || !handles(group, signal) {
        return false;
    }
    forward(group, signal);
    *untold = None;
    true
}

/// Whether sending `signal` to `pid` cannot end it: the process catches or ignores it
/// (`SigCgt`/`SigIgn` in `/proc/PID/status`), or the signal's default action is to ignore it.
fn handles(pid: Pid, signal: Signal) -> bool {
    if matches!(
        signal,
        Signal::SIGCHLD | Signal::SIGURG | Signal::SIGWINCH | Signal::SIGCONT
    ) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| handled_in(&status, signal))
}

/// `handles` on the text of `/proc/PID/status`.
fn handled_in(status: &str, signal: Signal) -> bool {
    let bit = 1u64 << (signal as i32 - 1);
    status
        .lines()
        .filter_map(|l| l.strip_prefix("SigCgt:").or_else(|| l.strip_prefix("SigIgn:")))
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & bit != 0)
}

fn forward(group: Pid, signal: Signal) {
    if group.as_raw() > 0 {
        let _ = killpg(group, signal);
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(255),
        _ => 1,
    }
}

/// Parses `--shards-signal`: `HUP`, `SIGHUP`, `USR1`, ...
pub(crate) fn parse_signal(s: &str) -> Result<Signal, String> {
    let name = s.trim().to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    let sig: Signal = name
        .parse()
        .map_err(|_| format!("unknown signal {s:?} (for example HUP or USR1)"))?;
    if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
        return Err(format!("{s} cannot be caught: use HUP, USR1 or USR2"));
    }
    Ok(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_the_generation_then_each_shard_with_its_token() {
        let set = ShardSet {
            held: BTreeMap::from([(0, 17), (3, 42)]),
            members: 2,
            quota: 2,
        };
        assert_eq!(render(5, &set), "generation 5\n0 17\n3 42\n");
        assert_eq!(list(&set), "0,3");
        assert_eq!(render(1, &ShardSet::default()), "generation 1\n");
    }

    #[test]
    fn files_are_replaced_whole_and_acks_read() {
        let dir = std::env::temp_dir().join(format!("kl-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.shards");
        write_atomically(&f, "generation 1\n").unwrap();
        write_atomically(&f, "generation 2\n0 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "generation 2\n0 1\n");
        let ack = f.with_extension("ack");
        assert_eq!(read_ack(&ack), 0);
        std::fs::write(&ack, "7\n").unwrap();
        assert_eq!(read_ack(&ack), 7);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_signal_is_handled_when_caught_or_ignored() {
        let status =
            "Name:\tsh\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000002\nSigCgt:\t0000000000010001\n";
        assert!(handled_in(status, Signal::SIGHUP)); // caught: bit 0
        assert!(handled_in(status, Signal::SIGINT)); // ignored: bit 1
        assert!(handled_in(status, Signal::SIGCHLD)); // caught: bit 16
        assert!(!handled_in(status, Signal::SIGUSR1));
        assert!(!handled_in("garbage", Signal::SIGHUP));
    }

    #[test]
    fn a_process_handles_the_signal_only_once_its_handler_is_installed() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read _; trap 'echo hup' USR1; echo ready; read _"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert!(!handles(pid, Signal::SIGUSR1), "no trap yet");
        assert!(handles(pid, Signal::SIGWINCH), "ignored by default");
        use std::io::{BufRead, Write};
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        assert!(handles(pid, Signal::SIGUSR1), "trapped");
        drop(stdin);
        child.wait().unwrap();
        assert!(!handles(pid, Signal::SIGUSR1), "gone");
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("HUP"), Ok(Signal::SIGHUP));
        assert_eq!(parse_signal("sigusr1"), Ok(Signal::SIGUSR1));
        assert!(parse_signal("KILL").is_err());
        assert!(parse_signal("nope").is_err());
    }
}
