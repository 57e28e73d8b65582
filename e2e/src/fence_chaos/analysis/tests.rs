use super::*;

fn lock(rv: u64, holder: &str, token: u64) -> LockVersion {
    LockVersion {
        rv,
        holder: Some(holder.into()),
        token,
        deleted: false,
    }
}

fn version(name: &str, rv: u64, stamp: Option<u64>) -> ObjectVersion {
    ObjectVersion {
        name: name.into(),
        uid: "u".into(),
        rv,
        stamp,
        deleted: false,
        seen_unix_us: 3_000,
    }
}

fn check(name: &str, token: u64, old: u64, lock_version: u64, lock_token: u64) -> Check {
    Check {
        name: name.into(),
        token,
        old_version: Some(old),
        lock_version: Some(lock_version),
        lock_token: Some(lock_token),
        allowed: true,
        at_unix_us: 1_000,
    }
}

/// a leads with token 10, b takes over at 20 (token 20). On the audit twin a's late write at
/// 25 regresses the stamp; on the enforced object a's write checked at lock version 12 (before
/// the move) commits at 21, after it: counted in the window, explained.
#[test]
fn regressions_and_writes_after_the_lock_moved_are_counted_and_explained() {
    let input = Input {
        lock: vec![
            lock(10, "a", 10),
            lock(12, "a", 10),
            lock(20, "b", 20),
            lock(22, "b", 20),
        ],
        objects: vec![
            version("fenced-0", 5, None),
            version("fenced-0", 11, Some(10)),
            version("fenced-0", 21, Some(10)),
            version("fenced-0", 23, Some(20)),
            version("audit-0", 6, None),
            version("audit-0", 13, Some(10)),
            version("audit-0", 24, Some(20)),
            version("audit-0", 25, Some(10)),
        ],
        checks: vec![check("fenced-0", 10, 11, 12, 10)],
        would_refuse: 1,
        ..Input::default()
    };
    let f = analyze(&input);
    assert_eq!(f.transitions, 1);
    assert_eq!(
        f.fenced,
        Landed {
            writes: 3,
            regressions: 0,
            after_lock_moved: 1
        }
    );
    assert_eq!((f.moved_in_window, f.unexplained.len()), (1, 0));
    // The one matched check (at 1 ms) and the watch's sight of its commit (at 3 ms).
    assert_eq!((f.window.n, f.window.p50), (1, 2.0));
    assert_eq!(
        f.audit,
        Landed {
            writes: 3,
            regressions: 1,
            after_lock_moved: 1
        }
    );
    // Without the check that let it through, the late enforced write is not explained.
    let input = Input {
        checks: vec![check("fenced-0", 10, 11, 20, 20)],
        ..input
    };
    assert_eq!(analyze(&input).unexplained.len(), 1);
}

fn write(
    side: &str,
    tick: u64,
    start: u64,
    end: u64,
    outcome: Outcome,
    message: Option<&str>,
) -> WriteRecord {
    WriteRecord {
        identity: "a".into(),
        token: 10,
        side: Side::of(&format!("{side}-0")).unwrap(),
        object: format!("{side}-0"),
        tick,
        start_ns: start,
        end_ns: end,
        end_unix_us: 0,
        outcome,
        rv: None,
        message: message.map(Into::into),
    }
}

#[test]
fn latency_is_paired_per_tick_and_down_spans_are_judged() {
    let ms = 1_000_000;
    let input = Input {
        writes: vec![
            write("fenced", 0, 0, 5 * ms, Outcome::Ok, None),
            write("plain", 0, 0, 2 * ms, Outcome::Ok, None),
            write("fenced", 1, 100 * ms, 104 * ms, Outcome::Ok, None),
            write("plain", 1, 100 * ms, 103 * ms, Outcome::Ok, None),
            write(
                "fenced",
                2,
                200 * ms,
                210 * ms,
                Outcome::Error,
                Some("failed calling webhook x"),
            ),
            write("plain", 2, 200 * ms, 201 * ms, Outcome::Ok, None),
            write(
                "fenced",
                3,
                300 * ms,
                301 * ms,
                Outcome::Refused,
                Some("fenced: update refused"),
            ),
        ],
        down: vec![(150 * ms, 250 * ms)],
        faults: vec![(90 * ms, 110 * ms)],
        ..Input::default()
    };
    let f = analyze(&input);
    assert_eq!(f.added_latency_all.n, 2);
    assert_eq!((f.added_latency.n, f.added_latency.p50), (1, 3.0));
    assert_eq!((f.down_landed, f.down_refused, f.down_plain_landed), (0, 1, 1));
    assert_eq!((f.refused, f.webhook_unreachable), (1, 1));
    assert_eq!(f.refusal_example.as_deref(), Some("fenced: update refused"));
}

/// The Lease taken by an administrator (`steal`) and then by a candidate: one transition.
#[test]
fn the_thief_is_no_candidate() {
    let thief = super::super::history::THIEF;
    let input = Input {
        lock: vec![lock(10, "a", 10), lock(12, thief, 12), lock(20, "b", 20)],
        ..Input::default()
    };
    assert_eq!(analyze(&input).transitions, 1);
}
