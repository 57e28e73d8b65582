//! Parsing the command line: flags from the command line, else from `KUBE_LEADER_<FLAG>`
//! environment variables; usage errors on one line.

use std::ffi::OsString;

use clap::{error::ErrorKind, CommandFactory as _, FromArgMatches as _};

use super::{Cli, Command};
use crate::exit;

/// Parses the command line; on a usage error prints one line naming the flag and exits with
/// [`exit::USAGE`].
pub(crate) fn parse() -> Cli {
    parse_from(std::env::args_os())
}

fn parse_from(args: impl IntoIterator<Item = OsString>) -> Cli {
    let cli = match try_parse_with_env(args) {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => usage_error(&one_line(&e)),
    };
    let checked = match &cli.command {
        Command::Run(run) => run.validate(),
        Command::Elect(elect) => elect.validate(),
        Command::Rbac(rbac) => rbac.validate(),
        _ => Ok(()),
    };
    if let Err(msg) = checked {
        usage_error(&msg);
    }
    cli
}

// === environment variables ===

/// The prefix of the environment variables that set `run`'s flags.
pub(crate) const ENV_PREFIX: &str = "KUBE_LEADER_";

/// The command line definition, with every flag of `run` and `elect`, `--http1` and
/// `--elector-service-account` of `status` and the global
/// `--log-format` also read from `KUBE_LEADER_<FLAG>` (`--lease-duration`:
/// `KUBE_LEADER_LEASE_DURATION`; `--http1`: `KUBE_LEADER_HTTP1`), shown in `--help`. Added here rather than flag by flag, so that no flag can be forgotten. Boolean
/// flags take true/false, 1/0, yes/no, on/off.
pub(crate) fn command() -> clap::Command {
    fn with_env(arg: clap::Arg) -> clap::Arg {
        // COMMAND (positional) and help/version take no environment variable.
        if arg.is_positional()
            || matches!(
                arg.get_action(),
                clap::ArgAction::Help
                    | clap::ArgAction::HelpLong
                    | clap::ArgAction::HelpShort
                    | clap::ArgAction::Version
            )
        {
            return arg;
        }
        let name = format!(
            "{ENV_PREFIX}{}",
            arg.get_id().as_str().to_uppercase().replace('-', "_")
        );
        let arg = arg.env(name);
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            arg.value_parser(clap::builder::BoolishValueParser::new())
        } else {
            arg
        }
    }
    Cli::command()
        .mut_arg("log_format", with_env)
        .mut_subcommand("run", |run| run.mut_args(with_env))
        .mut_subcommand("elect", |elect| elect.mut_args(with_env))
        .mut_subcommand("status", |status| {
            status
                .mut_arg("http1", with_env)
                .mut_arg("elector_service_account", with_env)
        })
}

/// Parses `args` with [`command`]: flags from the command line, else from the environment.
pub(crate) fn try_parse_with_env(args: impl IntoIterator<Item = OsString>) -> Result<Cli, clap::Error> {
    let mut command = command();
    let matches = command.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// `kube-leader completions SHELL`: the script on stdout; exit code 0.
pub(crate) fn completions(shell: clap_complete::Shell) -> u8 {
    clap_complete::generate(shell, &mut command(), "kube-leader", &mut std::io::stdout());
    0
}

/// Prints `msg` as a usage error on one line and exits with [`exit::USAGE`].
pub(crate) fn usage_error(msg: &str) -> ! {
    eprintln!("kube-leader: error: {msg} (see kube-leader --help)");
    std::process::exit(i32::from(exit::USAGE));
}

/// Clap's error on one line: the message without "error:", the usage block or tips.
pub(super) fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
    }
    let mut msg = parts.join(" ");
    if e.kind() == ErrorKind::MissingRequiredArgument && msg.contains("<COMMAND>") {
        msg = "missing COMMAND: give the program to run after `--`, as in \
               `kube-leader run --lock NAME -- COMMAND [ARGS...]`"
            .into();
    }
    msg
}
