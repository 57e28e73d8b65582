//! Shards against a scripted in-process API server, on tokio's paused clock: a shard acquired
//! and lost before its consumer looked at it (issue 21, item 9), and a shard lost in a freeze
//! (SIGSTOP, a paused VM) whose guard is kept a while.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::{Assignments, Leadership, LeaseConfig, LossReason, Shards};
use serde_json::{json, Value};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

mod support;

#[path = "support/leases.rs"]
mod leases;

use leases::Leases;
use support::Body;

/// The scripted API server; its gate, while closed, holds every write of `set-0` unanswered.
#[derive(Debug, Clone)]
struct Mock {
    state: Arc<Mutex<Leases>>,
    gate: Arc<watch::Sender<bool>>,
    held_writes: Arc<AtomicUsize>,
}

impl Default for Mock {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            gate: Arc::new(watch::channel(true).0),
            held_writes: Arc::default(),
        }
    }
}

impl Mock {
    fn client(&self) -> kube::Client {
        let mock = self.clone();
        support::client(move |method, path, query, body| {
            let mock = mock.clone();
            async move { mock.handle(method, path, query, body).await }
        })
    }

    /// Holds watch events back from now on (the watch lags).
    fn hold_watch(&self) {
        self.state.lock().unwrap().held_back = Some(Vec::new());
    }

    /// Sends the watch events held back, and every later one at once.
    fn release_watch(&self) {
        self.state.lock().unwrap().release_watch();
    }

    /// Closes (`false`) or opens the gate of the writes of `set-0`.
    fn gate(&self, open: bool) {
        self.gate.send_replace(open);
    }

    /// Waits until a write of `set-0` is held at the closed gate.
    async fn write_held(&self) {
        while self.held_writes.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits while the gate is closed, for a write of `set-0`.
    async fn pass_gate(&self) {
        let mut open = self.gate.subscribe();
        if *open.borrow_and_update() {
            return;
        }
        self.held_writes.fetch_add(1, Ordering::SeqCst);
        let _ = open.wait_for(|o| *o).await;
        self.held_writes.fetch_sub(1, Ordering::SeqCst);
    }

    /// Another client's write of Lease `name`.
    fn write(&self, name: &str, f: impl FnOnce(&mut Value)) {
        let mut s = self.state.lock().unwrap();
        let mut lease = s.leases.get(name).cloned().expect("a Lease to write");
        f(&mut lease);
        s.store(lease, "MODIFIED");
    }

    fn holder(&self, name: &str) -> Option<String> {
        let s = self.state.lock().unwrap();
        s.leases.get(name)?["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_string)
    }

    async fn handle(&self, method: Method, path: String, query: String, body: Bytes) -> Response<Body> {
        if method == Method::PUT && path.ends_with("/set-0") {
            self.pass_gate().await;
        }
        self.state.lock().unwrap().handle(&method, &path, &query, &body)
    }
}

/// A shard acquired and lost before its consumer looked: the consumer keeps the guard, as
/// one that keys its guards by index and drops them only when the held set it observes says
/// so (the sidecar did) would, since the held set it observes never listed the shard. The
/// engine used to wait for that guard forever: the shard was never taken again by this
/// candidate. Now a lost shard whose guard is kept is taken again once its work had the time to
/// stop (lease duration minus renew deadline after the loss) and its lease has expired as this
/// candidate saw it (when any other candidate may take it), with a new `Leadership`.
#[tokio::test(start_paused = true)]
async fn a_lost_shard_whose_guard_is_kept_is_taken_again_after_its_lease_expired() {
    let mock = Mock::default();
    let lease = LeaseConfig::default()
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_secs(1))
        .retry_period(Duration::from_millis(200));
    let shutdown = CancellationToken::new();
    let mut assignments = Shards::new(mock.client(), "set", 1)
        .namespace("ns")
        .identity("me")
        .config(kube_leader::ShardsConfig::default().lease(lease))
        .start(&shutdown)
        .unwrap();
    let (_, first) = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 is acquired")
        .unwrap();
    assert_eq!(mock.holder("set-0").as_deref(), Some("me"));

    // Another holder writes the shard (2 s lease): it is lost at once, and the consumer keeps
    // the guard.
    mock.write("set-0", |l| l["spec"]["holderIdentity"] = json!("other"));
    let stolen_at = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(1), first.lost())
        .await
        .expect("the loss is seen at once");
    assert_eq!(
        reason,
        LossReason::OtherHolder {
            holder: "other".into()
        }
    );

    // "other" never renews: its lease expires 2 s after its write was seen.
    let (index, second) = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 was never taken again while its lost guard was kept")
        .expect("shard 0 again");
    let waited = stolen_at.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "taken again {waited:?} after another holder's write, before its 2 s lease expired"
    );
    assert_eq!(index, 0);
    assert!(second.is_leader());
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!first.is_leader());
    assert_eq!(mock.holder("set-0").as_deref(), Some("me"));
    assert_eq!(
        assignments.held().borrow().held.get(&0),
        Some(&second.fencing_token())
    );

    // The kept guard goes at last: nothing changes for the new term.
    drop(first);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(second.is_leader());
    shutdown.cancel();
    drop(second);
    tokio::time::timeout(Duration::from_secs(10), assignments.finish())
        .await
        .expect("the candidate ends")
        .unwrap();
}

