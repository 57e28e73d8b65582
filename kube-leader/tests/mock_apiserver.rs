//! The Lease elector against a scripted in-process API server, on tokio's paused clock: faults
//! that a real API server produces only by chance (a conflict, then silence) made exact.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::internal::LeaseElectorExt as _;
use kube_leader::{
    internal::labels::{PREFERRED_HOLDER_ANNOTATION, REGISTRATION_HEARTBEAT},
    LeaseConfig, LeaseElector, LossReason, Successor,
};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod support;

use support::{respond, status, Body};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

/// What the scripted API server does.
#[derive(Debug, Default)]
struct State {
    lease: Option<Value>,
    revision: u64,
    /// Every update answers 409 and every read of the Lease hangs, from now on.
    conflict_then_silence: bool,
    /// When each successful update was answered (paused clock: when it was sent, too).
    updated_at: Vec<Instant>,
    reads_after_conflict: usize,
    /// Every request but watches: when, method and path.
    requests: Vec<(Instant, String)>,
    /// The candidates' registrations (Leases other than "lock"), as last written.
    registrations: Vec<Value>,
    /// Open watches: each gets a line per change made with [`Mock::write`].
    watchers: Vec<tokio::sync::mpsc::UnboundedSender<Bytes>>,
    /// Every update of the lock is answered with this overload (a server that is busy), until
    /// cleared.
    overload: Option<Overload>,
    /// When each update was answered with the overload.
    overloaded_at: Vec<Instant>,
}

/// An overload answer of the API server.
#[derive(Debug, Clone, Copy)]
enum Overload {
    /// API Priority and Fairness's: 429, plain text, `Retry-After: <seconds>`.
    TooManyRequests(u32),
    /// A request that timed out inside the server: 504 with a `Status`, no `Retry-After`.
    Timeout,
}

#[derive(Debug, Clone, Default)]
struct Mock(Arc<Mutex<State>>);

impl Mock {
    /// The candidate "me" for the Lease "lock" against this server, with `config`, and no
    /// registration (`Successor::Any`): these tests count the lock's requests; the
    /// registration's own are tested in `a_registered_candidate_heartbeats_and_its_release_names_the_youngest`.
    fn candidate(&self, config: LeaseConfig) -> LeaseElector {
        LeaseElector::new(self.client(), "lock")
            .namespace("ns")
            .identity("me")
            .config(config.successor(Successor::Any))
    }

