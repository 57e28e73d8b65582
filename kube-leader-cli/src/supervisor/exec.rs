//! `kube-leader __exec`: the process that becomes COMMAND, and dies with the supervisor.

use std::{os::unix::process::CommandExt as _, process::Stdio};

use nix::{
    sys::{prctl, signal::Signal},
    unistd::getppid,
};
use tracing::error;

use crate::{cli::ExecArgs, exit};

/// `kube-leader __exec --parent <pid> [--wait] -- COMMAND`: dies with the supervisor, waits for
/// its start message (`--wait`), then becomes COMMAND. Returns only if COMMAND is not to start
/// or cannot be executed (the exit code).
pub(crate) fn exec(args: ExecArgs) -> u8 {
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGKILL) {
        error!(error = %e, "cannot ask to die with the supervisor; not starting COMMAND");
        return exit::CANNOT_EXECUTE;
    }
    // The supervisor may have died between the fork and the prctl: nobody would kill us then.
    if getppid().as_raw() != args.parent {
        return exit::LOST;
    }
    let mut env: Vec<(String, String)> = Vec::new();
    if args.wait {
        // Started while kube-leader follows: COMMAND's environment comes when it wins.
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => return 0,
            Ok(_) => match serde_json::from_str(&line) {
                Ok(e) => env = e,
                Err(e) => {
                    error!(error = %e, "unreadable start message from the supervisor");
                    return exit::CANNOT_EXECUTE;
                }
            },
        }
    }
    let (program, rest) = args.command.split_first().expect("clap requires COMMAND");
    let e = std::process::Command::new(program)
        .args(rest)
        .envs(env)
        .stdin(Stdio::null())
        .exec();
    error!(command = ?args.command, error = %e, "cannot start COMMAND");
    match e.kind() {
        std::io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::CANNOT_EXECUTE,
    }
}
