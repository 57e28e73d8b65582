//! What the in-process API servers of the mock tests share: JSON answers, `Status` errors, and
//! watch responses that stream the lines sent to them.

use std::{convert::Infallible, future::Future};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// The body of every answer.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// `v` as a JSON answer with status `code`.
pub(crate) fn respond(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

/// A Kubernetes `Status` failure with `code` and `reason`.
pub(crate) fn status(code: u16, reason: &str) -> Response<Body> {
    let v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code});
    respond(code, &v)
}

/// A watch answer: one line of the body per line sent to the returned sender; it stays open
/// (without events) while the sender lives, and ends when it is dropped.
pub(crate) fn watch() -> (mpsc::UnboundedSender<Bytes>, Response<Body>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, Infallible>(http_body::Frame::data(line)), rx))
    });
    let response = Response::builder()
        .status(200)
        .body(StreamBody::new(events).boxed())
        .unwrap();
    (tx, response)
}

/// A client whose every request `handle` answers in-process, from its method, path, query
/// and body.
pub(crate) fn client<F, Fut>(handle: F) -> kube::Client
where
    F: Fn(Method, String, String, Bytes) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let handle = handle.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect_bytes().await.unwrap_or_default();
            let query = parts.uri.query().unwrap_or_default().to_string();
            let path = parts.uri.path().to_string();
            Ok::<_, Infallible>(handle(parts.method, path, query, body).await)
        }
    });
    kube::Client::new(service, "ns")
}
