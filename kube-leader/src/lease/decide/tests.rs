//! Unit tests of `decide`.

use super::*;

const D: Duration = Duration::from_secs(15);

fn rec(holder: Option<&str>, secs: Option<u64>, transitions: u32) -> LeaseRecord {
    LeaseRecord {
        holder: holder.map(String::from),
        lease_duration: secs.map(Duration::from_secs),
        transitions,
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn absent_is_created() {
    assert_eq!(decide(None, "me", Instant::now(), D), Decision::Create);
}

#[tokio::test(start_paused = true)]
async fn expiry_uses_the_local_observation_and_the_advertised_duration() {
    let t0 = Instant::now();
    let obs = Observed::update(None, rec(Some("other"), Some(2), 3), Some("1".into()), t0);
    assert_eq!(
        decide(Some(&obs), "me", t0, D),
        Decision::WaitUntil(t0 + Duration::from_secs(2))
    );
    tokio::time::advance(Duration::from_millis(1999)).await;
    assert!(matches!(
        decide(Some(&obs), "me", Instant::now(), D),
        Decision::WaitUntil(_)
    ));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(decide(Some(&obs), "me", Instant::now(), D), Decision::Takeover);
}

#[tokio::test(start_paused = true)]
async fn missing_duration_falls_back_to_ours() {
    let t0 = Instant::now();
    let obs = Observed::update(None, rec(Some("other"), None, 0), None, t0);
    assert_eq!(decide(Some(&obs), "me", t0, D), Decision::WaitUntil(t0 + D));
}

#[tokio::test(start_paused = true)]
async fn released_lease_is_taken_at_once() {
    let t0 = Instant::now();
    let obs = Observed::update(None, rec(None, Some(1), 5), None, t0);
    assert_eq!(decide(Some(&obs), "me", t0, D), Decision::Takeover);
    let r = record_for(&Decision::Takeover, Some(&obs), "me", D, now());
    assert_eq!(r.transitions, 6);
    assert_eq!(r.holder.as_deref(), Some("me"));
}

#[tokio::test(start_paused = true)]
async fn own_record_is_renewed_without_a_transition() {
    let t0 = Instant::now();
    let mut held = rec(Some("me"), Some(15), 9);
    held.acquire_time = Some(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let obs = Observed::update(None, held, None, t0).written_by_me(true);
    assert_eq!(decide(Some(&obs), "me", t0, D), Decision::Renew);
    let r = record_for(&Decision::Renew, Some(&obs), "me", D, now());
    assert_eq!(r.transitions, 9);
    assert_eq!(r.acquire_time, Some(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
}

/// Issue 16: two processes with one identity. A record held under our identity that this
/// process did not write is waited out as another holder's; never renewed at once.
#[tokio::test(start_paused = true)]
async fn a_record_under_our_identity_written_by_another_process_is_waited_out() {
    let t0 = Instant::now();
    let twin = Observed::update(None, rec(Some("me"), Some(2), 3), None, t0);
    assert_eq!(
        decide(Some(&twin), "me", t0, D),
        Decision::WaitUntil(t0 + Duration::from_secs(2))
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(decide(Some(&twin), "me", Instant::now(), D), Decision::Takeover);
    let taken = record_for(&Decision::Takeover, Some(&twin), "me", D, now());
    assert_eq!(taken.transitions, 4, "a takeover from the twin is a new term");
}

#[tokio::test(start_paused = true)]
async fn observation_time_moves_only_when_the_record_changes() {
    let t0 = Instant::now();
    let a = Observed::update(None, rec(Some("x"), Some(2), 1), Some("1".into()), t0);
    tokio::time::advance(Duration::from_secs(1)).await;
    let t1 = Instant::now();
    // Same record, new resourceVersion (someone edited a label): the lease was not renewed.
    let b = Observed::update(Some(&a), rec(Some("x"), Some(2), 1), Some("2".into()), t1);
    assert_eq!(b.observed_at, t0);
    assert_eq!(b.resource_version.as_deref(), Some("2"));
    let mut renewed = rec(Some("x"), Some(2), 1);
    renewed.renew_time = Some(now());
    let c = Observed::update(Some(&b), renewed, Some("3".into()), t1);
    assert_eq!(c.observed_at, t1);
}

#[tokio::test(start_paused = true)]
async fn takeover_of_expired_counts_a_transition_and_create_starts_at_zero() {
    let t0 = Instant::now();
    let obs = Observed::update(None, rec(Some("old"), Some(1), 2), None, t0);
    tokio::time::advance(Duration::from_secs(2)).await;
    let d = decide(Some(&obs), "me", Instant::now(), D);
    assert_eq!(d, Decision::Takeover);
    assert_eq!(record_for(&d, Some(&obs), "me", D, now()).transitions, 3);
    assert_eq!(record_for(&Decision::Create, None, "me", D, now()).transitions, 0);
}

/// Found by the chaos run (issue 5): after an administrator deleted the Lease, a candidate
/// created it at once while the holder, whose watch was a few milliseconds late, still led.
#[tokio::test(start_paused = true)]
async fn a_deleted_lease_of_another_holder_is_waited_out() {
    let t0 = Instant::now();
    let held = Observed::update(None, rec(Some("other"), Some(2), 4), None, t0);
    let expiry = t0 + Duration::from_secs(2);
    assert_eq!(decide_absent(Absent::Never, "me", t0, D), Decision::Create);
    assert_eq!(
        decide_absent(Absent::Deleted(&held), "me", t0, D),
        Decision::WaitUntil(expiry)
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        decide_absent(Absent::Deleted(&held), "me", Instant::now(), D),
        Decision::Create
    );
    // Our own deleted lease (we know we stopped), or a released one: at once.
    let ours = Observed::update(None, rec(Some("me"), Some(2), 4), None, Instant::now()).written_by_me(true);
    assert_eq!(
        decide_absent(Absent::Deleted(&ours), "me", Instant::now(), D),
        Decision::Create
    );
    // Held under our identity by another process: waited out like any other holder.
    let twin = Observed::update(None, rec(Some("me"), Some(2), 4), None, Instant::now());
    assert!(matches!(
        decide_absent(Absent::Deleted(&twin), "me", Instant::now(), D),
        Decision::WaitUntil(_)
    ));
    let free = Observed::update(None, rec(None, Some(2), 4), None, Instant::now());
    assert_eq!(
        decide_absent(Absent::Deleted(&free), "me", Instant::now(), D),
        Decision::Create
    );
}

/// Found by the chaos run too: a candidate that had seen the Lease, then campaigned again
/// after a pause and found it deleted without seeing by whom it was held last, created it at
/// once beside the holder. Whoever held it is unknown: a whole lease duration is waited.
#[tokio::test(start_paused = true)]
async fn a_lease_gone_unseen_is_waited_out_for_a_lease_duration() {
    let since = Instant::now();
    assert_eq!(
        decide_absent(Absent::Unknown { since }, "me", since, D),
        Decision::WaitUntil(since + D)
    );
    tokio::time::advance(D).await;
    assert_eq!(
        decide_absent(Absent::Unknown { since }, "me", Instant::now(), D),
        Decision::Create
    );
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Properties of the pure decision (issue 5, item 4), over arbitrary records and instants.
mod props {
    use k8s_openapi::jiff::Timestamp;
    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn holder() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            Just(None),
            Just(Some("me".to_string())),
            Just(Some("other".to_string())),
            "[a-z]{1,3}".prop_map(Some)
        ]
    }

    fn advertised() -> impl Strategy<Value = Option<Duration>> {
        prop_oneof![
            Just(None),
            (1u64..=3600).prop_map(|s| Some(Duration::from_secs(s))),
            Just(Some(Duration::from_secs(i32::MAX as u64))),
        ]
    }

    fn time() -> impl Strategy<Value = Option<Timestamp>> {
        prop::option::of((0i64..4_000_000_000).prop_map(|s| Timestamp::from_second(s).unwrap()))
    }

    fn transitions() -> impl Strategy<Value = u32> {
        // Parsed from an int32: never above i32::MAX.
        prop_oneof![
            Just(0),
            Just(i32::MAX as u32 - 1),
            0u32..1000,
            0..=i32::MAX as u32
        ]
    }

    prop_compose! {
        fn record()(holder in holder(), lease_duration in advertised(), transitions in transitions(),
                    acquire_time in time(), renew_time in time()) -> LeaseRecord {
            LeaseRecord { holder, lease_duration, acquire_time, renew_time, transitions }
        }
    }

    fn stored_transitions(r: &LeaseRecord) -> Option<i32> {
        let mut spec = k8s_openapi::api::coordination::v1::LeaseSpec::default();
        r.write_to(&mut spec, 1);
        spec.lease_transitions
    }

    proptest! {
        #![proptest_config(crate::proptest_config(3000))]

        /// A foreign holder is never taken over before the observation plus its advertised
        /// duration (ours if it advertised none); a free lease is taken, our own renewed.
        #[test]
        fn never_takes_over_a_valid_foreign_lease(
            rec in record(), observed in 0u64..100_000, now in 0u64..200_000, fallback in 1000u64..100_000,
            mine: bool,
        ) {
            let base = Instant::now();
            let obs = Observed::update(None, rec.clone(), Some("1".into()), base + ms(observed))
                .written_by_me(mine);
            let now = base + ms(now);
            let decision = decide(Some(&obs), "me", now, ms(fallback));
            let expiry = base + ms(observed) + rec.lease_duration.unwrap_or(ms(fallback));
            match rec.holder.as_deref() {
                None => prop_assert_eq!(decision, Decision::Takeover),
                Some("me") if mine => prop_assert_eq!(decision, Decision::Renew),
                Some(_) if now < expiry => prop_assert_eq!(decision, Decision::WaitUntil(expiry)),
                Some(_) => prop_assert_eq!(decision, Decision::Takeover),
            }
            prop_assert_eq!(decide(None, "me", now, ms(fallback)), Decision::Create);
        }

        /// Over any sequence of watch events, the observation time is when the record last
        /// changed (a new resourceVersion alone does not renew), so no takeover happens
        /// within the advertised duration after the last change this candidate saw.
        #[test]
        fn expiry_counts_from_the_last_change_seen(
            pool in prop::collection::vec(record(), 1..4),
            steps in prop::collection::vec((0usize..4, 0u64..3000), 1..30),
            after in 0u64..10_000,
        ) {
            let base = Instant::now();
            let mut t = base;
            let mut obs: Option<Observed> = None;
            let mut last_change = base;
            for (i, (pick, dt)) in steps.iter().enumerate() {
                t += ms(*dt);
                let rec = pool[pick % pool.len()].clone();
                if obs.as_ref().is_none_or(|o| o.record != rec) {
                    last_change = t;
                }
                let next = Observed::update(obs.as_ref(), rec.clone(), Some(i.to_string()), t);
                prop_assert_eq!(next.resource_version.clone(), Some(i.to_string()));
                prop_assert_eq!(next.observed_at, last_change);
                obs = Some(next);
            }
            let obs = obs.unwrap();
            let now = t + ms(after);
            let fallback = ms(15_000);
            let decision = decide(Some(&obs), "me", now, fallback);
            // Not written by this process (the default): "me" counts as foreign too.
            let foreign = obs.record.holder.is_some();
            if foreign && now < last_change + obs.record.lease_duration.unwrap_or(fallback) {
                prop_assert!(matches!(decision, Decision::WaitUntil(_)), "{:?}", decision);
            }
        }

        /// What each decision writes: a renewal keeps acquireTime and leaseTransitions; a
        /// takeover counts exactly one transition; every write names us, our duration and now.
        #[test]
        fn records_written(rec in record(), ours in 1u64..3600, wall in 0i64..4_000_000_000) {
            let obs = Observed::update(None, rec.clone(), None, Instant::now());
            let wall = Timestamp::from_second(wall).unwrap();
            let ours = Duration::from_secs(ours);
            for decision in [Decision::Create, Decision::Takeover, Decision::Renew] {
                let observed = (decision != Decision::Create).then_some(&obs);
                let w = record_for(&decision, observed, "me", ours, wall);
                prop_assert_eq!(w.holder.as_deref(), Some("me"));
                prop_assert_eq!(w.lease_duration, Some(ours));
                prop_assert_eq!(w.renew_time, Some(wall));
                match decision {
                    Decision::Create => {
                        prop_assert_eq!(w.transitions, 0);
                        prop_assert_eq!(w.acquire_time, Some(wall));
                    }
                    Decision::Takeover => {
                        prop_assert_eq!(w.transitions, rec.transitions + 1);
                        prop_assert_eq!(w.acquire_time, Some(wall));
                        // As stored: leaseTransitions is an int32, so the count cannot go
                        // past i32::MAX (see the report of issue 5: fencing tokens stop
                        // growing there).
                        if rec.transitions < i32::MAX as u32 {
                            prop_assert_eq!(stored_transitions(&w), Some(rec.transitions as i32 + 1));
                        }
                    }
                    _ => {
                        prop_assert_eq!(w.transitions, rec.transitions);
                        prop_assert_eq!(stored_transitions(&w), Some(rec.transitions as i32));
                        prop_assert_eq!(w.acquire_time, rec.acquire_time.or(Some(wall)));
                    }
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_that_prefers_another_is_deferred_briefly() {
    let t0 = Instant::now();
    let wait = Duration::from_secs(2);
    let obs = Observed::update(None, rec(None, Some(1), 5), None, t0).preferring(Some("young".into()));
    let d = decide(Some(&obs), "old", t0, D);
    assert_eq!(
        defer_to_preferred(d.clone(), &obs, "old", t0, wait),
        Decision::WaitUntil(t0 + wait)
    );
    assert_eq!(
        defer_to_preferred(d.clone(), &obs, "young", t0, wait),
        Decision::Takeover,
        "the preferred one at once"
    );
    tokio::time::advance(wait).await;
    let d = decide(Some(&obs), "old", Instant::now(), D);
    assert_eq!(
        defer_to_preferred(d, &obs, "old", Instant::now(), wait),
        Decision::Takeover,
        "only briefly"
    );
    // An expired (crashed) holder is never deferred: no preference on a held record.
    let held =
        Observed::update(None, rec(Some("gone"), Some(1), 5), None, t0).preferring(Some("young".into()));
    assert_eq!(held.preferred, None);
    let d = decide(Some(&held), "old", Instant::now(), D);
    assert_eq!(
        defer_to_preferred(d, &held, "old", Instant::now(), wait),
        Decision::Takeover
    );
    // No preference: taken at once, as before.
    let plain = Observed::update(None, rec(None, Some(1), 5), None, t0);
    let d = decide(Some(&plain), "old", t0, D);
    assert_eq!(defer_to_preferred(d, &plain, "old", t0, wait), Decision::Takeover);
}

#[tokio::test(start_paused = true)]
async fn a_coordinated_lease_is_left_to_the_controller_until_it_stays_free() {
    let t0 = Instant::now();
    // Released (no holder): free since it was seen so.
    let released = Observed::update(None, rec(None, Some(1), 3), Some("1".into()), t0).coordinated(true);
    let d = decide(Some(&released), "me", t0, D);
    assert_eq!(d, Decision::Takeover);
    assert_eq!(
        defer_to_controller(d.clone(), &released, t0, D),
        Decision::WaitUntil(t0 + COORDINATED_GRACE)
    );
    assert_eq!(
        defer_to_controller(d, &released, t0 + COORDINATED_GRACE, D),
        Decision::Takeover,
        "nobody named by the controller meanwhile"
    );
    // Expired: free from its expiry.
    let held = Observed::update(None, rec(Some("go-c1"), Some(2), 3), Some("2".into()), t0).coordinated(true);
    let expiry = t0 + Duration::from_secs(2);
    assert_eq!(
        defer_to_controller(decide(Some(&held), "me", expiry, D), &held, expiry, D),
        Decision::WaitUntil(expiry + COORDINATED_GRACE)
    );
    // A Lease without a strategy: kube-leader's own rules, no deferral.
    let plain = Observed::update(None, rec(None, Some(1), 3), Some("3".into()), t0);
    assert_eq!(
        defer_to_controller(Decision::Takeover, &plain, t0, D),
        Decision::Takeover
    );
    // A valid holder is waited for as always.
    assert_eq!(
        defer_to_controller(Decision::WaitUntil(expiry), &held, t0, D),
        Decision::WaitUntil(expiry)
    );
}

#[tokio::test(start_paused = true)]
async fn a_coordinated_candidate_leads_only_when_the_controller_names_it() {
    let t0 = Instant::now();
    let obs = |holder: Option<&str>, mine: bool, by_kube_leader: bool| {
        Observed::update(None, rec(holder, Some(5), 3), Some("1".into()), t0)
            .written_by_me(mine)
            .written_by_kube_leader(by_kube_leader)
            .coordinated(true)
    };
    // No Lease, a released one, another's (even expired): the controller decides.
    assert_eq!(decide_coordinated(None, "me", t0, D), Decision::Follow);
    assert_eq!(
        decide_coordinated(Some(&obs(None, false, true)), "me", t0, D),
        Decision::Follow
    );
    let later = t0 + Duration::from_secs(60);
    assert_eq!(
        decide_coordinated(Some(&obs(Some("other"), false, true)), "me", later, D),
        Decision::Follow
    );
    // Named holder by the controller (no kube-leader process wrote the record): lead.
    assert_eq!(
        decide_coordinated(Some(&obs(Some("me"), false, false)), "me", t0, D),
        Decision::Takeover
    );
    // Its own record: renew.
    assert_eq!(
        decide_coordinated(Some(&obs(Some("me"), true, true)), "me", t0, D),
        Decision::Renew
    );
    // Another process of this identity wrote it: waited out, then taken.
    let twin = obs(Some("me"), false, true);
    assert_eq!(
        decide_coordinated(Some(&twin), "me", t0, D),
        Decision::WaitUntil(t0 + Duration::from_secs(5))
    );
    assert_eq!(
        decide_coordinated(Some(&twin), "me", t0 + Duration::from_secs(5), D),
        Decision::Takeover
    );
}
