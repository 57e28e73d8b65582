//! `kube-leader`: run any program only while it leads a Kubernetes leader election.
//!
//! ```text
//! kube-leader run --lock NAME [--namespace NS] [--strategy for-life|lease] [--identity ID]
//!                 [--lease-duration 15s] [--renew-deadline 10s] [--retry-period 2s]
//!                 [--status-addr 127.0.0.1:PORT] [--on-outside-cluster skip|fail]
//!                 -- COMMAND [ARGS...]
//! kube-leader elect  --lock NAME [--strategy for-life|lease] [--status-addr :4040]
//! kube-leader status --lock NAME [--namespace NS] [--strategy for-life|lease] [-o text|json]
//! kube-leader rbac   --lock NAME [--namespace NS] [--strategy for-life|lease] [--fence]
//! kube-leader fence  serve|certs|webhooks|check --rules FILE ...
//! ```
//!
//! `run` starts COMMAND through a supervisor process ([`supervisor`]) that stops it even when
//! kube-leader itself is frozen. The runtime is single-threaded: the sidecar does little work,
//! and its memory matters.

mod candidate;
mod cli;
mod client;
mod cluster;
mod elect;
mod exit;
mod fence;
mod install;
mod label;
mod metrics;
mod rbac;
mod run;
mod server;
mod shards;
mod state;
mod status;
mod supervisor;
mod version;

use std::{io::IsTerminal as _, process::ExitCode, time::Duration};

use tracing::{error, level_filters::LevelFilter};
use tracing_subscriber::{
    filter::Targets, layer::SubscriberExt as _, util::SubscriberInitExt as _, Layer as _,
};

use crate::cli::{Command, LogFormat};

/// The default log filter: this binary's lines at `info`; the library's own `info` lines are
/// replaced by the binary's one line per leadership change, its warnings stay. (Targets match
/// by string prefix: `kube` would match `kube_leader` too. The binary's crate is `kube_leader`
/// as well, so the library's modules are named one by one, and `shards` by its engine, the
/// binary having a `shards` of its own; a test checks the list against both crates' sources.)
const DEFAULT_FILTER: &str = "info,kube_leader::lease=warn,kube_leader::for_life=warn,\
kube_leader::shards::engine=warn,kube_leader::successor=warn,kube_leader::unelected=warn,\
kube_leader::events=warn,kube_leader::leadership=warn,kube_leader::lock=warn,\
kube_leader::object_watch=warn,kube_client=warn,kube_runtime=warn";

fn main() -> ExitCode {
    let cli = cli::parse();
    if let Err(msg) = init_logging(cli.log_format) {
        cli::usage_error(&msg);
    }
    let command = match cli.command {
        // No runtime: this process becomes COMMAND at once.
        Command::Exec(args) => return ExitCode::from(supervisor::exec(args)),
        command => command,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(exit::INTERNAL);
        }
    };
    let log_format = cli.log_format;
    let code = runtime.block_on(async move {
        let result = match command {
            Command::Run(args) => match args.shards {
                Some(count) => shards::run(args, count, log_format).await,
                None => run::run(args, log_format).await,
            },
            Command::Elect(args) => elect::elect(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Rbac(args) => Ok(rbac::rbac(&args)),
            Command::Fence(args) => fence::fence(args).await,
            Command::Install(args) => install::install(&args.dir),
            Command::Completions(args) => Ok(cli::completions(args.shell)),
            Command::Supervise(args) => Ok(supervisor::supervise(args, log_format).await),
            Command::Exec(_) => unreachable!("handled before the runtime starts"),
        };
        result.unwrap_or_else(|fail| {
            error!(error = %fail, code = fail.code, "kube-leader failed");
            fail.code
        })
    });
    // Background watches may still run; do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(code)
}

/// Installs the subscriber; an invalid `RUST_LOG` is an error (a typo must not silently turn
/// the logs off or back to the default).
fn init_logging(format: LogFormat) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => parse_filter(&s)?,
        _ => DEFAULT_FILTER
            .parse()
            .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO)),
    };
    let layer = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .init();
    Ok(())
}

/// `RUST_LOG`: comma-separated `level` or `target=level` directives, as in `info,kube_leader=debug`.
fn parse_filter(s: &str) -> Result<Targets, String> {
    s.parse::<Targets>().map_err(|e| {
        format!(
            "invalid RUST_LOG {s:?}: {e}; write levels (error, warn, info, debug, trace) as in \
             RUST_LOG=info or RUST_LOG=info,kube_leader=debug"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module paths of the files under `src` that log (a tracing macro in them).
    fn logging_modules(src: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                // A macro with an explicit `target:` logs under that target, not the module's.
                let logs = ["info!(", "warn!(", "debug!(", "error!(", "trace!("]
                    .iter()
                    .any(|m| {
                        text.match_indices(m)
                            .any(|(i, _)| !text[i + m.len()..].trim_start().starts_with("target:"))
                    });
                if !logs || path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "tests")) {
                    parts.pop();
                }
                out.push(format!("kube_leader::{}", parts.join("::")));
            }
        }
        out
    }

    /// Every library module that logs is quieted to warnings, and none of this binary's is.
    #[test]
    fn the_default_filter_names_every_library_module_that_logs_and_no_module_of_ours() {
        let quiet: Vec<&str> = DEFAULT_FILTER
            .split(',')
            .filter_map(|d| d.strip_suffix("=warn"))
            .filter(|t| t.starts_with("kube_leader::"))
            .collect();
        let covered = |m: &str| quiet.iter().any(|q| m == *q || m.starts_with(&format!("{q}::")));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for m in logging_modules(&root.join("../kube-leader/src")) {
            assert!(
                covered(&m),
                "the library's {m} logs at info under the sidecar: add it to DEFAULT_FILTER"
            );
        }
        for m in logging_modules(&root.join("src")) {
            assert!(!covered(&m), "DEFAULT_FILTER quiets the binary's own {m}");
        }
    }

    #[test]
    fn rust_log_is_checked() {
        assert!(parse_filter("info").is_ok());
        assert!(parse_filter("info,kube_leader=debug").is_ok());
        assert!(parse_filter(DEFAULT_FILTER).is_ok());
        let e = parse_filter("kube_leader=loud").unwrap_err();
        assert!(
            e.contains("invalid RUST_LOG") && e.contains("RUST_LOG=info"),
            "{e}"
        );
    }
}
