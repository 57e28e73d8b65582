//! Unit tests of the table: every row, the pairs it does not list, and the races of the safety
//! work walked on an engine that makes no call.

use std::{convert::Infallible, time::Duration};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use tokio::sync::{mpsc, watch};

use super::*;
use crate::{
    leadership::LossReason,
    lease::record::{set_writer, LeaseRecord},
    shards::{
        assignments::{Shard, ShardSet},
        config::ShardsConfig,
        engine::Spec,
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
fn engine() -> (Engine, mpsc::UnboundedReceiver<Shard>) {
    let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
        Ok::<http::Response<kube::client::Body>, Infallible>(http::Response::new(kube::client::Body::empty()))
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

/// Begins a term of shard `index` on `e`, acquired by a write sent now; its `Shard`.
fn acquire(e: &mut Engine, index: u32) -> crate::leadership::Leadership {
    let lease = shard_lease(index, "10", "me", &e.set.instance);
    let record = LeaseRecord::from_lease(&lease);
    let (leadership, _) = e.begin_term(index, record, lease, Instant::now());
    leadership
}

fn state(e: &Engine, index: u32) -> Option<State> {
    e.slots[index as usize].term.as_ref().map(Held::state)
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
    e.on_done(1, e.slots[1].term.as_ref().unwrap().gen, now);
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
    let gen = |e: &Engine, i: usize| e.slots[i].term.as_ref().unwrap().gen;
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
    let t = e.slots[0].term.as_ref().unwrap();
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
