//! Unit tests of the table: every row, the pairs it does not list, and the races of the safety
//! work walked on an engine that makes no call.

use std::{convert::Infallible, time::Duration};

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::{
    api::Failure,
    leadership::{Leadership, LossReason},
    lease::{
        decide::Decision,
        record::{set_writer, LeaseRecord},
    },
    shards::{
        assignments::ShardSet,
        config::ShardsConfig,
        engine::{answers::Reply, io::Input, Spec},
    },
};

/// Every state (with one `until`) and event (with one `until`) of the table.
fn all(t: Instant) -> (Vec<State>, Vec<Event>) {
    let states = vec![
        State::Active,
        State::Leaving {
            until: t,
            release: true,
        },
        State::Leaving {
            until: t,
            release: false,
        },
        State::Releasing,
        State::Gone,
    ];
    let events = vec![
        Event::Leave {
            until: t,
            release: true,
        },
        Event::Lost,
        Event::Done,
        Event::Release,
        Event::Abandon,
        Event::GraceOver,
        Event::Released,
        Event::Finish,
    ];
    (states, events)
}

/// The table as its rows are written in the module's documentation.
fn expected(state: State, done: bool, event: Event) -> Option<Next> {
    use {Event as E, Next::*, State as S};
    let leaving = matches!(state, S::Leaving { .. });
    match event {
        E::Leave { until, release } if state == S::Active => Some(To(S::Leaving { until, release })),
        E::Lost if state == S::Active || leaving => Some(To(S::Gone)),
        E::Done => Some(To(state)),
        E::Release if done && matches!(state, S::Leaving { release: true, .. }) => Some(To(S::Releasing)),
        E::Abandon if done && leaving => Some(To(S::Gone)),
        E::GraceOver if leaving => Some(To(S::Gone)),
        E::Released if state == S::Releasing => Some(To(S::Gone)),
        E::Finish if done && state == S::Gone => Some(Over),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn every_pair_is_a_listed_row_or_ignored() {
    let (states, events) = all(Instant::now());
    let mut rows = 0;
    for &state in &states {
        for &event in &events {
            for done in [false, true] {
                let got = next(state, done, event);
                assert_eq!(
                    got,
                    expected(state, done, event),
                    "{state:?} {event:?} done={done}"
                );
                rows += usize::from(got.is_some());
            }
        }
    }
    // 10 pairs of `Done`, and the others: Leave 2, Lost 6, Release 1, Abandon 2, GraceOver 4,
    // Released 2, Finish 1.
    assert_eq!(rows, 28);
}

#[tokio::test(start_paused = true)]
async fn illegal_pairs_change_nothing() {
    let t = Instant::now();
    assert_eq!(next(State::Gone, true, Event::Lost), None, "lost twice");
    assert_eq!(
        next(State::Releasing, true, Event::Lost),
        None,
        "the release is in flight"
    );
    assert_eq!(
        next(
            State::Leaving {
                until: t,
                release: true
            },
            true,
            Event::Leave {
                until: t,
                release: false
            }
        ),
        None,
        "handed over twice"
    );
    assert_eq!(
        next(
            State::Leaving {
                until: t,
                release: true
            },
            false,
            Event::Release
        ),
        None,
        "released while the work runs"
    );
    assert_eq!(
        next(State::Gone, false, Event::Finish),
        None,
        "over while the work runs"
    );
    assert_eq!(next(State::Active, true, Event::Released), None);
}

#[tokio::test(start_paused = true)]
async fn the_campaign_lists_then_campaigns_and_stops_for_good() {
    let t = Instant::now();
    assert_eq!(
        next_campaign(Campaign::Listing, Campaign::From(t)),
        Some(Campaign::From(t))
    );
    assert_eq!(
        next_campaign(Campaign::From(t), Campaign::From(t)),
        None,
        "listed once"
    );
    assert_eq!(
        next_campaign(Campaign::Listing, Campaign::Stopping),
        Some(Campaign::Stopping)
    );
    assert_eq!(
        next_campaign(Campaign::From(t), Campaign::Stopping),
        Some(Campaign::Stopping)
    );
    assert_eq!(
        next_campaign(Campaign::Stopping, Campaign::From(t)),
        None,
        "never again"
    );
    assert!(Campaign::From(t).acquiring(t));
    assert!(!Campaign::From(t + Duration::from_secs(1)).acquiring(t));
    assert!(!Campaign::Stopping.acquiring(t) && !Campaign::Listing.campaigning());
}

/// An engine of candidate "me" for 2 shards whose calls are never made (nothing polls them),
/// and the receiver of its shards.
fn engine() -> (Engine, mpsc::UnboundedReceiver<(u32, Leadership)>) {
    engine_answering(200, "")
}

/// An engine of candidate "me" for 2 shards whose every call, if polled, is answered `status`
/// with `body`, and the receiver of its shards.
fn engine_answering(status: u16, body: &'static str) -> (Engine, mpsc::UnboundedReceiver<(u32, Leadership)>) {
    let service = tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
        let mut response = http::Response::new(kube::client::Body::from(body.as_bytes().to_vec()));
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        Ok::<http::Response<kube::client::Body>, Infallible>(response)
    });
    let spec = Spec {
        client: kube::Client::new(service, "ns"),
        name: "set".into(),
        count: 2,
        config: ShardsConfig::default(),
    };
    let (out, rx) = mpsc::unbounded_channel();
    let (held_tx, _) = watch::channel(ShardSet::default());
    (Engine::new(spec, "ns".into(), "me".into(), out, held_tx), rx)
}

