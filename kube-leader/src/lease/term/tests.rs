//! Unit tests of the term machine: every event and the decision it comes to.

use k8s_openapi::api::coordination::v1::LeaseSpec;

use super::*;
use crate::{
    lease::record::{now_micro, set_writer, stored_fencing_token, written_by},
    lock::FENCING_TOKEN_ANNOTATION,
};

const RENEW: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_secs(2);

fn writer() -> Writer {
    Writer {
        identity: "me".into(),
        instance: "a".into(),
        lease_duration_seconds: 15,
        renew_deadline: RENEW,
        yields_to_coordinated: true,
    }
}

/// A Lease at resourceVersion `rv`, held by `holder`, written by `instance`.
fn lease(rv: &str, holder: &str, instance: &str) -> Lease {
    let record = LeaseRecord {
        holder: Some(holder.into()),
        lease_duration: Some(Duration::from_secs(15)),
        renew_time: Some(now_micro()),
        transitions: 3,
        ..Default::default()
    };
    let mut l = Lease::default();
    l.metadata.name = Some("l".into());
    l.metadata.resource_version = Some(rv.into());
    record.write_to(l.spec.get_or_insert_with(LeaseSpec::default), 15);
    set_writer(&mut l, instance, &record);
    l
}

/// A term of "me" (instance "a") begun at `t0` by the write of version 10.
fn term(t0: Instant) -> Term<Every> {
    let l = lease("10", "me", "a");
    let record = LeaseRecord::from_lease(&l);
    Term::new(writer(), l, record, 42, t0, Every::new(RETRY, t0))
}

fn transient() -> Failure {
    Failure::Transient(kube::Error::Api(Box::default()))
}

#[test]
fn a_new_term_is_confirmed_until_its_renew_deadline_and_renews_a_retry_period_on() {
    let t0 = Instant::now();
    let t = term(t0);
    assert_eq!(t.confirmed_until(), t0 + RENEW);
    assert_eq!(t.next_renewal(), t0 + RETRY);
    assert_eq!(
        t.deadline_reached(t0 + RENEW - Duration::from_millis(1)),
        Step::Keep
    );
    assert_eq!(t.fencing_token(), 42);
}

#[test]
fn a_renewal_carries_the_token_and_the_writer_and_confirms_from_when_it_was_sent() {
    let t0 = Instant::now();
    let mut t = term(t0);
    let Step::Renew { lease, until } = t.renew(t0 + RETRY, now_micro()) else {
        panic!("a renewal is due");
    };
    assert_eq!(until, t0 + RENEW, "bounded by the renew deadline");
    assert_eq!(
        lease.metadata.resource_version.as_deref(),
        Some("10"),
        "the precondition"
    );
    let record = LeaseRecord::from_lease(&lease);
    assert_eq!(stored_fencing_token(&lease, &record), Some(42));
    assert!(written_by(&lease, &record, "a"));
    assert_eq!(record.transitions, 3);
    let mut written = *lease.clone();
    written.metadata.resource_version = Some("11".into());
    let sent = t0 + RETRY;
    assert_eq!(t.renewed(written, sent), Step::Keep);
    assert_eq!(t.confirmed_until(), sent + RENEW);
    assert_eq!(t.next_renewal(), sent + RETRY);
    assert_eq!(t.last_sent(), sent);
    assert_eq!(t.lease().metadata.resource_version.as_deref(), Some("11"));
    assert_eq!(
        t.record().renew_time,
        record.renew_time,
        "the renewal's record is the term's"
    );
}

#[test]
fn past_the_renew_deadline_the_term_ends_and_nothing_is_sent() {
    let t0 = Instant::now();
    let mut t = term(t0);
    let late = t0 + RENEW + Duration::from_secs(1);
    let end = Step::End(LossReason::RenewDeadline {
        since_last_renewal: RENEW + Duration::from_secs(1),
    });
    assert_eq!(t.deadline_reached(late), end);
    assert_eq!(t.renew(late, now_micro()), end);
    assert_eq!(
        t.deadline_reached(t0 + RENEW),
        Step::End(LossReason::RenewDeadline {
            since_last_renewal: RENEW
        })
    );
}

