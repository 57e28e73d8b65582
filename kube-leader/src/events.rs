//! client-go's leader-election Events: `LeaderElection` on the lock object, "ID became
//! leader" when a term starts and "ID stopped leading" when it ends, for both
//! strategies, as client-go's `resourcelock` records them (so `kubectl describe lease NAME` and
//! `kubectl get events` show the same history for Go and Rust candidates).
//!
//! They are core/v1 Events, as client-go's recorder writes them: kube's `events::Recorder`
//! writes `events.k8s.io/v1` Events, which would need another grant (`create` and `patch` on
//! `events.k8s.io` events) for the same information. Best effort: an Event never delays or
//! fails the election; a refused one (no `create events`) is warned about once and not tried
//! again by this elector.
//!
//! The Events are reported (`source.component` and `reportingComponent`) by the name given to
//! the elector's `event_reporter` option, by default the running binary's file name
//! ([`std::env::current_exe`] without its extension), else `kube-leader`.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client,
};
use tracing::{debug, warn};

use crate::leadership::{Strategy, Term};

/// client-go's reason for leader-election Events.
pub const REASON: &str = "LeaderElection";

/// The reporter when the running binary's name is not known.
const FALLBACK_REPORTER: &str = "kube-leader";

/// Bound on one Event's creation.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Records the Events of one elector.
#[derive(Clone)]
pub(crate) struct EventRecorder {
    client: Client,
    /// The component named as the Events' reporter.
    reporter: Arc<str>,
    /// Set after a refusal: the permission is missing, do not ask again.
    refused: Arc<AtomicBool>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("reporter", &self.reporter)
            .field("refused", &self.refused.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

// === impl EventRecorder ===

impl EventRecorder {
    /// A recorder reporting as `reporter`.
    pub(crate) fn new(client: Client, reporter: Arc<str>) -> Self {
        Self {
            client,
            reporter,
            refused: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Records a `Normal` `LeaderElection` Event on `term`'s lock saying `message`.
    ///
    /// # Cancellation safety
    /// Cancel-safe: at worst the Event is not recorded.
    pub(crate) async fn record(&self, term: &Term, lock_uid: Option<&str>, message: &str) {
        if self.refused.load(Ordering::Relaxed) {
            return;
        }
        let event = event(term, &self.reporter, lock_uid, message, SystemTime::now());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &term.lock.namespace);
        match tokio::time::timeout(TIMEOUT, api.create(&PostParams::default(), &event)).await {
            Ok(Ok(_)) => debug!(lock = %term.lock, message, "recorded an Event on the lock"),
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                if !self.refused.swap(true, Ordering::Relaxed) {
                    warn!(lock = %term.lock, error = %s.message,
                        "missing permission: create events in namespace {}; no Events are recorded \
                         (leadership is not affected; `kube-leader rbac` prints the Role)",
                        term.lock.namespace);
                }
            }
            Ok(Err(e)) => debug!(lock = %term.lock, error = %e, "could not record an Event on the lock"),
            Err(_) => debug!(lock = %term.lock, "recording an Event on the lock timed out"),
        }
    }
}

/// The default reporter: the running binary's file name without its extension, else
/// `kube-leader`.
pub(crate) fn default_reporter() -> Arc<str> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem()?.to_str().map(str::to_string))
        .filter(|stem| !stem.is_empty())
        .unwrap_or_else(|| FALLBACK_REPORTER.to_string())
        .into()
}

/// The Event, as client-go's recorder builds it: named `<lock>.<hex nanoseconds>`, on the lock
/// object, reported by `reporter` for the candidate's identity.
pub(crate) fn event(
    term: &Term,
    reporter: &str,
    lock_uid: Option<&str>,
    message: &str,
    now: SystemTime,
) -> Event {
    let (api_version, kind) = match term.strategy {
        Strategy::Lease => ("coordination.k8s.io/v1", "Lease"),
        Strategy::ForLife => ("v1", "ConfigMap"),
    };
    let lock = &term.lock;
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    // Within the 253-character limit of a name: 16 hex digits and a dot after the lock's name.
    let prefix: String = lock.name.chars().take(253 - 33).collect();
    let at = Time(Timestamp::try_from(now).unwrap_or_else(|_| Timestamp::now()));
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}.{nanos:x}")),
            namespace: Some(lock.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some(lock.name.clone()),
            namespace: Some(lock.namespace.clone()),
            uid: lock_uid.map(str::to_string),
            ..ObjectReference::default()
        },
        reason: Some(REASON.into()),
        message: Some(message.into()),
        type_: Some("Normal".into()),
        source: Some(EventSource {
            component: Some(reporter.into()),
            host: None,
        }),
        first_timestamp: Some(at.clone()),
        last_timestamp: Some(at),
        count: Some(1),
        reporting_component: Some(reporter.into()),
        reporting_instance: Some(term.identity.clone()),
        ..Event::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LockRef;

    fn term(strategy: Strategy, name: &str) -> Term {
        Term {
            identity: "pod-a".into(),
            lock: LockRef::new("ns", name).unwrap(),
            strategy,
            fencing_token: 7,
            acquired_at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn events_are_client_gos() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let e = event(
            &term(Strategy::Lease, "lock"),
            "my-operator",
            Some("uid-1"),
            "pod-a became leader",
            now,
        );
        assert_eq!(e.reason.as_deref(), Some("LeaderElection"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.message.as_deref(), Some("pod-a became leader"));
        let o = &e.involved_object;
        assert_eq!(
            (
                o.api_version.as_deref(),
                o.kind.as_deref(),
                o.name.as_deref(),
                o.namespace.as_deref(),
                o.uid.as_deref()
            ),
            (
                Some("coordination.k8s.io/v1"),
                Some("Lease"),
                Some("lock"),
                Some("ns"),
                Some("uid-1")
            )
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert!(e.metadata.name.as_deref().unwrap().starts_with("lock."));
        assert_eq!(e.reporting_instance.as_deref(), Some("pod-a"));
        assert_eq!(e.reporting_component.as_deref(), Some("my-operator"));
        assert_eq!(e.source.and_then(|s| s.component).as_deref(), Some("my-operator"));
        let e = event(&term(Strategy::ForLife, "lock"), "r", None, "m", now);
        assert_eq!(e.involved_object.kind.as_deref(), Some("ConfigMap"));
        assert_eq!(e.involved_object.api_version.as_deref(), Some("v1"));
    }

    #[test]
    fn names_stay_within_the_limit() {
        let long = "a".repeat(253);
        let e = event(&term(Strategy::Lease, &long), "r", None, "m", SystemTime::now());
        assert!(e.metadata.name.unwrap().len() <= 253);
    }

    #[test]
    fn the_default_reporter_is_the_binary() {
        let exe = std::env::current_exe().unwrap();
        let stem = exe.file_stem().unwrap().to_str().unwrap();
        assert_eq!(&*default_reporter(), stem);
    }
}