/// Shard `index`'s Lease at version `rv`, held by `holder`, written by `instance`.
fn shard_lease(index: u32, rv: &str, holder: &str, instance: &str) -> Lease {
    let record = LeaseRecord {
        holder: Some(holder.into()),
        lease_duration: Some(Duration::from_secs(15)),
        renew_time: Some(crate::lease::record::now_micro()),
        ..Default::default()
    };
    let mut l = Lease::default();
    l.metadata.name = Some(format!("set-{index}"));
    l.metadata.resource_version = Some(rv.into());
    record.write_to(l.spec.get_or_insert_with(LeaseSpec::default), 15);
    set_writer(&mut l, instance, &record);
    l
}

/// Begins a term of shard `index` on `e`, acquired by a write sent now; its `Leadership`.
fn acquire(e: &mut Engine, index: u32) -> Leadership {
    let lease = shard_lease(index, "10", "me", &e.set.instance);
    let record = LeaseRecord::from_lease(&lease);
    let (leadership, _) = e.begin_term(index, record, lease, Instant::now());
    leadership
}

fn state(e: &Engine, index: u32) -> Option<State> {
    e.slots[index as usize].tenure.term().map(Held::state)
}

/// A shard lost while its work still runs is not taken again by this process until its work
/// stops, or until the work had the time to stop (the orphan grace).
#[tokio::test(start_paused = true)]
async fn a_lost_term_whose_work_runs_keeps_its_shard_until_the_work_stops_or_the_grace() {
    let (mut e, _rx) = engine();
    let _work = acquire(&mut e, 0);
    let _other = acquire(&mut e, 1);
    let now = Instant::now();
    // Released by somebody else (an administrator): free for anybody at once.
    e.absorb_shard(0, shard_lease(0, "11", "", "b"), now);
    e.absorb_shard(1, shard_lease(1, "11", "", "b"), now);
    assert_eq!(state(&e, 0), Some(State::Gone));
    assert!(!e.free(now).contains(&0), "its work still runs");
    let grace = e.set.stop_grace();
    assert!(!e.free(now + grace - Duration::from_millis(1)).contains(&0));
    assert!(
        e.free(now + grace).contains(&0),
        "an orphan past its grace guards nothing"
    );
    // Shard 1's work stops: the term ends, and the shard is free at once.
    e.on_done(1, e.slots[1].tenure.term().unwrap().gen, now);
    assert_eq!(state(&e, 1), None);
    assert!(e.free(now).contains(&1));
}

/// A term handed over whose work stops after its renew deadline is not released: the release
/// is written only in time.
#[tokio::test(start_paused = true)]
async fn a_release_after_the_renew_deadline_is_not_written() {
    let (mut e, _rx) = engine();
    let _late = acquire(&mut e, 0);
    let _in_time = acquire(&mut e, 1);
    let now = Instant::now();
    let until = now + Duration::from_secs(60);
    for index in [0, 1] {
        assert!(e.apply(index, Event::Leave { until, release: true }, now));
    }
    let gen = |e: &Engine, i: usize| e.slots[i].tenure.term().unwrap().gen;
    e.on_done(1, gen(&e, 1), now);
    assert_eq!(state(&e, 1), Some(State::Releasing));
    assert_eq!(e.io.next_write(64), Some(crate::shards::scheduler::Key::Shard(1)));
    let late = now + e.set.renew_deadline();
    e.on_done(0, gen(&e, 0), late);
    assert_eq!(state(&e, 0), None, "given up unreleased: the term is over");
    assert_eq!(e.io.next_write(64), None, "no release queued");
}

