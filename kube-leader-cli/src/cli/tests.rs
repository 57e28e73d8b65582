//! Unit tests of the flags, their parsing and validation.

use kube_leader::LeaseConfig;

use super::{parse::one_line, *};

fn args(s: &str) -> Vec<OsString> {
    s.split_whitespace().map(OsString::from).collect()
}

#[test]
fn shards_are_leases_with_a_catchable_signal() {
    let parse = |s: &str| Cli::try_parse_from(args(s));
    let run = |s: &str| {
        let Command::Run(run) = parse(s).unwrap().command else {
            panic!("not run")
        };
        run
    };
    let r = run("kube-leader run --lock l --strategy lease --shards 64 -- true");
    assert_eq!(r.shards, Some(64));
    assert_eq!(r.on_shards_change, crate::cli::OnChange::Restart);
    r.validate().unwrap();
    let r =
        run("kube-leader run --lock l --strategy lease --shards 4 --on-shards-change signal:usr1 -- true");
    assert_eq!(
        r.on_shards_change,
        crate::cli::OnChange::Signal(nix::sys::signal::Signal::SIGUSR1)
    );
    let e = run("kube-leader run --lock l --shards 4 -- true")
        .validate()
        .unwrap_err();
    assert!(e.contains("--shards") && e.contains("--strategy lease"), "{e}");
    for bad in [
        "kube-leader run --lock l --strategy lease --shards 0 -- true",
        "kube-leader run --lock l --strategy lease --shards 4 --on-shards-change signal:KILL -- true",
        "kube-leader run --lock l --strategy lease --shards 4 --on-shards-change hup -- true",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    // Refused, not ignored: they name one lock's leader.
    for (bad, flag) in [
        ("--shards 4 --status-addr :4040", "--status-addr"),
        ("--shards 4 --label-pod", "--label-pod"),
        ("--shards 4 --ready-only-when-leader", "--ready-only-when-leader"),
        ("--on-shards-change signal:HUP", "--on-shards-change"),
    ] {
        let e = run(&format!(
            "kube-leader run --lock l --strategy lease {bad} -- true"
        ))
        .validate()
        .unwrap_err();
        assert!(e.contains(flag), "{bad}: {e}");
    }
}

fn err(s: &str) -> String {
    let e = Cli::try_parse_from(args(s)).unwrap_err();
    one_line(&e)
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
    assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
    assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    assert!(parse_duration("5").unwrap_err().contains("missing unit"));
    assert!(parse_duration("fast").is_err());
    assert!(parse_duration("").is_err());
    assert!(parse_duration("-1s").is_err());
}

#[test]
fn addresses() {
    assert_eq!(parse_addr(":4040").unwrap(), "0.0.0.0:4040".parse().unwrap());
    assert_eq!(
        parse_addr("127.0.0.1:4040").unwrap(),
        "127.0.0.1:4040".parse().unwrap()
    );
    assert_eq!(parse_addr("0.0.0.0:80").unwrap(), "0.0.0.0:80".parse().unwrap());
    assert_eq!(parse_addr("[::1]:80").unwrap(), "[::1]:80".parse().unwrap());
    assert!(parse_addr("localhost").is_err());
    assert!(parse_addr(":http").is_err());
    assert_eq!(
        parse_addr("localhost:4040").unwrap(),
        "127.0.0.1:4040".parse().unwrap()
    );
    assert!(parse_addr("localhost:http").is_err());
}

#[test]
fn run_parses() {
    let cli = Cli::try_parse_from(args(
        "kube-leader run --lock l --strategy lease --lease-duration 2s --renew-deadline 1s \
         --retry-period 200ms --status-addr :0 -- sh -c true",
    ))
    .unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(run.lock.strategy, Strategy::Lease);
    assert_eq!(run.retry_period, Duration::from_millis(200));
    assert_eq!(run.command, args("sh -c true"));
    run.validate().unwrap();
}

#[test]
fn defaults_are_for_life_and_client_go_timings() {
    let cli = Cli::try_parse_from(args("kube-leader run --lock l -- true")).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(run.lock.strategy, Strategy::ForLife);
    assert_eq!(run.lease_config(), LeaseConfig::default());
    assert_eq!(run.grace(), Duration::from_secs(10));
    assert_eq!(run.on_outside_cluster, OutsideClusterArg::Fail);
    assert!(run.status_addr.is_none());
    run.validate().unwrap();
}

#[test]
fn a_lease_grace_defaults_to_what_the_lease_leaves_and_is_bounded_by_it() {
    let run = |s: &str| {
        let Command::Run(run) = Cli::try_parse_from(args(s)).unwrap().command else {
            panic!("not run")
        };
        run
    };
    let r = run("kube-leader run --lock l --strategy lease -- true");
    assert_eq!(r.grace(), Duration::from_secs(5));
    let r = run("kube-leader run --lock l --strategy lease --lease-duration 2s --renew-deadline 1s --retry-period 200ms -- true");
    assert_eq!(r.grace(), Duration::from_secs(1));
    r.validate().unwrap();
    let r = run("kube-leader run --lock l --strategy lease --grace 5s -- true");
    r.validate().unwrap();
    let r = run("kube-leader run --lock l --strategy lease --grace 5001ms -- true");
    let e = r.validate().unwrap_err();
    assert!(
        e.contains("--grace") && e.contains("5.001s") && e.contains("= 5s"),
        "{e}"
    );
    let r = run("kube-leader run --lock l --strategy lease --grace 1m --allow-grace-beyond-lease -- true");
    r.validate().unwrap();
    assert_eq!(r.grace(), Duration::from_secs(60));
    let r = run("kube-leader run --lock l --grace 1m -- true");
    r.validate().unwrap();
}

#[test]
fn usage_errors_are_one_line_and_name_the_flag() {
    let cases = [
        ("kube-leader run --lock l --strategy raft -- true", "--strategy"),
        ("kube-leader run --lock Bad_Name -- true", "--lock"),
        (
            "kube-leader run --lock l --lease-duration 5x -- true",
            "--lease-duration",
        ),
        ("kube-leader run --lock l --bogus -- true", "--bogus"),
        ("kube-leader run --lock l", "COMMAND"),
        ("kube-leader run -- true", "--lock"),
        ("kube-leader status --lock l -o yaml", "--output"),
    ];
    for (cmd, flag) in cases {
        let msg = err(cmd);
        assert!(!msg.contains('\n'), "{cmd}: {msg}");
        assert!(msg.contains(flag), "{cmd}: {msg} should name {flag}");
    }
}

/// Found by fuzzing the flags: a retry period too large to multiply by the jitter factor.
#[test]
fn huge_timings_are_errors_not_panics() {
    for flags in [
        "--retry-period 18446744073709551615s",
        "--renew-deadline 18446744073709551615s --retry-period 584542046090y",
        "--strategy lease --lease-duration 18446744073709551615s --renew-deadline 18446744073709551614s",
    ] {
        let cli = Cli::try_parse_from(args(&format!("kube-leader run --lock l {flags} -- true")));
        if let Ok(Cli {
            command: Command::Run(run),
            ..
        }) = cli
        {
            let _ = run.validate();
        }
    }
}

#[test]
fn timings_are_checked_together() {
    let check = |s: &str| {
        let cli = Cli::try_parse_from(args(s)).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        run.validate()
    };
    let e =
        check("kube-leader run --lock l --strategy lease --lease-duration 1s --renew-deadline 2s -- true")
            .unwrap_err();
    assert!(e.contains("--renew-deadline"), "{e}");
    let e = check("kube-leader run --lock l --renew-deadline 1s --retry-period 1s -- true").unwrap_err();
    assert!(e.contains("--retry-period"), "{e}");
    let e = check("kube-leader run --lock l --strategy lease --lease-duration 0s -- true").unwrap_err();
    assert!(e.contains("--lease-duration"), "{e}");
    check("kube-leader run --lock l --strategy lease --lease-duration 2s --renew-deadline 1s --retry-period 200ms -- true")
        .unwrap();
}

#[test]
fn clap_definition_is_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

#[test]
fn liveness_is_for_life_only_on_by_default_and_off_by_word() {
    let run = |s: &str| {
        let Command::Run(run) = Cli::try_parse_from(args(s)).unwrap().command else {
            panic!("not run")
        };
        run
    };
    let r = run("kube-leader run --lock l -- true");
    assert_eq!(r.liveness(), Some(Duration::from_secs(5)));
    r.validate().unwrap();
    for off in ["off", "0"] {
        let r = run(&format!("kube-leader run --lock l --liveness {off} -- true"));
        assert_eq!(r.liveness(), None, "{off}");
        r.validate().unwrap();
    }
    let r = run("kube-leader run --lock l --liveness 3s -- true");
    assert_eq!(r.liveness(), Some(Duration::from_secs(3)));
    let r = run("kube-leader run --lock l --liveness 500ms -- true");
    assert!(r.validate().unwrap_err().contains("--liveness"));
    let r = run("kube-leader run --lock l --strategy lease -- true");
    assert_eq!(r.liveness(), None, "a Lease has its renewals");
    r.validate().unwrap();
    let r = run("kube-leader run --lock l --strategy lease --liveness 5s -- true");
    assert!(r.validate().unwrap_err().contains("--liveness"));
    assert!(Cli::try_parse_from(args("kube-leader run --lock l --liveness soon -- true")).is_err());
}

#[test]
fn dead_leader_pod_is_for_leader_for_life_only() {
    let run = |s: &str| {
        let Command::Run(run) = Cli::try_parse_from(args(s)).unwrap().command else {
            panic!("not run")
        };
        run
    };
    let r = run("kube-leader run --lock l -- true");
    assert_eq!(r.dead_leader_pod, None);
    r.validate().unwrap();
    for (flag, want) in [
        ("keep", DeadLeaderPodArg::Keep),
        ("delete-evicted", DeadLeaderPodArg::DeleteEvicted),
        ("delete-terminal", DeadLeaderPodArg::DeleteTerminal),
    ] {
        let r = run(&format!(
            "kube-leader run --lock l --dead-leader-pod {flag} -- true"
        ));
        assert_eq!(r.dead_leader_pod, Some(want));
        r.validate().unwrap();
        assert_eq!(
            kube_leader::DeadLeaderPod::from(want),
            match want {
                DeadLeaderPodArg::Keep => kube_leader::DeadLeaderPod::Keep,
                DeadLeaderPodArg::DeleteEvicted => kube_leader::DeadLeaderPod::DeleteEvicted,
                DeadLeaderPodArg::DeleteTerminal => kube_leader::DeadLeaderPod::DeleteTerminal,
            }
        );
    }
    let e = run("kube-leader run --lock l --strategy lease --dead-leader-pod keep -- true")
        .validate()
        .unwrap_err();
    assert!(e.contains("--dead-leader-pod") && e.contains("for-life"), "{e}");
    let e = err("kube-leader run --lock l --dead-leader-pod never -- true");
    assert!(e.contains("never") && e.contains("keep"), "{e}");
}

#[test]
fn elect_takes_runs_candidate_flags_and_no_command() {
    let elect = |s: &str| {
        let Command::Elect(e) = Cli::try_parse_from(args(s)).unwrap().command else {
            panic!("not elect")
        };
        e
    };
    let e = elect("kube-leader elect --lock l");
    assert_eq!(e.status_addr, "0.0.0.0:4040".parse().unwrap());
    assert_eq!(e.lock.strategy, Strategy::ForLife);
    e.validate().unwrap();
    let r = e.as_run();
    assert!(r.command.is_empty() && r.shards.is_none());
    assert_eq!(r.status_addr, Some(e.status_addr));
    // leader-elector's and nais/elector's spelling of the address.
    let e = elect("kube-leader elect --lock l --strategy lease --http localhost:6060");
    assert_eq!(e.status_addr, "127.0.0.1:6060".parse().unwrap());
    // `run`'s rules, naming the flags.
    let e = elect("kube-leader elect --lock l --strategy lease --lease-duration 1s --renew-deadline 2s");
    assert!(e.validate().unwrap_err().contains("--renew-deadline"));
    let e = elect("kube-leader elect --lock l --strategy lease --dead-leader-pod keep");
    assert!(e.validate().unwrap_err().contains("--dead-leader-pod"));
    // No COMMAND.
    assert!(Cli::try_parse_from(args("kube-leader elect --lock l -- true")).is_err());
}

/// Only over kube's HTTP/1.1 client does a follower keep a spare connection warm (a cached read
/// a minute); over HTTP/2 an idle follower sends nothing.
#[test]
fn only_http1_keeps_a_spare_connection_warm() {
    for (flags, keep_warm) in [("", None), ("--http1", LeaseConfig::default().keep_warm)] {
        let line = format!("kube-leader run --strategy lease --lock l {flags} -- true");
        let cli = Cli::try_parse_from(args(&line)).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.options().lease_config().keep_warm, keep_warm, "{line}");
    }
}
