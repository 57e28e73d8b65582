//! Errors of kube-leader.

use std::time::Duration;

/// An [`Error::InvalidConfig`] of `field`.
pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

/// The result type of kube-leader's fallible operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while electing a leader.
///
/// Errors name the object involved and, where the fix is on the cluster side (RBAC, a missing
/// Pod), what to do about it. Transient API errors (timeouts, 5xx, 429, connection failures)
/// never surface here: they are retried with backoff inside the election loop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was rejected before anything was sent to the API server.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// The setting that was rejected, as the configuration names it (`renew_deadline`).
        field: &'static str,
        /// Why, in words that name the setting and the values involved.
        reason: String,
    },

    /// The lock name is not a valid Kubernetes object name (DNS-1123 subdomain).
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidLockName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: String,
    },

    /// No namespace could be found for the lock.
    #[error(
        "no namespace for the lock: set one explicitly, or POD_NAMESPACE, or run in a Pod \
         (the service-account namespace file {path} was not found)"
    )]
    NoNamespace {
        /// The service-account namespace file that was looked for.
        path: String,
    },

    /// The candidate's own Pod name is unknown (leader for life needs it for the owner reference).
    #[error(
        "the candidate's Pod name is unknown: set the POD_NAME environment variable with the \
         Downward API (fieldRef metadata.name), or set the identity explicitly"
    )]
    NoPodName,

    /// The candidate's own Pod does not exist.
    #[error("the candidate's own Pod {namespace}/{name} was not found (is POD_NAME correct?)")]
    OwnPodNotFound {
        /// Namespace searched.
        namespace: String,
        /// Pod name searched.
        name: String,
    },

    /// The API server refused a request for lack of permission (HTTP 403).
    #[error(
        "missing permission: {verb} {resource} in namespace {namespace} \
         (the API server said: {message}); grant it with a Role such as {hint}"
    )]
    Forbidden {
        /// The verb that was refused (get, list, watch, create, update, patch, delete).
        verb: String,
        /// The resource, with its API group when it is not the core group (`leases.coordination.k8s.io`).
        resource: String,
        /// The namespace of the request (`<cluster>` for cluster-scoped resources).
        namespace: String,
        /// The API server's message.
        message: String,
        /// Where to find a Role that grants it.
        hint: &'static str,
    },

    /// The API server rejected a request as invalid (HTTP 400/422); retrying cannot help.
    #[error("the API server rejected {verb} {resource} {namespace}/{name}: {message}")]
    Rejected {
        /// The verb of the request.
        verb: String,
        /// The resource of the request.
        resource: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The API server's message.
        message: String,
    },

    /// The API server returned an object that cannot be decoded (for example a time outside
    /// the range the Kubernetes client types support); reading it again cannot help.
    #[error(
        "cannot decode the answer to {verb} {resource} {namespace}/{name}: {message}; \
         fix or delete the object"
    )]
    Undecodable {
        /// The verb of the request.
        verb: String,
        /// The resource of the request.
        resource: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The decoder's message.
        message: String,
    },

    /// Shards: another live candidate of the same set was started with another number of
    /// shards. Every candidate of a set must have the same count (the shard Leases are
    /// `<set>-0` .. `<set>-<count-1>` and the fair shares are computed from it). Of two
    /// candidates that disagree, the one that joined the set later fails with this error
    /// (after handing back, as on shutdown, anything it held); the other goes on. To change
    /// the count, stop every candidate of the set first.
    #[error(
        "shard set {namespace}/{set}: this candidate {identity:?} has {ours} shards, but the \
         live candidate {other:?} has {theirs} shards; every candidate of a set needs the same \
         count: stop all candidates of the set before changing it"
    )]
    ShardCountMismatch {
        /// The set's name.
        set: String,
        /// The set's namespace.
        namespace: String,
        /// This candidate's identity.
        identity: String,
        /// This candidate's number of shards.
        ours: u32,
        /// The other candidate's identity.
        other: String,
        /// The other candidate's number of shards, from its membership Lease.
        theirs: u32,
    },

    /// The wait for leadership was cancelled by the caller's token.
    #[error("cancelled while waiting for leadership of {lock}")]
    Cancelled {
        /// The lock (`namespace/name`).
        lock: String,
    },

    /// The candidate stopped campaigning because its Pod is ending (being deleted, replaced or
    /// terminal): a stopping candidate never campaigns again, so that a leader stepping down
    /// never hands over to a Pod that is going.
    #[error("no longer campaigning for {lock}: this candidate's Pod {why}")]
    Stopping {
        /// The lock (`namespace/name`).
        lock: String,
        /// What happens to the Pod.
        why: String,
    },

    /// The API server could not be reached for longer than the configured bound.
    #[error("the API server has been unreachable for {elapsed:?}")]
    Unreachable {
        /// How long it has been unreachable.
        elapsed: Duration,
        /// The last error seen.
        #[source]
        source: kube::Error,
    },

    /// An API error that is neither transient nor one of the above.
    #[error("API request failed")]
    Api(#[source] Box<kube::Error>),
}