/// Another holder's write seen while a shard is handed over ends its term at once.
#[tokio::test(start_paused = true)]
async fn a_watched_other_holder_while_leaving_ends_the_term() {
    let (mut e, _rx) = engine();
    let _work = acquire(&mut e, 0);
    let now = Instant::now();
    e.stop(now, LossReason::Cancelled);
    assert!(matches!(state(&e, 0), Some(State::Leaving { .. })));
    e.absorb_shard(0, shard_lease(0, "9", "x", "b"), now);
    assert!(
        matches!(state(&e, 0), Some(State::Leaving { .. })),
        "an older version is ignored"
    );
    e.absorb_shard(0, shard_lease(0, "11", "x", "b"), now);
    assert_eq!(state(&e, 0), Some(State::Gone));
    let t = e.slots[0].tenure.term().unwrap();
    assert_eq!(
        t.keeper.reason(),
        Some(LossReason::Cancelled),
        "the first loss is the one told"
    );
    assert_eq!(
        t.orphaned_from(Duration::from_secs(5)),
        Some(now + Duration::from_secs(5))
    );
}

/// A 409 Conflict, as the API server writes it.
const CONFLICT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"conflict","reason":"Conflict","code":409}"#;

/// The next reply handed out by `e`'s edge (the end of a term's work is not expected).
async fn reply(e: &mut Engine) -> Reply {
    match e.io.input().await {
        Input::Reply(reply) => reply,
        Input::Done(index, gen) => panic!("unexpected end of work ({index}, {gen})"),
    }
}

/// A key is busy from the push of its call until its reply is handed out, before the engine
/// handles it, even when the engine then ignores it (an earlier term's renewal).
#[tokio::test(start_paused = true)]
async fn a_key_is_busy_until_its_reply_is_handed_out_even_a_stale_one() {
    let (mut e, _rx) = engine();
    let _work = acquire(&mut e, 0);
    let gen = e.slots[0].tenure.term().unwrap().gen;
    let key = Key::Shard(0);
    assert!(!e.io.busy(key));
    let (answer, answered) = oneshot::channel::<()>();
    e.io.push(key, async move {
        let _ = answered.await;
        Reply::Renewed {
            index: 0,
            gen: gen - 1,
            sent: Instant::now(),
            result: Err(Failure::Conflict),
        }
    });
    assert!(e.io.busy(key), "pushed");
    assert!(!e.io.busy(Key::Shard(1)) && !e.io.busy(Key::Member));
    assert!(e.io.input().now_or_never().is_none(), "not answered yet");
    assert!(e.io.busy(key), "still in flight");
    answer.send(()).unwrap();
    let stale = reply(&mut e).await;
    assert!(!e.io.busy(key), "handed out");
    assert_eq!(e.io.in_flight(), 0);
    e.on_reply(stale, Instant::now());
    assert!(!e.io.busy(key));
    assert_eq!(
        state(&e, 0),
        Some(State::Active),
        "an earlier term's answer is ignored"
    );
}

/// A lost term whose work stopped ends only once the call on its shard returns.
#[tokio::test(start_paused = true)]
async fn a_term_ends_when_the_call_on_its_shard_returns() {
    let (mut e, _rx) = engine();
    let _work = acquire(&mut e, 1);
    let gen = e.slots[1].tenure.term().unwrap().gen;
    let now = Instant::now();
    e.io.push(Key::Shard(1), async {
        Reply::Read {
            index: 1,
            result: Err(Failure::Conflict),
        }
    });
    e.lose(1, LossReason::LockDeleted, now);
    e.on_done(1, gen, now);
    assert_eq!(
        state(&e, 1),
        Some(State::Gone),
        "a call on the shard is in flight"
    );
    assert!(!e.apply(1, Event::Finish, now));
    let (active, holding) = e.holding();
    assert!(active.is_empty() && holding.is_empty(), "done: it guards nothing");
    assert!(!e.free(now).contains(&1), "busy: not taken again meanwhile");
    let read = reply(&mut e).await;
    assert!(!e.io.busy(Key::Shard(1)));
    e.on_reply(read, now);
    assert_eq!(state(&e, 1), None, "the call returned: the term is over");
}