/// The candidate "me" of a set of one shard (lease 2 s, renew deadline 1 s, retry 200 ms) and
/// its first shard.
async fn start(mock: &Mock, shutdown: &CancellationToken) -> (Assignments, Leadership) {
    let lease = LeaseConfig::default()
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_secs(1))
        .retry_period(Duration::from_millis(200));
    let mut assignments = Shards::new(mock.client(), "set", 1)
        .namespace("ns")
        .identity("me")
        .config(kube_leader::ShardsConfig::default().lease(lease))
        .start(shutdown)
        .unwrap();
    let (_, first) = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 is acquired")
        .unwrap();
    assert_eq!(mock.holder("set-0").as_deref(), Some("me"));
    (assignments, first)
}

/// A freeze of the candidate's process (SIGSTOP, a paused VM): 3 s pass at once, and nothing
/// of it runs meanwhile. Returns the loss of `shard`, seen on the thaw.
async fn freeze(shard: &Leadership) -> LossReason {
    tokio::time::advance(Duration::from_secs(3)).await;
    let reason = tokio::time::timeout(Duration::from_secs(1), shard.lost())
        .await
        .expect("the loss is seen on the thaw");
    assert!(
        matches!(reason, LossReason::RenewDeadline { .. }),
        "lost by {reason:?}, not by its renew deadline"
    );
    reason
}

/// Shuts the candidate down and waits for its end.
async fn finish(shutdown: &CancellationToken, assignments: Assignments) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), assignments.finish())
        .await
        .expect("the candidate ends")
        .unwrap();
}

/// The shard chaos run's pause, in small: while the candidate is frozen, another holder takes
/// its shard, and the candidate's watch brings that write only later. On the thaw the shard is
/// lost by its renew deadline, on a view of it that is stale; an attempt to take the shard
/// again on that view fails (409), and the consumer drops its guard while that write is in
/// flight. The shard must be taken again once the other holder's lease has expired: the term
/// must not stay behind, never ended, keeping the shard from this candidate forever ("no fair
/// spread 30s after pause" with the first fix of issue 21 item 9).
#[tokio::test(start_paused = true)]
async fn a_shard_lost_in_a_freeze_is_taken_again_after_a_failed_takeover() {
    let mock = Mock::default();
    let shutdown = CancellationToken::new();
    let (mut assignments, first) = start(&mock, &shutdown).await;

    mock.hold_watch();
    mock.write("set-0", |l| l["spec"]["holderIdentity"] = json!("other"));
    freeze(&first).await;

    // An attempt to take the shard again (if any while the guard is kept) is held unanswered;
    // the guard is dropped meanwhile, then the attempt fails: its resourceVersion is stale.
    mock.gate(false);
    let _ = tokio::time::timeout(Duration::from_secs(5), mock.write_held()).await;
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    mock.gate(true);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The watch catches up: "other" holds the shard for 2 s from now, and never renews.
    mock.release_watch();
    let seen_at = Instant::now();
    let (index, second) = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 was never taken again after the freeze")
        .expect("shard 0 again");
    let waited = seen_at.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "taken again {waited:?} after another holder's write was seen, before its 2 s lease expired"
    );
    assert_eq!(index, 0);
    assert!(second.is_leader());
    assert_eq!(mock.holder("set-0").as_deref(), Some("me"));
    drop(second);
    finish(&shutdown, assignments).await;
}

/// A freeze that nobody else used: the lease still names this candidate, expired long ago for
/// everyone. The consumer keeps its lost guard; it gets the lease duration minus the renew
/// deadline (1 s) from the loss to stop its work, as the guard's documentation promises, before
/// the shard is taken again with a new `Leadership`; then the shard is taken again though the old
/// guard is still kept.
#[tokio::test(start_paused = true)]
async fn a_shard_lost_in_a_freeze_whose_guard_is_kept_is_taken_again_after_the_stop_grace() {
    let mock = Mock::default();
    let shutdown = CancellationToken::new();
    let (mut assignments, first) = start(&mock, &shutdown).await;

    freeze(&first).await;
    let lost_at = Instant::now();
    let (index, second) = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 was never taken again while its lost guard was kept")
        .expect("shard 0 again");
    let waited = lost_at.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "taken again {waited:?} after its loss was told, while its old guard may still work"
    );
    assert!(
        waited < Duration::from_secs(2),
        "taken again only {waited:?} after its loss"
    );
    assert_eq!(index, 0);
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!first.is_leader());
    assert_eq!(
        assignments.held().borrow().held.get(&0),
        Some(&second.fencing_token())
    );
    drop(first);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(second.is_leader());
    drop(second);
    finish(&shutdown, assignments).await;
}
