//! The command line's conventions, tested on the real binary (no cluster needed): flags from
//! `KUBE_LEADER_*` environment variables, `--version`, shell completions, a strict `RUST_LOG`,
//! `--not-ready-takeover`.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kube-leader");

/// `kube-leader ARGS` with `env`, no cluster configuration and no `KUBE_LEADER_*`, `RUST_LOG`,
/// `POD_*` from the test's own environment.
fn kube_leader(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("KUBE_LEADER_") || k == "RUST_LOG" || k.starts_with("POD_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .env("KUBECONFIG", "/nonexistent")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_run_flag_has_an_environment_variable_listed_in_help() {
    let help = stdout(&kube_leader(&["run", "--help"], &[]));
    let flags: Vec<&str> = help
        .lines()
        .filter(|l| l.trim_start().starts_with('-'))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
        .map(|f| f.trim_end_matches(','))
        .filter(|f| *f != "--help" && *f != "--version")
        .collect();
    assert!(flags.len() >= 15, "too few flags found in:\n{help}");
    for flag in flags {
        let var = format!(
            "KUBE_LEADER_{}",
            flag.trim_start_matches("--").to_uppercase().replace('-', "_")
        );
        assert!(
            help.contains(&format!("[env: {var}=")),
            "run --help lists no {var} for {flag}:\n{help}"
        );
    }
}

#[test]
fn flags_come_from_the_environment_and_the_command_line_wins() {
    // A bad value from the environment is a usage error naming the flag: the variable was read.
    let out = kube_leader(
        &["run", "--lock", "l", "--", "true"],
        &[("KUBE_LEADER_LEASE_DURATION", "fast")],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr(&out).contains("--lease-duration"), "{}", stderr(&out));
    // The lock from the environment: the run gets past parsing (and fails on the cluster, 123).
    let out = kube_leader(
        &["run", "--connect-timeout", "1s", "--", "true"],
        &[
            ("KUBE_LEADER_LOCK", "from-env"),
            ("KUBE_LEADER_STRATEGY", "lease"),
        ],
    );
    assert_eq!(out.status.code(), Some(123), "{}", stderr(&out));
    // Checked together with the other timings, whatever their source.
    let out = kube_leader(
        &["run", "--lock", "l", "--", "true"],
        &[
            ("KUBE_LEADER_STRATEGY", "lease"),
            ("KUBE_LEADER_LEASE_DURATION", "2s"),
            ("KUBE_LEADER_RENEW_DEADLINE", "5s"),
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr(&out).contains("--renew-deadline"), "{}", stderr(&out));
    // The command line wins over the environment.
    let out = kube_leader(
        &[
            "run",
            "--lock",
            "l",
            "--lease-duration",
            "20s",
            "--connect-timeout",
            "1s",
            "--",
            "true",
        ],
        &[
            ("KUBE_LEADER_LEASE_DURATION", "fast"),
            ("KUBE_LEADER_STRATEGY", "lease"),
        ],
    );
    assert_eq!(out.status.code(), Some(123), "{}", stderr(&out));
    // Switches take the usual spellings; anything else is an error naming the flag.
    let out = kube_leader(
        &["run", "--lock", "l", "--connect-timeout", "1s", "--", "true"],
        &[
            ("KUBE_LEADER_LABEL_POD", "yes"),
            ("KUBE_LEADER_STRATEGY", "lease"),
        ],
    );
    assert_eq!(out.status.code(), Some(123), "{}", stderr(&out));
    let out = kube_leader(
        &["run", "--lock", "l", "--", "true"],
        &[("KUBE_LEADER_LABEL_POD", "maybe")],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr(&out).contains("--label-pod"), "{}", stderr(&out));
    // The global log format too.
    let out = kube_leader(
        &["run", "--lock", "l", "--", "true"],
        &[("KUBE_LEADER_LOG_FORMAT", "xml")],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr(&out).contains("--log-format"), "{}", stderr(&out));
}

#[test]
fn version_names_the_commit_and_the_kubernetes_versions() {
    let out = kube_leader(&["--version"], &[]);
    assert!(out.status.success());
    let text = stdout(&out);
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("kube-leader {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let commit = first.rsplit(' ').next().unwrap().trim_end_matches(')');
    assert!(
        commit == "unknown" || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{text}"
    );
    // Built from this git checkout: the commit is HEAD's (or HEAD moved since the build).
    if let Ok(head) = Command::new("git").args(["rev-parse", "HEAD"]).output() {
        let head = String::from_utf8_lossy(&head.stdout);
        if head.len() >= 12 && commit != "unknown" {
            assert!(
                git_knows(commit),
                "commit {commit} of --version is not in this repository (HEAD {head})"
            );
        }
    }
    assert!(
        text.contains("Kubernetes: 1.34 to 1.37 (tested against 1.37.2 and 1.34.4)"),
        "{text}"
    );
    assert!(text.contains("coordination.k8s.io/v1"), "{text}");
    // Subcommands say the same.
    let sub = stdout(&kube_leader(&["run", "--version"], &[]));
    assert!(sub.contains("Kubernetes: 1.34 to 1.37"), "{sub}");
}

fn git_knows(commit: &str) -> bool {
    Command::new("git")
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef kube-leader"),
        ("fish", "complete -c kube-leader"),
        ("elvish", "kube-leader"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let out = kube_leader(&["completions", shell], &[]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        assert!(script.contains("lease-duration"), "{shell}: run's flags missing");
        assert!(
            script.contains("not-ready-takeover"),
            "{shell}: run's flags missing"
        );
    }
    let out = kube_leader(&["completions", "tcsh"], &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("SHELL") || stderr(&out).contains("tcsh"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_invalid_rust_log_is_a_usage_error() {
    let out = kube_leader(&["rbac", "--lock", "l"], &[("RUST_LOG", "kube_leader=loud")]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("invalid RUST_LOG") && err.contains("kube_leader=loud"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // A valid one, or an empty one, is fine.
    for ok in ["debug", "info,kube_leader=trace", ""] {
        let out = kube_leader(&["rbac", "--lock", "l"], &[("RUST_LOG", ok)]);
        assert!(out.status.success(), "RUST_LOG={ok:?}: {}", stderr(&out));
    }
}

#[test]
fn not_ready_takeover_states_its_risk_and_is_for_leader_for_life_only() {
    let help = stdout(&kube_leader(&["run", "--help"], &[]));
    assert!(help.contains("--not-ready-takeover <DURATION>"), "{help}");
    assert!(help.contains("TWO LEADERS"), "{help}");
    let out = kube_leader(
        &[
            "run",
            "--lock",
            "l",
            "--strategy",
            "lease",
            "--not-ready-takeover",
            "5m",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr(&out).contains("--not-ready-takeover"), "{}", stderr(&out));
    let out = kube_leader(
        &["run", "--lock", "l", "--not-ready-takeover", "0s", "--", "true"],
        &[],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let out = kube_leader(
        &["run", "--lock", "l", "--not-ready-takeover", "soon", "--", "true"],
        &[],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr(&out).contains("--not-ready-takeover"), "{}", stderr(&out));
}