/// An acquisition keeps its shard busy (held, not free); a lost race for a shard that exists
/// is read again at once (busy again) and held off for a retry period.
#[tokio::test(start_paused = true)]
async fn an_acquisition_keeps_its_shard_busy_and_a_lost_race_reads_it_again() {
    let (mut e, _rx) = engine_answering(409, CONFLICT);
    let now = Instant::now();
    e.acquire(0, Decision::Create);
    assert!(e.io.busy(Key::Shard(0)));
    assert_eq!(e.holding(), (vec![], vec![0]), "being acquired");
    assert!(!e.free(now).contains(&0));
    let acquired = reply(&mut e).await;
    assert!(!e.io.busy(Key::Shard(0)));
    e.on_reply(acquired, Instant::now());
    assert!(e.io.busy(Key::Shard(0)), "read again");
    let retry = e.set.cfg.lease.retry_period;
    assert_eq!(e.slots[0].tenure.not_before(), Some(Instant::now() + retry));
    assert!(e.replan_wanted());
    let read = reply(&mut e).await;
    assert!(!e.io.busy(Key::Shard(0)));
    e.on_reply(read, Instant::now());
    assert!(!e.io.busy(Key::Shard(0)) && e.io.in_flight() == 0);
    assert!(!e.free(Instant::now()).contains(&0), "held off");
    assert!(e.free(Instant::now() + retry).contains(&0));
}

/// The membership Lease's create, its conflict's re-read: the key is busy through both, and
/// no second write goes out meanwhile.
#[tokio::test(start_paused = true)]
async fn the_membership_lease_is_busy_through_its_write_and_read() {
    let (mut e, _rx) = engine_answering(409, CONFLICT);
    e.write_member();
    assert!(e.io.busy(Key::Member) && e.io.in_flight() == 1);
    e.write_member();
    assert_eq!(e.io.in_flight(), 1, "one call at a time");
    let written = reply(&mut e).await;
    assert!(!e.io.busy(Key::Member));
    e.on_reply(written, Instant::now());
    assert!(e.io.busy(Key::Member), "a conflict is read again");
    let read = reply(&mut e).await;
    e.on_reply(read, Instant::now());
    assert!(!e.io.busy(Key::Member) && e.io.in_flight() == 0);
    assert!(!e.failed());
}

/// The engine's own state, written by the table's methods.
#[tokio::test(start_paused = true)]
async fn the_engine_state_is_written_by_the_table() {
    let (mut e, _rx) = engine();
    let now = Instant::now();
    // A hold-off keeps a free shard from being taken until it passes or is lifted.
    e.campaign_to(Campaign::From(now));
    assert!(e.free(now).contains(&0));
    e.hold_off(0, now + Duration::from_secs(2));
    assert!(!e.free(now).contains(&0));
    assert!(e.free(now + Duration::from_secs(2)).contains(&0));
    e.lift_hold_off(0);
    assert!(e.free(now).contains(&0));
    // Replanning: wanted until a rebalance begins.
    e.replanning();
    assert!(!e.replan_wanted());
    e.replan();
    assert!(e.replan_wanted());
    e.rebalance(now);
    assert!(!e.replan_wanted());
    // The first error is kept, and the campaign ends with it.
    assert!(!e.failed());
    e.fail(crate::error::invalid("first", "x"));
    e.fail(crate::error::invalid("second", "x"));
    assert!(e.failed());
    assert!(matches!(
        e.outcome(),
        Err(Error::InvalidConfig { field: "first", .. })
    ));
    assert!(e.outcome().is_ok(), "told once");
    // A relist: what was listed before an `Init` is forgotten.
    e.relist_item(shard_lease(0, "1", "a", "x"));
    e.relist_started();
    e.relist_item(shard_lease(1, "2", "a", "x"));
    let listed = e.relist_done();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].metadata.name.as_deref(), Some("set-1"));
    assert!(e.relist_done().is_empty(), "taken");
    // Generations are never reused.
    let a = e.new_gen();
    assert!(e.new_gen() > a);
}