    /// The Lease exists at revision `revision`, held by "other" for `seconds`, after
    /// `transitions` transitions.
    fn held_by_other(&self, revision: u64, seconds: u32, transitions: u32) {
        let mut s = self.0.lock().unwrap();
        s.revision = revision;
        s.lease = Some(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lock", "namespace": "ns", "resourceVersion": revision.to_string()},
            "spec": {"holderIdentity": "other", "leaseDurationSeconds": seconds,
                "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z",
                "leaseTransitions": transitions}
        }));
    }

    /// Another client's write: changes the Lease with `f`, as a new revision, and tells every
    /// open watch.
    fn write(&self, f: impl FnOnce(&mut Value)) {
        let mut s = self.0.lock().unwrap();
        s.revision += 1;
        let rv = s.revision.to_string();
        let lease = s.lease.as_mut().expect("a Lease to write");
        f(lease);
        lease["metadata"]["resourceVersion"] = json!(rv);
        let event = json!({"type": "MODIFIED", "object": lease.clone()});
        let line = Bytes::from(format!("{event}\n"));
        s.watchers.retain(|w| w.send(line.clone()).is_ok());
    }

    fn client(&self) -> kube::Client {
        let mock = self.clone();
        support::client(move |method, path, query, body| {
            let mock = mock.clone();
            async move { mock.handle(method, path, query, body).await }
        })
    }

    async fn handle(&self, method: Method, path: String, query: String, body: Bytes) -> Response<Body> {
        let hang = {
            let mut s = self.0.lock().unwrap();
            if !query.contains("watch=true") {
                s.requests.push((Instant::now(), format!("{} {path}", method)));
            }
            match (&method, path.as_str()) {
                (&Method::GET, LEASES) if query.contains("watch=true") => {
                    let (tx, response) = support::watch();
                    s.watchers.push(tx);
                    return response;
                }
                (&Method::GET, LEASES) if query.contains("labelSelector") => {
                    let items = s.registrations.clone();
                    return respond(
                        200,
                        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                            "metadata": {"resourceVersion": "1"}, "items": items}),
                    );
                }
                (&Method::POST, LEASES) if !is_lock(&body) => {
                    let registration: Value = serde_json::from_slice(&body).unwrap();
                    s.registrations.push(registration.clone());
                    return respond(201, &registration);
                }
                (&Method::PATCH, p) if p.starts_with(&format!("{LEASES}/lock-candidate-")) => {
                    let name = p.rsplit('/').next().unwrap_or_default().to_string();
                    let found = s
                        .registrations
                        .iter()
                        .find(|r| r["metadata"]["name"] == name.as_str())
                        .cloned();
                    return match found {
                        Some(r) => respond(200, &r),
                        None => status(404, "NotFound"),
                    };
                }
                (&Method::DELETE, p) if p.starts_with(&format!("{LEASES}/lock-candidate-")) => {
                    let name = p.rsplit('/').next().unwrap_or_default().to_string();
                    s.registrations.retain(|r| r["metadata"]["name"] != name.as_str());
                    return respond(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                    );
                }
                (&Method::GET, LEASES) => {
                    let rv = s.revision.to_string();
                    let items: Vec<Value> = s.lease.iter().cloned().collect();
                    return respond(
                        200,
                        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                            "metadata": {"resourceVersion": rv}, "items": items}),
                    );
                }
                (&Method::POST, LEASES) => {
                    if s.lease.is_some() {
                        return status(409, "AlreadyExists");
                    }
                    let mut lease: Value = serde_json::from_slice(&body).unwrap();
                    s.revision += 1;
                    lease["metadata"]["resourceVersion"] = json!(s.revision.to_string());
                    s.lease = Some(lease.clone());
                    s.updated_at.push(Instant::now());
                    return respond(201, &lease);
                }
                (&Method::PUT, p) if p == format!("{LEASES}/lock") && s.overload.is_some() => {
                    s.overloaded_at.push(Instant::now());
                    return match s.overload {
                        Some(Overload::TooManyRequests(seconds)) => Response::builder()
                            .status(429)
                            .header("content-type", "text/plain; charset=utf-8")
                            .header("retry-after", seconds.to_string())
                            .body(Body::new(http_body_util::Full::new(Bytes::from_static(
                                b"Too many requests, please try again later.\n",
                            ))))
                            .unwrap(),
                        _ => status(504, "Timeout"),
                    };
                }
                (&Method::PUT, p) if p == format!("{LEASES}/lock") => {
                    let mut lease: Value = serde_json::from_slice(&body).unwrap();
                    let current_rv = s.lease.as_ref().map(|l| l["metadata"]["resourceVersion"].clone());
                    if s.conflict_then_silence
                        || current_rv != Some(lease["metadata"]["resourceVersion"].clone())
                    {
                        return status(409, "Conflict");
                    }
                    s.revision += 1;
                    lease["metadata"]["resourceVersion"] = json!(s.revision.to_string());
                    s.lease = Some(lease.clone());
                    s.updated_at.push(Instant::now());
                    return respond(200, &lease);
                }
                (&Method::GET, p) if p == format!("{LEASES}/lock") => {
                    if s.conflict_then_silence {
                        s.reads_after_conflict += 1;
                        Some(())
                    } else {
                        return match &s.lease {
                            Some(l) => respond(200, l),
                            None => status(404, "NotFound"),
                        };
                    }
                }
                // client-go's LeaderElection Events, best effort: accepted.
                (&Method::POST, "/api/v1/namespaces/ns/events") => {
                    let event: Value = serde_json::from_slice(&body).unwrap();
                    return respond(201, &event);
                }
                (m, p) => panic!("unexpected request {m} {p}?{query}"),
            }
        };
        // A read after the conflict: an API server that stopped answering.
        let () = hang.expect("every other request was answered");
        std::future::pending().await
    }
}

/// Whether a created Lease is the lock (not a candidate's registration).
fn is_lock(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| v["metadata"]["name"] == "lock")
}

/// 2 s / 1 s / 200 ms.
fn short_timings() -> LeaseConfig {
    LeaseConfig::default()
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_secs(1))
        .retry_period(Duration::from_millis(200))
}

