//! Fuzzing of the command line (issue 5): arbitrary flag values and arbitrary argument vectors
//! never panic, and every rejection is a one-line message naming the flag.

use proptest::{prelude::*, strategy::Strategy};

use super::{parse::one_line, *};

/// `PROPTEST_CASES` for a long fuzzing run; 2,000 cases in the test command.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Durations as users (and fuzzers) write them: valid, huge, negative, unit-less, garbage.
fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            0u64..100_000,
            prop::sample::select(vec!["ns", "us", "ms", "s", "m", "h", "d", "w", "y"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        (any::<u64>(), prop::sample::select(vec!["s", "y", "ms", "h"])).prop_map(|(n, u)| format!("{n}{u}")),
        "[0-9]{1,25}(y|d|s)",
        Just("18446744073709551615s".to_string()),
        Just("584942417355y".to_string()),
        Just("-1s".to_string()),
        "[0-9]{0,5}",
        ".{0,12}",
    ]
}

fn addr() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<u16>()).prop_map(|p| format!(":{p}")),
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, p)| format!("{}.{}.{}.{}:{p}", ip[0], ip[1], ip[2], ip[3])),
        ":[0-9]{0,8}",
        ".{0,20}",
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", ".{0,30}", "[a-z]{250,260}"]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn run_flags_parse_and_validate_without_panicking(
        lock in name(),
        ns in name(),
        strategy in prop::sample::select(vec!["lease", "for-life", "raft", ""]),
        lease in duration(),
        renew in duration(),
        retry in duration(),
        grace in duration(),
        connect in duration(),
        status in addr(),
    ) {
        let argv = [
            "kube-leader", "run", "--lock", &lock, "--namespace", &ns, "--strategy", strategy,
            "--lease-duration", &lease, "--renew-deadline", &renew, "--retry-period", &retry,
            "--grace", &grace, "--connect-timeout", &connect, "--status-addr", &status,
            "--", "true",
        ];
        match Cli::try_parse_from(argv) {
            Ok(cli) => {
                let Command::Run(run) = cli.command else {
                    return Err(TestCaseError::fail("not run"));
                };
                if let Err(msg) = run.validate() {
                    prop_assert!(msg.contains("--"), "names no flag: {msg}");
                    prop_assert!(!msg.contains('\n'), "{msg}");
                }
            }
            Err(e) => {
                let msg = one_line(&e);
                prop_assert!(!msg.contains('\n'), "{msg}");
                prop_assert!(!msg.is_empty());
            }
        }
    }

    #[test]
    fn any_timings_validate_without_panicking(
        strategy in prop::sample::select(vec!["lease", "for-life"]),
        lease in duration(),
        renew in duration(),
        retry in duration(),
        grace in duration(),
    ) {
        let argv = [
            "kube-leader", "run", "--lock", "l", "--strategy", strategy, "--lease-duration", &lease,
            "--renew-deadline", &renew, "--retry-period", &retry, "--grace", &grace, "--", "true",
        ];
        match Cli::try_parse_from(argv) {
            Ok(Cli { command: Command::Run(run), .. }) => {
                if let Err(msg) = run.validate() {
                    prop_assert!(msg.contains("--"), "names no flag: {msg}");
                }
            }
            Ok(_) => return Err(TestCaseError::fail("not run")),
            Err(e) => prop_assert!(!one_line(&e).contains('\n')),
        }
    }

    #[test]
    fn arbitrary_argument_vectors_never_panic(words in prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                "run", "status", "rbac", "--lock", "--strategy", "--lease-duration", "--grace",
                "--status-addr", "--", "-n", "-o", "json", "lease", "for-life", "1s", "x",
            ]).prop_map(String::from),
            ".{0,10}",
        ],
        0..12,
    )) {
        let argv = std::iter::once("kube-leader".to_string()).chain(words);
        if let Ok(Cli { command: Command::Run(run), .. }) = Cli::try_parse_from(argv) {
            let _ = run.validate();
        }
    }
}