#[test]
fn a_watched_older_or_equal_version_is_ignored() {
    let t0 = Instant::now();
    let mut t = term(t0);
    assert_eq!(t.watched(&lease("9", "other", "b")), Step::Keep);
    assert_eq!(t.watched(&lease("10", "other", "b")), Step::Keep);
    assert_eq!(t.lease().metadata.resource_version.as_deref(), Some("10"));
}

#[test]
fn a_watched_other_holder_or_twin_ends_the_term_and_our_own_is_adopted() {
    let t0 = Instant::now();
    let mut t = term(t0);
    assert_eq!(
        t.watched(&lease("11", "other", "b")),
        Step::End(LossReason::OtherHolder {
            holder: "other".into()
        })
    );
    assert_eq!(
        t.watched(&lease("11", "me", "b")),
        Step::End(LossReason::DuplicateIdentity {
            identity: "me".into()
        }),
        "our identity, another process"
    );
    let mut released = lease("11", "me", "b");
    released.spec.as_mut().unwrap().holder_identity = Some(String::new());
    assert_eq!(
        t.watched(&released),
        Step::End(LossReason::OtherHolder {
            holder: String::new()
        })
    );
    // Ours, its labels edited: the new version is the next write's precondition.
    assert_eq!(t.watched(&lease("12", "me", "a")), Step::Keep);
    assert_eq!(t.lease().metadata.resource_version.as_deref(), Some("12"));
    assert_eq!(t.deleted(), Step::End(LossReason::LockDeleted));
}

#[test]
fn a_conflict_is_read_again_ours_goes_on_anothers_ends() {
    let t0 = Instant::now();
    let mut t = term(t0);
    let now = t0 + RETRY;
    assert!(matches!(t.renew(now, now_micro()), Step::Renew { .. }));
    assert_eq!(
        t.write_failed(&Failure::Conflict, now),
        Step::Reread { until: t0 + RENEW }
    );
    let later = now + Duration::from_millis(500);
    assert_eq!(t.reread(Ok(lease("12", "me", "a")), later), Step::Keep);
    assert_eq!(t.lease().metadata.resource_version.as_deref(), Some("12"));
    assert_eq!(
        t.next_renewal(),
        later + RETRY,
        "retried a retry period after the read"
    );
    assert_eq!(t.confirmed_until(), t0 + RENEW, "a conflict confirms nothing");
    assert_eq!(
        t.reread(Ok(lease("13", "other", "b")), later),
        Step::End(LossReason::OtherHolder {
            holder: "other".into()
        })
    );
    assert_eq!(
        t.reread(Ok(lease("13", "me", "b")), later),
        Step::End(LossReason::DuplicateIdentity {
            identity: "me".into()
        })
    );
    assert_eq!(
        t.reread(Err(Failure::NotFound), later),
        Step::End(LossReason::LockDeleted)
    );
    assert_eq!(t.reread(Err(transient()), later), Step::Keep);
}

#[test]
fn failed_renewals_are_retried_and_a_deleted_lease_ends_the_term() {
    let t0 = Instant::now();
    let mut t = term(t0);
    let now = t0 + RETRY;
    assert!(matches!(t.renew(now, now_micro()), Step::Renew { .. }));
    let before = t.record().clone();
    assert_eq!(t.write_failed(&transient(), now), Step::Keep);
    assert_eq!(t.next_renewal(), now + RETRY);
    assert_eq!(t.record(), &before, "a failed renewal's record is not the term's");
    assert_eq!(
        t.write_failed(&Failure::Fatal(crate::error::Error::NoPodName), now),
        Step::Keep
    );
    assert_eq!(
        t.write_failed(&Failure::NotFound, now),
        Step::End(LossReason::LockDeleted)
    );
}

