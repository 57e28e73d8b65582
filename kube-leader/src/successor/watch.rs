//! A leader's view of its lock's candidate registrations: one list/watch kept for its term,
//! the fallback of the successor a release names where the consistent list at step-down fails
//! or is slow ([`Registry::youngest_other`](super::Registry::youngest_other)).
//!
//! The successor used to come from this view alone, so that the release was the step-down's
//! only request; on a loaded API server the watch lagged behind a new Pod's registration and a
//! rollout's release named an old Pod. The watch starts when the term begins (one list from the
//! API server's watch cache, then a watch: two requests per term, and one more each
//! [`WATCH_TIMEOUT_SECS`] while it lasts) and ends with the term.
//!
//! The view is used only while it can be trusted: its list has completed, no error has come
//! since, and it heard something within [`FRESH`] (the leader renews its own registration every
//! [`REGISTRATION_HEARTBEAT`] while it leads). A watch the candidate may not make (no `watch` on
//! Leases) is given up after one log line. A view a few milliseconds late costs at most a
//! preference, never safety: registrations only ever choose whom a release prefers.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, ResourceExt,
};
use tokio::{task::AbortHandle, time::Instant};
use tracing::{debug, info, Instrument};

use super::{youngest, REGISTRATION_HEARTBEAT};
use crate::api::{classify_watch, Failure, Op};

/// Longest watch call (as the lock's own watch: kube-runtime's default less 5 s).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// How recently the watch must have delivered for its view to be used: two heartbeats and a
/// margin. The leader's own registration alone is renewed every heartbeat, so a watch silent
/// for longer is stalled (or this candidate stopped renewing), and a release lists instead.
const FRESH: Duration = Duration::from_secs(REGISTRATION_HEARTBEAT.as_secs() * 2 + 5);

/// The registrations as the watch last showed them.
#[derive(Debug, Default)]
struct View {
    /// The watch's list has completed and no error came since.
    synced: bool,
    /// When the watch last delivered (an event or a completed list).
    heard: Option<Instant>,
    registrations: BTreeMap<String, Lease>,
}

/// The watch of one lock's registrations, for one term: stopped when dropped.
#[derive(Debug)]
pub(super) struct Follow {
    view: Arc<Mutex<View>>,
    task: AbortHandle,
}

/// What the watch is of, for its requests' errors.
struct Target {
    namespace: String,
    /// `<lock>-candidate-*`: the names the selector finds.
    names: String,
    selector: String,
    hint: &'static str,
}

impl Target {
    fn op(&self) -> Op<'_> {
        Op {
            verb: "watch",
            resource: "leases",
            namespace: &self.namespace,
            name: &self.names,
            hint: self.hint,
        }
    }
}

// === impl Follow ===

impl Follow {
    /// Starts watching the registrations `selector` finds in `api`'s namespace, named
    /// `names` (for logs and errors).
    pub(super) fn start(
        api: Api<Lease>,
        namespace: &str,
        names: String,
        selector: String,
        hint: &'static str,
    ) -> Self {
        let view = Arc::new(Mutex::new(View::default()));
        let target = Target {
            namespace: namespace.to_string(),
            names,
            selector,
            hint,
        };
        let task = tokio::spawn(follow(api, target, view.clone()).in_current_span());
        Self {
            view,
            task: task.abort_handle(),
        }
    }

    /// The youngest live candidate other than `me` as the watch shows them (`Some(None)`:
    /// there is none); `None` if the view cannot be trusted now (see the module
    /// documentation), and the caller asks the API server.
    pub(super) fn youngest_other(&self, me: &str, now: Timestamp) -> Option<(Option<String>, usize)> {
        let view = self.view.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = view.heard.is_some_and(|t| t.elapsed() <= FRESH);
        (view.synced && fresh).then(|| {
            let found = youngest(view.registrations.values(), me, now);
            (found, view.registrations.len())
        })
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Folds the watch of `target` into `view` until the watch is refused (or the task aborted).
async fn follow(api: Api<Lease>, target: Target, view: Arc<Mutex<View>>) {
    let mut config = watcher::Config::default()
        .labels(&target.selector)
        .any_semantic()
        .timeout(WATCH_TIMEOUT_SECS);
    // Unpaginated: kube sends `resourceVersion=0` (served from the API server's watch cache,
    // not read from etcd) only for a list without a limit. A lock has a handful of candidates.
    config.page_size = None;
    let mut stream = watcher(api, config).default_backoff().boxed();
    // The registrations of a list in progress (kube-runtime's `Init` .. `InitDone`).
    let mut listing: Option<BTreeMap<String, Lease>> = None;
    while let Some(event) = stream.next().await {
        let mut view = view.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(lease)) => {
                listing.get_or_insert_default().insert(lease.name_any(), lease);
            }
            Ok(watcher::Event::InitDone) => {
                view.registrations = listing.take().unwrap_or_default();
                view.synced = true;
                view.heard = Some(Instant::now());
            }
            Ok(watcher::Event::Apply(lease)) => {
                view.registrations.insert(lease.name_any(), lease);
                view.heard = Some(Instant::now());
            }
            Ok(watcher::Event::Delete(lease)) => {
                view.registrations.remove(&lease.name_any());
                view.heard = Some(Instant::now());
            }
            Err(e) => {
                // Until the watcher's next list completes, a release lists for itself.
                view.synced = false;
                match classify_watch(target.op(), e) {
                    Failure::Fatal(e) => {
                        info!(registrations = %target.names, error = %e,
                            "cannot watch the candidates' registrations while leading; a release \
                             lists them instead (one request on the handover's path)");
                        return;
                    }
                    e => debug!(registrations = %target.names, error = ?e,
                        "the registrations' watch failed; retrying"),
                }
            }
        }
    }
}