/// A renewal answered 409, then a re-read that never returns: the leader must still stop by its
/// renew deadline, before its lease can expire for anybody who saw its last renewal. The re-read
/// used to run under the API timeout alone (here 3 s, longer than the 2 s lease).
#[tokio::test(start_paused = true)]
async fn a_hanging_reread_after_a_conflict_cannot_outlive_the_renew_deadline() {
    let mock = Mock::default();
    let mut config = short_timings();
    config.api_timeout = Some(Duration::from_secs(3));
    let elector = mock.candidate(config);
    let shutdown = CancellationToken::new();
    let leadership = elector.become_leader(&shutdown).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(mock.0.lock().unwrap().updated_at.len() >= 4, "the leader renews");

    mock.0.lock().unwrap().conflict_then_silence = true;
    let reason = leadership.lost().await;
    let lost_at = Instant::now();
    let state = mock.0.lock().unwrap();
    let last_renewal = *state.updated_at.last().unwrap();
    assert!(
        state.reads_after_conflict >= 1,
        "the 409 was followed by a re-read"
    );
    let held = lost_at - last_renewal;
    assert!(
        matches!(reason, LossReason::RenewDeadline { since_last_renewal } if since_last_renewal <= Duration::from_millis(1010)),
        "{reason:?}"
    );
    assert!(
        held <= Duration::from_millis(1010),
        "led {held:?} after its last renewal (renew deadline 1 s, lease 2 s)"
    );
}

/// A 409 whose re-read shows another holder ends leadership at once, with that holder named.
#[tokio::test(start_paused = true)]
async fn a_conflict_with_another_holder_ends_leadership_at_once() {
    let mock = Mock::default();
    let elector = mock.candidate(short_timings());
    let shutdown = CancellationToken::new();
    let leadership = elector.become_leader(&shutdown).await.unwrap();
    let stolen_at = {
        // Another candidate writes over the lease; the watch (silent here) does not tell.
        let mut s = mock.0.lock().unwrap();
        s.revision += 1;
        let rv = s.revision.to_string();
        let lease = s.lease.as_mut().unwrap();
        lease["spec"]["holderIdentity"] = json!("other");
        lease["metadata"]["resourceVersion"] = json!(rv);
        Instant::now()
    };
    let reason = leadership.lost().await;
    assert_eq!(
        reason,
        LossReason::OtherHolder {
            holder: "other".into()
        }
    );
    assert!(
        stolen_at.elapsed() <= Duration::from_millis(200),
        "{:?}",
        stolen_at.elapsed()
    );
}

/// The leader renews once per retry period, each renewal one write, and nothing else.
#[tokio::test(start_paused = true)]
async fn the_leader_renews_once_per_retry_period_with_one_write() {
    let mock = Mock::default();
    let elector = mock.candidate(short_timings()).events(false);
    let shutdown = CancellationToken::new();
    let leadership = elector.become_leader(&shutdown).await.unwrap();
    let won = mock.0.lock().unwrap().requests.len();
    tokio::time::sleep(Duration::from_millis(1010)).await;
    let s = mock.0.lock().unwrap();
    let renewals: Vec<_> = s.requests[won..].iter().collect();
    assert_eq!(renewals.len(), 5, "{renewals:?}");
    assert!(
        renewals.iter().all(|(_, r)| r.starts_with("PUT ")),
        "{renewals:?}"
    );
    for pair in s.updated_at.windows(2) {
        assert_eq!(pair[1] - pair[0], Duration::from_millis(200));
    }
    drop(s);
    assert!(leadership.is_leader());
}

/// A follower sends nothing while another holder's lease is valid, and takes it over at the
/// expiry by its own clock, with one write.
#[tokio::test(start_paused = true)]
async fn a_follower_waits_out_the_lease_without_requests_and_takes_it_at_expiry() {
    let mock = Mock::default();
    mock.held_by_other(7, 3, 4);
    let elector = mock.candidate(short_timings()).events(false);
    let started = Instant::now();
    let leadership = elector.become_leader(&CancellationToken::new()).await.unwrap();
    let s = mock.0.lock().unwrap();
    let writes: Vec<_> = s
        .requests
        .iter()
        .filter(|(_, r)| !r.starts_with("GET "))
        .collect();
    assert_eq!(writes.len(), 1, "one write: {:?}", s.requests);
    let waited = writes[0].0 - started;
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_millis(3100),
        "took over after {waited:?} (the holder's lease: 3 s from when it was seen)"
    );
    let lease = s.lease.as_ref().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "me");
    assert_eq!(lease["spec"]["leaseTransitions"], 5);
    assert_eq!(leadership.fencing_token(), 8);
}