#[test]
fn a_release_is_written_only_in_time_and_after_no_loss_but_a_cancellation() {
    let t0 = Instant::now();
    let t = term(t0);
    let now = t0 + RETRY;
    assert!(t.may_release(now, None));
    assert!(t.may_release(now, Some(&LossReason::Cancelled)));
    for lost in [
        LossReason::OtherHolder { holder: "x".into() },
        LossReason::LockDeleted,
        LossReason::RenewDeadline {
            since_last_renewal: RENEW,
        },
        LossReason::DuplicateIdentity {
            identity: "me".into(),
        },
    ] {
        assert!(!t.may_release(now, Some(&lost)), "{lost:?}");
    }
    assert!(!t.may_release(t0 + RENEW, None), "not after the renew deadline");
    let release = t.release_write(Some("next"), now_micro());
    let record = LeaseRecord::from_lease(&release);
    assert_eq!(record.holder, None);
    assert_eq!(record.transitions, 3, "the count of transitions is kept");
    assert_eq!(release.metadata.resource_version.as_deref(), Some("10"));
    let a = release.metadata.annotations.unwrap_or_default();
    assert!(!a.contains_key(FENCING_TOKEN_ANNOTATION), "no token: {a:?}");
    assert!(
        a.contains_key(crate::successor::PREFERRED_HOLDER_ANNOTATION),
        "{a:?}"
    );
}

/// `lease` with coordinated leader election's fields: `strategy`, and `preferred` as
/// `spec.preferredHolder`.
fn coordinated(mut l: Lease, rv: &str, preferred: Option<&str>) -> Lease {
    let spec = l.spec.get_or_insert_with(LeaseSpec::default);
    spec.strategy = Some("OldestEmulationVersion".into());
    spec.preferred_holder = preferred.map(Into::into);
    l.metadata.resource_version = Some(rv.into());
    l
}

#[test]
fn a_new_preferred_holder_of_a_coordinated_lease_ends_the_term_and_the_release_may_follow() {
    let t0 = Instant::now();
    let mut t = term(t0);
    // Ours, coordinated, nobody preferred: nothing changes.
    assert_eq!(
        t.watched(&coordinated(lease("11", "me", "a"), "11", None)),
        Step::Keep
    );
    // Preferring this very candidate: nothing changes.
    assert_eq!(
        t.watched(&coordinated(lease("12", "me", "a"), "12", Some("me"))),
        Step::Keep
    );
    // The controller's new choice: give way.
    let step = t.watched(&coordinated(lease("13", "me", "a"), "13", Some("go-c2")));
    let reason = LossReason::Yielded {
        preferred: "go-c2".into(),
    };
    assert_eq!(step, Step::End(reason.clone()));
    assert!(
        t.may_release(t0 + RETRY, Some(&reason)),
        "the Lease is still ours to release"
    );
    assert!(
        !t.may_release(t0 + RENEW, Some(&reason)),
        "not after the renew deadline"
    );
}

#[test]
fn a_preferred_holder_without_a_strategy_or_already_there_at_the_start_is_not_a_new_choice() {
    let t0 = Instant::now();
    let mut t = term(t0);
    let mut plain = lease("11", "me", "a");
    plain.spec.as_mut().unwrap().preferred_holder = Some("someone".into());
    assert_eq!(t.watched(&plain), Step::Keep, "no controller behind it");

    // Taken (after it stayed free) with a choice the controller could not carry out.
    let l = coordinated(lease("20", "me", "a"), "20", Some("gone"));
    let record = LeaseRecord::from_lease(&l);
    let mut t = Term::new(writer(), l, record, 42, t0, Every::new(RETRY, t0));
    assert_eq!(
        t.watched(&coordinated(lease("21", "me", "a"), "21", Some("gone"))),
        Step::Keep
    );
    // Cleared, then named again: a new choice.
    assert_eq!(
        t.watched(&coordinated(lease("22", "me", "a"), "22", None)),
        Step::Keep
    );
    assert!(matches!(
        t.watched(&coordinated(lease("23", "me", "a"), "23", Some("gone"))),
        Step::End(LossReason::Yielded { .. })
    ));

    // A shard's term never gives way (its engine balances the set).
    let l = lease("30", "me", "a");
    let record = LeaseRecord::from_lease(&l);
    let shard_writer = Writer {
        yields_to_coordinated: false,
        ..writer()
    };
    let mut t = Term::new(shard_writer, l, record, 42, t0, Every::new(RETRY, t0));
    assert_eq!(
        t.watched(&coordinated(lease("31", "me", "a"), "31", Some("go-c2"))),
        Step::Keep
    );
}

