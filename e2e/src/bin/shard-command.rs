//! COMMAND of `kube-leader run --shards M` in the chaos run of the shards sidecar: it works
//! the shards of its set (`KUBE_LEADER_SHARD_SET`) from its start until it is stopped, and
//! says so as JSON lines on stdout, with CLOCK_MONOTONIC nanoseconds.
//!
//! ```text
//! shard-command
//! ```
//!
//! Events: `command_started` (`pid`, `shards`, `tokens`: each shard's fencing token from
//! `KUBE_LEADER_SHARDS_FILE`, `identity`) once it works its set, and
//! `command_stopped` (`pid`, `signal`) when SIGTERM, SIGINT or SIGQUIT arrives, right before it
//! exits 0. A COMMAND killed (SIGKILL) says nothing: the harness watches its pid.

use std::io::Write as _;

use kube_leader_e2e::mono_ns;
use nix::sys::signal::{SigSet, Signal};
use serde_json::{json, Value};

fn emit(mut v: Value) {
    v["mono_ns"] = json!(mono_ns());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn main() {
    // Blocked before the start is said: a stop signal is then waited for, never lost.
    let mut stops = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT] {
        stops.add(s);
    }
    if let Err(e) = stops.thread_block() {
        eprintln!("shard-command: cannot block the stop signals: {e}");
        std::process::exit(1);
    }
    let shards: Vec<u32> = std::env::var("KUBE_LEADER_SHARD_SET")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // Restart mode: the file is written before COMMAND starts and not again while it runs.
    let tokens: serde_json::Map<String, Value> = std::env::var_os("KUBE_LEADER_SHARDS_FILE")
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (index, token) = l.split_once(' ')?;
            let index: u32 = index.parse().ok()?;
            Some((index.to_string(), json!(token.trim().parse::<u64>().ok()?)))
        })
        .collect();
    let identity = std::env::var("KUBE_LEADER_IDENTITY").unwrap_or_default();
    let pid = std::process::id();
    emit(
        json!({"event": "command_started", "pid": pid, "shards": shards, "tokens": tokens,
        "identity": identity}),
    );
    let signal = stops.wait().map_or(0, |s| s as i32);
    emit(json!({"event": "command_stopped", "pid": pid, "signal": signal, "identity": identity}));
}