/// A follower wakes on the watch event of a release and takes the lease at once, long before
/// the released holder's lease would have expired.
#[tokio::test(start_paused = true)]
async fn a_release_seen_by_the_watch_is_taken_at_once() {
    let mock = Mock::default();
    mock.held_by_other(3, 15, 0);
    let elector = mock.candidate(LeaseConfig::default()).events(false);
    let campaign = tokio::spawn(async move { elector.become_leader(&CancellationToken::new()).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!campaign.is_finished(), "the holder's lease is valid for 15 s");
    let released_at = Instant::now();
    mock.write(|lease| {
        lease["spec"]["holderIdentity"] = json!("");
        lease["spec"]["leaseDurationSeconds"] = json!(1);
    });
    let leadership = campaign.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(50),
        "took over {:?} after the release",
        released_at.elapsed()
    );
    assert_eq!(leadership.term().identity, "me");
    let s = mock.0.lock().unwrap();
    assert_eq!(s.lease.as_ref().unwrap()["spec"]["holderIdentity"], "me");
}

/// A leader learns of another holder's write from its watch, before its next renewal.
#[tokio::test(start_paused = true)]
async fn a_leader_deposed_by_a_write_learns_it_from_the_watch() {
    let mock = Mock::default();
    let timings = LeaseConfig::default()
        .lease_duration(Duration::from_secs(20))
        .renew_deadline(Duration::from_secs(15))
        .retry_period(Duration::from_secs(10));
    let elector = mock.candidate(timings).events(false);
    let leadership = elector.become_leader(&CancellationToken::new()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written_at = Instant::now();
    mock.write(|lease| lease["spec"]["holderIdentity"] = json!("other"));
    let reason = leadership.lost().await;
    assert_eq!(
        reason,
        LossReason::OtherHolder {
            holder: "other".into()
        }
    );
    assert!(
        written_at.elapsed() < Duration::from_millis(50),
        "{:?}",
        written_at.elapsed()
    );
    let renewals = mock.0.lock().unwrap().updated_at.len();
    assert_eq!(renewals, 1, "only the acquiring write: no renewal was due");
}

/// With `Successor::Youngest` (the default), a candidate registers once (one create), renews its
/// registration once per heartbeat (a merge patch, nothing else), and its release names the
/// youngest live registration other than its own; it withdraws (one delete) on shutdown.
#[tokio::test(start_paused = true)]
async fn a_registered_candidate_heartbeats_and_its_release_names_the_youngest() {
    let mock = Mock::default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let registration = |identity: &str, since: &str| {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": format!("lock-candidate-{identity}"), "namespace": "ns"},
            "spec": {"holderIdentity": identity, "leaseDurationSeconds": 45,
                "acquireTime": since, "renewTime": now.to_string()}
        })
    };
    mock.0.lock().unwrap().registrations = vec![
        registration("old", "2026-01-01T00:00:00.000000Z"),
        registration("young", "2026-01-02T00:00:00.000000Z"),
    ];
    let any = mock.candidate(short_timings());
    let elector = any
        .clone()
        .config(any.settings().clone().successor(Successor::Youngest));
    let shutdown = CancellationToken::new();
    let leadership = elector.become_leader(&shutdown).await.unwrap();
    let requests = |m: &Mock, what: &str| {
        let s = m.0.lock().unwrap();
        s.requests
            .iter()
            .filter(|(_, r)| r.starts_with(what) && r.contains("lock-candidate-"))
            .count()
    };
    let posts = mock
        .0
        .lock()
        .unwrap()
        .requests
        .iter()
        .filter(|(_, r)| r == &format!("POST {LEASES}"))
        .count();
    assert_eq!(posts, 2, "one create of the registration, one of the lock");
    tokio::time::sleep(REGISTRATION_HEARTBEAT * 2 + Duration::from_millis(500)).await;
    assert_eq!(
        requests(&mock, "PATCH"),
        2,
        "one heartbeat per {REGISTRATION_HEARTBEAT:?}"
    );

    leadership.release().await.unwrap();
    let preferred = mock.0.lock().unwrap().lease.as_ref().unwrap()["metadata"]["annotations"]
        [PREFERRED_HOLDER_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        preferred.ends_with(" young"),
        "the release names the youngest: {preferred:?}"
    );
    let lists = mock
        .0
        .lock()
        .unwrap()
        .requests
        .iter()
        .filter(|(_, r)| r == &format!("GET {LEASES}"))
        .count();
    assert!(lists >= 2, "the lock's list and the registrations' list: {lists}");

    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(requests(&mock, "DELETE"), 1, "withdrawn on shutdown");
}