/// The keeper's pace after an overload answer: the server's `Retry-After` when it is longer
/// than the (jittered) retry period, a jittered retry period otherwise, and never so late that
/// no last attempt is left before the renew deadline.
#[test]
fn the_keepers_retries_honour_retry_after_and_keep_a_last_attempt() {
    let t0 = Instant::now();
    let retry = Duration::from_secs(2);
    let deadline = t0 + Duration::from_secs(10);
    let last_try = Duration::from_secs(2);
    for _ in 0..100 {
        let mut p = Every::keeper(retry, t0, last_try);
        // No Retry-After: 80-100 % of the retry period (client-go's candidates retry every
        // retry period; jitter spreads candidates that failed together).
        p.failed(t0, deadline, None);
        let wait = p.next() - t0;
        assert!(wait >= retry.mul_f64(0.8) && wait <= retry, "{wait:?}");
        // A longer Retry-After is honoured.
        p.failed(t0, deadline, Some(Duration::from_secs(5)));
        assert_eq!(p.next(), t0 + Duration::from_secs(5));
        // A shorter one does not make the retry sooner than the pace.
        p.failed(t0, deadline, Some(Duration::from_secs(1)));
        assert!(p.next() - t0 >= retry.mul_f64(0.8));
        // But never later than the last attempt before the renew deadline.
        let late = t0 + Duration::from_secs(6);
        p.failed(late, deadline, Some(Duration::from_secs(30)));
        assert_eq!(p.next(), deadline - last_try);
        // Once the last attempt failed: half a retry period later, never at once (an API
        // server that rejects fast meets no storm), and not past the deadline.
        let later = t0 + Duration::from_secs(8);
        p.failed(later, deadline, None);
        assert_eq!(p.next(), later + retry / 2);
        let last = deadline - Duration::from_millis(100);
        p.failed(last, deadline, None);
        assert_eq!(p.next(), deadline);
        // A success goes back to one renewal per retry period.
        p.succeeded(later);
        assert_eq!(p.next(), later + retry);
    }
}

/// A term's failed write passes the server's `Retry-After` on to the pace.
#[test]
fn an_overload_answer_sets_the_next_renewal() {
    let t0 = Instant::now();
    let l = lease("10", "me", "a");
    let record = LeaseRecord::from_lease(&l);
    let mut t = Term::new(writer(), l, record, 42, t0, Every::keeper(RETRY, t0, RENEW / 5));
    let now = t0 + RETRY;
    assert!(matches!(t.renew(now, now_micro()), Step::Renew { .. }));
    let too_many = Failure::Transient(kube::Error::Api(Box::new(kube::core::Status {
        code: 429,
        details: Some(serde_json::from_value(serde_json::json!({ "retryAfterSeconds": 1 })).unwrap()),
        ..Default::default()
    })));
    assert_eq!(t.write_failed(&too_many, now), Step::Keep);
    let next = t.next_renewal();
    assert!(next >= now + Duration::from_secs(1), "Retry-After honoured");
    assert!(next <= t.confirmed_until() - RENEW / 5, "a last attempt is kept");
}
