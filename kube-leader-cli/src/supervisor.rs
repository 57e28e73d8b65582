//! The fail-safe supervisor: a small process between `kube-leader run` and COMMAND.
//!
//! A paused process cannot stop anything (SIGSTOP freezes every thread of it), so the deadline
//! that keeps COMMAND from outliving leadership is enforced outside kube-leader's process:
//! `kube-leader run` re-executes itself as `kube-leader __supervise`, which starts COMMAND and
//! stops it (SIGTERM, `--grace`, SIGKILL, to COMMAND's whole process group) as soon as
//!
//! - kube-leader says so (leadership lost),
//! - kube-leader's heartbeats stop: each heartbeat says until when leadership is confirmed, as
//!   an absolute CLOCK_MONOTONIC instant (for a lease: the renew deadline counted from when the
//!   last successful renewal, or the acquiring write, was sent), and the supervisor stops
//!   COMMAND when that instant passes without a newer heartbeat. Both processes read the same
//!   clock, so a heartbeat read late (the supervisor was frozen, or busy) cannot confirm
//!   leadership for longer than it was confirmed when written; or
//! - kube-leader dies (the control socket closes).
//!
//! COMMAND must not outlive the supervisor either: the supervisor starts
//! `kube-leader __exec --parent <pid> -- COMMAND`, which sets `PR_SET_PDEATHSIG` (SIGKILL),
//! checks that its parent is still the supervisor, and executes COMMAND in its place (the
//! parent-death signal survives `execve` for binaries that gain no privileges). The signal
//! follows the thread that forked: the supervisor runs a current-thread runtime and spawns
//! from it, the process's main thread, which lives as long as the process. If the supervisor
//! dies (SIGKILL), COMMAND is killed at once; kube-leader, told nothing, treats it as a loss
//! (exit 124) and does not release the lock.
//!
//! Three process groups: kube-leader's (what a terminal or a process manager signals), the
//! supervisor's own, and COMMAND's. A stop or kill of kube-leader's group (Ctrl-Z, `kill -STOP
//! -PGID`, `kill -9 -PGID`) leaves the supervisor running: it stops COMMAND when the heartbeats
//! stop or the socket closes. A supervisor stopped on its own (SIGSTOP, a debugger) cannot
//! stop anything, so kube-leader enforces the same deadline itself (the backstop in
//! [`Control`]): COMMAND still running at the last confirmed instant + grace is killed by
//! kube-leader. A tree frozen as a whole kills COMMAND as soon as it thaws past the deadline
//! (SIGKILL at once, no SIGTERM first): measured 6 ms after the thaw in
//! `a_frozen_tree_thawed_after_the_deadline_kills_command_first`.
//!
//! Both kube-leader and the supervisor are child subreapers (`PR_SET_CHILD_SUBREAPER`): what
//! COMMAND leaves behind (a double fork, a daemon) is re-parented to them rather than to init,
//! reaped when it exits, and killed with COMMAND's process group when COMMAND exits.
//!
//! The control channel is a Unix socket pair that is the supervisor's stdin; COMMAND gets
//! `/dev/null` as stdin and inherits stdout and stderr. Messages are lines:
//!
//! | direction            | line            | meaning                                                 |
//! |----------------------|-----------------|---------------------------------------------------------|
//! | kube-leader → sup.   | `start <json>`  | start COMMAND: its environment, and `until` (as below)  |
//! | kube-leader → sup.   | `until <ns>`    | leadership confirmed until CLOCK_MONOTONIC `<ns>`       |
//! | kube-leader → sup.   | `stop`          | leadership lost: SIGTERM, grace, SIGKILL                |
//! | kube-leader → sup.   | `signal <n>`    | forward signal `<n>` to COMMAND's process group         |
//! | sup. → kube-leader   | `started <pid>` | COMMAND runs (its pid is its process group)             |
//! | sup. → kube-leader   | `expired <ms>`  | no heartbeat in time; stopping COMMAND                  |
//! | sup. → kube-leader   | `failed <code>` | COMMAND could not be started                            |
//! | sup. → kube-leader   | `exited <code>` | the last line: COMMAND and what it left are gone        |
//!
//! kube-leader starts its supervisor while it still follows, and the supervisor starts
//! COMMAND's process (`__exec --wait`) in advance: winning costs the `start` message, one line
//! on a pipe and COMMAND's own `execve`. The supervisor exits with COMMAND's exit code
//! (128+N for signal N), after `exited`. COMMAND runs in its own process group, so that a
//! terminal's Ctrl-C reaches it once (forwarded); after COMMAND exits, whatever is left of its
//! group, and every process re-parented to the supervisor, is killed.
//!
//! Layout: `process` is the supervisor process, `exec` the process that becomes COMMAND,
//! `control` kube-leader's side of the socket, `supervised` COMMAND under its supervisor as
//! both run loops see it, `protocol` its lines, `clock` the instants
//! they carry, `reap` the reaping and killing of processes.

use tokio::signal::unix::SignalKind;

/// Signals kube-leader forwards to COMMAND (and the supervisor itself ignores).
pub(crate) const FORWARDED: [SignalKind; 6] = [
    SignalKind::terminate(),
    SignalKind::interrupt(),
    SignalKind::hangup(),
    SignalKind::quit(),
    SignalKind::user_defined1(),
    SignalKind::user_defined2(),
];

mod clock;
mod control;
mod exec;
mod process;
mod protocol;
mod reap;
mod supervised;

pub(crate) use control::{Control, Launch, Report, Supervisor, SupervisorProcess};
pub(crate) use exec::exec;
pub(crate) use process::supervise;
pub(crate) use reap::{become_subreaper, reap_orphans};
pub(crate) use supervised::{Ended, Event, Stop, Supervised};