/// Timings with room for an overload inside the renew deadline: 10 s / 6 s / 1 s.
fn roomy_timings() -> LeaseConfig {
    LeaseConfig::default()
        .lease_duration(Duration::from_secs(10))
        .renew_deadline(Duration::from_secs(6))
        .retry_period(Duration::from_secs(1))
}

/// API Priority and Fairness rejects the leader's renewals for 3.5 s with 429 and
/// `Retry-After: 2` (plain text: kube alone would lose the header): the leader retries no
/// sooner than the server asked, sends no storm of retries, and keeps its term, since the
/// overload ended before its 6 s renew deadline.
#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_inside_the_deadline_keeps_the_lease() {
    let mock = Mock::default();
    let elector = mock.candidate(roomy_timings()).events(false);
    let shutdown = CancellationToken::new();
    let leadership = elector.become_leader(&shutdown).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    mock.0.lock().unwrap().overload = Some(Overload::TooManyRequests(2));
    tokio::time::sleep(Duration::from_millis(3500)).await;
    mock.0.lock().unwrap().overload = None;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(leadership.is_leader(), "the term was kept");
    let s = mock.0.lock().unwrap();
    let rejected = &s.overloaded_at;
    assert!(!rejected.is_empty(), "the overload was met");
    assert!(
        rejected.len() <= 2,
        "no storm of retries: {} in 3.5 s",
        rejected.len()
    );
    for pair in rejected.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(2),
            "Retry-After honoured: {:?}",
            pair[1] - pair[0]
        );
    }
    // The retry after the last 429 waited for Retry-After, or came as the last attempt a fifth
    // of the renew deadline before it.
    let (first_rejected, last_rejected) = (rejected[0], *rejected.last().unwrap());
    let deadline = *s.updated_at.iter().rfind(|t| **t < first_rejected).unwrap() + Duration::from_secs(6);
    let next = s.updated_at.iter().find(|t| **t > last_rejected).copied();
    let next = next.expect("a renewal got through after the overload");
    assert!(
        next - last_rejected >= Duration::from_secs(2) || next == deadline - Duration::from_millis(1200),
        "{:?} after the last 429",
        next - last_rejected
    );
}

/// Renewals that time out inside the server (504) are retried, once per retry period with
/// jitter; the term is kept when one gets through before the renew deadline, and ends at the
/// deadline, not later, when none does.
#[tokio::test(start_paused = true)]
async fn a_504_is_retried_and_a_real_deadline_miss_ends_the_term() {
    let mock = Mock::default();
    let elector = mock.candidate(roomy_timings()).events(false);
    let shutdown = CancellationToken::new();
    let leadership = elector.become_leader(&shutdown).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    mock.0.lock().unwrap().overload = Some(Overload::Timeout);
    tokio::time::sleep(Duration::from_secs(3)).await;
    mock.0.lock().unwrap().overload = None;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(leadership.is_leader(), "the term was kept through the timeouts");
    let timed_out = mock.0.lock().unwrap().overloaded_at.len();
    assert!(
        (2..=4).contains(&timed_out),
        "retried once per retry period: {timed_out}"
    );

    // Now the server stays overloaded: the term ends at the renew deadline.
    mock.0.lock().unwrap().overload = Some(Overload::Timeout);
    let reason = leadership.lost().await;
    let lost_at = Instant::now();
    let s = mock.0.lock().unwrap();
    let last_renewal = *s.updated_at.last().unwrap();
    assert!(matches!(reason, LossReason::RenewDeadline { .. }), "{reason:?}");
    let held = lost_at - last_renewal;
    assert!(
        held >= Duration::from_secs(6) && held <= Duration::from_millis(6010),
        "ended {held:?} after the last renewal (renew deadline 6 s)"
    );
    let tries = s.overloaded_at.iter().filter(|t| **t > last_renewal).count();
    assert!(
        (4..=9).contains(&tries),
        "retried until the deadline, no storm: {tries}"
    );
}
