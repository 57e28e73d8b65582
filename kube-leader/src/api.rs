//! Calls to the API server: timeouts and the classification of their errors.
//!
//! Every call made by an elector goes through [`call`], which bounds it with a timeout and sorts
//! the outcome into what the election loop needs to know: success, "not there", "somebody else
//! wrote first" (re-read and decide again), transient (retry with backoff), or fatal (surface to
//! the user with the permission or object named).

use std::{future::Future, time::Duration};

use crate::error::Error;

/// What a call was: enough to name it in an error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op<'a> {
    pub(crate) verb: &'static str,
    pub(crate) resource: &'static str,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) hint: &'static str,
}

/// The outcome of a failed call, as the election loop sees it.
#[derive(Debug)]
pub(crate) enum Failure {
    /// 404: the object does not exist.
    NotFound,
    /// 409 Conflict: the object changed since it was read, or (on create) it already exists.
    Conflict,
    /// Timeouts, connection errors, 429 and 5xx: retry after a backoff.
    Transient(kube::Error),
    /// Retrying cannot help (403, 400, 422, ...).
    Fatal(Error),
}

impl Failure {
    /// Whether this failure is retried by the election loops.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Failure::Transient(_))
    }
}

/// The status codes that are never retried: the request itself is wrong.
const NOT_RETRIED: &[u16] = &[400, 401, 403, 405, 406, 413, 415, 422];

/// Runs one API call under a timeout and classifies its error.
pub(crate) async fn call<T>(
    op: Op<'_>,
    timeout: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, fut).await {
        Err(_elapsed) => Err(Failure::Transient(kube::Error::Service(
            format!(
                "{} {} {}/{} timed out after {timeout:?}",
                op.verb, op.resource, op.namespace, op.name
            )
            .into(),
        ))),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(err)) => Err(classify(op, err)),
    }
}

/// Sorts a `kube::Error` into a [`Failure`].
pub(crate) fn classify(op: Op<'_>, err: kube::Error) -> Failure {
    if let kube::Error::SerdeError(e) = &err {
        // The object cannot be decoded: reading it again gives the same answer.
        return Failure::Fatal(Error::Undecodable {
            verb: op.verb.to_string(),
            resource: op.resource.to_string(),
            namespace: op.namespace.to_string(),
            name: op.name.to_string(),
            message: e.to_string(),
        });
    }
    let kube::Error::Api(status) = &err else {
        return Failure::Transient(err);
    };
    match status.code {
        404 => Failure::NotFound,
        409 => Failure::Conflict,
        403 => Failure::Fatal(Error::Forbidden {
            verb: op.verb.to_string(),
            resource: op.resource.to_string(),
            namespace: op.namespace.to_string(),
            message: status.message.clone(),
            hint: op.hint,
        }),
        401 => Failure::Fatal(Error::Api(Box::new(err))),
        code if NOT_RETRIED.contains(&code) => Failure::Fatal(Error::Rejected {
            verb: op.verb.to_string(),
            resource: op.resource.to_string(),
            namespace: op.namespace.to_string(),
            name: op.name.to_string(),
            message: status.message.clone(),
        }),
        _ => Failure::Transient(err),
    }
}

/// Turns a watch stream error into a fatal error if retrying it cannot help (403 on watch).
///
/// A watch starts with a list: a refused initial list is named `list`, whatever `op` says, so
/// that a missing `list` permission is not reported as a missing `watch`.
pub(crate) fn classify_watch(op: Op<'_>, err: kube::runtime::watcher::Error) -> Failure {
    use kube::runtime::watcher::Error as W;
    match err {
        W::InitialListFailed(e) => classify_watch_start(Op { verb: "list", ..op }, e),
        W::WatchStartFailed(e) => classify_watch_start(op, e),
        W::WatchError(status) => {
            let code = status.code;
            let e = kube::Error::Api(status);
            match code {
                403 => classify(op, e),
                _ => Failure::Transient(e),
            }
        }
        other => Failure::Transient(kube::Error::Service(other.to_string().into())),
    }
}

/// A failed list or watch request: fatal if retrying cannot help, else transient.
fn classify_watch_start(op: Op<'_>, e: kube::Error) -> Failure {
    match classify(op, e) {
        Failure::Fatal(f) => Failure::Fatal(f),
        Failure::Transient(e) => Failure::Transient(e),
        Failure::NotFound | Failure::Conflict => {
            Failure::Transient(kube::Error::Service("watch failed".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> Op<'static> {
        Op {
            verb: "create",
            resource: "configmaps",
            namespace: "ns",
            name: "lock",
            hint: "deploy/x.yaml",
        }
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: format!("code {code}"),
            ..Default::default()
        }))
    }

    #[test]
    fn forbidden_names_the_permission() {
        let Failure::Fatal(e) = classify(op(), api(403)) else {
            panic!("403 must be fatal")
        };
        let msg = e.to_string();
        assert!(
            msg.contains("missing permission: create configmaps in namespace ns"),
            "{msg}"
        );
        assert!(msg.contains("deploy/x.yaml"), "{msg}");
    }

    #[test]
    fn classification() {
        assert!(matches!(classify(op(), api(404)), Failure::NotFound));
        assert!(matches!(classify(op(), api(409)), Failure::Conflict));
        assert!(classify(op(), api(500)).is_transient());
        assert!(classify(op(), api(429)).is_transient());
        assert!(classify(op(), api(503)).is_transient());
        assert!(matches!(
            classify(op(), api(422)),
            Failure::Fatal(Error::Rejected { .. })
        ));
    }

    /// Found by the least-privilege e2e test: without `list`, the error said `watch`.
    #[test]
    fn a_refused_list_or_watch_is_named_as_such() {
        use kube::runtime::watcher::Error as W;
        let watch = Op {
            verb: "watch",
            ..op()
        };
        for (err, verb) in [
            (W::InitialListFailed(api(403)), "list"),
            (W::WatchStartFailed(api(403)), "watch"),
        ] {
            let Failure::Fatal(e) = classify_watch(watch, err) else {
                panic!("403 must be fatal")
            };
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("missing permission: {verb} configmaps in namespace ns")),
                "{msg}"
            );
        }
        assert!(classify_watch(watch, W::InitialListFailed(api(500))).is_transient());
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_is_transient() {
        let r: Result<(), Failure> = call(op(), Duration::from_secs(1), std::future::pending()).await;
        assert!(r.unwrap_err().is_transient());
    }
}
