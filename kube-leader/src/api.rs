//! Calls to the API server: timeouts and the classification of their errors.
//!
//! Every call made by an elector goes through [`call`], which bounds it with a timeout and sorts
//! the outcome into what the election loop needs to know: success, "not there", "somebody else
//! wrote first" (re-read and decide again), transient (retry with backoff), or fatal (surface to
//! the user with the permission or object named).

use std::{future::Future, time::Duration};

use http::{header, Response, StatusCode};
use kube::{client::Body, Client};

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

    /// `Some(Retry-After)` if the API server said it is overloaded: 429 (API Priority and
    /// Fairness rejected or timed out the request in its queue) or 5xx (504: the request timed
    /// out inside the server). The inner `Option` is the server's `Retry-After`
    /// (`details.retryAfterSeconds` of its Status), if it gave one.
    pub(crate) fn overload(&self) -> Option<Option<Duration>> {
        let Failure::Transient(kube::Error::Api(status)) = self else {
            return None;
        };
        if status.code != 429 && status.code < 500 {
            return None;
        }
        let retry_after = status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s)));
        Some(retry_after)
    }

    /// The server's `Retry-After` of an overload answer ([`overload`](Self::overload)).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        self.overload().flatten()
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

/// `client`, with the `Retry-After` of an overload answer kept where the elections read it.
///
/// kube reads an error answer's body as a `Status` and drops its headers, and API Priority and
/// Fairness rejects a request with a plain-text 429 whose only word on when to come back is its
/// `Retry-After` header (k8s.io/apiserver, pkg/server/filters/priority-and-fairness.go,
/// `tooManyRequests`). This layer turns the header of a 429 or 5xx answer into the
/// `details.retryAfterSeconds` of the `Status` kube then reads ([`Failure::overload`]), a
/// plain-text body into a `Status` carrying that text. Every other answer passes untouched
/// (watches stream through).
pub(crate) fn keeping_retry_after(client: Client) -> Client {
    let namespace = client.default_namespace().to_owned();
    let valid_until = *client.valid_until();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let client = client.clone();
        async move {
            let response = client.send(request).await?;
            Ok::<_, kube::Error>(with_retry_after_in_status(response).await)
        }
    });
    Client::new(service, namespace).with_valid_until(valid_until)
}

/// An overload answer with `Retry-After`, its body a `Status` that carries it.
async fn with_retry_after_in_status(response: Response<Body>) -> Response<Body> {
    let code = response.status();
    if code != StatusCode::TOO_MANY_REQUESTS && !code.is_server_error() {
        return response;
    }
    let Some(seconds) = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok())
    else {
        return response;
    };
    let (mut parts, body) = response.into_parts();
    let text = body.collect_bytes().await.unwrap_or_default();
    let status = status_with_retry_after(code, &text, seconds);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(serde_json::to_vec(&status).unwrap_or_default()))
}

/// The `Status` of an overload answer `body` (a `Status`, or plain text) with
/// `details.retryAfterSeconds` set to `seconds` where it had none.
fn status_with_retry_after(code: StatusCode, body: &[u8], seconds: u32) -> serde_json::Value {
    let mut status = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if v.get("kind").and_then(|k| k.as_str()) == Some("Status") => v,
        _ => serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": String::from_utf8_lossy(body).trim(),
            "reason": if code == StatusCode::TOO_MANY_REQUESTS { "TooManyRequests" } else { "" },
            "code": code.as_u16(),
        }),
    };
    if let Some(map) = status.as_object_mut() {
        let details = map.entry("details").or_insert_with(|| serde_json::json!({}));
        if let Some(d) = details.as_object_mut() {
            d.entry("retryAfterSeconds").or_insert(seconds.into());
        }
    }
    status
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

    #[test]
    fn overload_reads_retry_after() {
        let api = |code: u16, retry: u32| {
            Failure::Transient(kube::Error::Api(Box::new(kube::core::Status {
                code,
                details: Some(
                    serde_json::from_value(serde_json::json!({ "retryAfterSeconds": retry })).unwrap(),
                ),
                ..Default::default()
            })))
        };
        assert_eq!(api(429, 1).overload(), Some(Some(Duration::from_secs(1))));
        assert_eq!(api(429, 1).retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(api(504, 0).overload(), Some(None));
        assert_eq!(api(503, 0).retry_after(), None);
        assert_eq!(api(409, 0).overload(), None);
        assert_eq!(Failure::Conflict.overload(), None);
    }

    /// API Priority and Fairness's 429 is plain text with a `Retry-After` header: kube would
    /// drop the header; the layer puts it where [`Failure::overload`] reads it.
    #[test]
    fn a_plain_text_429_keeps_its_retry_after() {
        let s = status_with_retry_after(
            StatusCode::TOO_MANY_REQUESTS,
            b"Too many requests, please try again later.\n",
            3,
        );
        let status: kube::core::Status = serde_json::from_value(s).unwrap();
        assert_eq!(status.code, 429);
        assert_eq!(status.message, "Too many requests, please try again later.");
        assert_eq!(status.details.unwrap().retry_after_seconds, 3);
        // A Status of the server's own keeps its details, and its own retryAfterSeconds.
        let own = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"m",
            "reason":"Timeout","code":504,"details":{"retryAfterSeconds":7}}"#;
        let s = status_with_retry_after(StatusCode::GATEWAY_TIMEOUT, own, 1);
        let status: kube::core::Status = serde_json::from_value(s).unwrap();
        assert_eq!(
            (status.code, status.details.unwrap().retry_after_seconds),
            (504, 7)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_is_transient() {
        let r: Result<(), Failure> = call(op(), Duration::from_secs(1), std::future::pending()).await;
        assert!(r.unwrap_err().is_transient());
    }
}
