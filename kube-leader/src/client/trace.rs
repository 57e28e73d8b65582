//! kube's `TraceLayer`, as kube's own client builds it (kube-client 5, `client/builder.rs`):
//! the same `HTTP` span with the same fields (OpenTelemetry's semantic conventions), the same
//! events, and the same target, so that a filter written for kube's client (`kube_client=debug`)
//! applies to this one too.

use std::time::Duration;

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use kube::client::Body;
use tower_http::{
    classify::{ServerErrorsAsFailures, ServerErrorsFailureClass, SharedClassifier},
    trace::TraceLayer,
};
use tracing::Span;

/// The target of kube's spans and events.
const TARGET: &str = "kube_client::client::builder";

/// kube's trace layer, with its callbacks as function pointers (a type that can be named).
pub(super) type KubeTrace = TraceLayer<
    SharedClassifier<ServerErrorsAsFailures>,
    fn(&Request<Body>) -> Span,
    fn(&Request<Body>, &Span),
    fn(&Response<Incoming>, Duration, &Span),
    (),
    fn(Option<&HeaderMap>, Duration, &Span),
    fn(ServerErrorsFailureClass, Duration, &Span),
>;

/// See the module docs.
pub(super) fn layer() -> KubeTrace {
    TraceLayer::new_for_http()
        .make_span_with(make_span as fn(&Request<Body>) -> Span)
        .on_request(on_request as fn(&Request<Body>, &Span))
        .on_response(on_response as fn(&Response<Incoming>, Duration, &Span))
        // Explicitly disable `on_body_chunk`. The default does nothing.
        .on_body_chunk(())
        .on_eos(on_eos as fn(Option<&HeaderMap>, Duration, &Span))
        .on_failure(on_failure as fn(ServerErrorsFailureClass, Duration, &Span))
}

fn make_span(req: &Request<Body>) -> Span {
    tracing::debug_span!(
        target: TARGET,
        "HTTP",
        http.method = %req.method(),
        http.url = %req.uri(),
        http.status_code = tracing::field::Empty,
        otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
    )
}

fn on_request(_req: &Request<Body>, _span: &Span) {
    tracing::debug!(target: TARGET, "requesting");
}

fn on_response(res: &Response<Incoming>, _latency: Duration, span: &Span) {
    let status = res.status();
    span.record("http.status_code", status.as_u16());
    if status.is_client_error() || status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}

fn on_eos(_trailers: Option<&HeaderMap>, _duration: Duration, _span: &Span) {
    tracing::debug!(target: TARGET, "stream closed");
}

/// Called when calling the inner service errored, polling the body errored, the response was
/// classified as a failure (5xx) or its end of stream was.
fn on_failure(ec: ServerErrorsFailureClass, _latency: Duration, span: &Span) {
    span.record("otel.status_code", "ERROR");
    match ec {
        ServerErrorsFailureClass::StatusCode(status) => {
            span.record("http.status_code", status.as_u16());
            tracing::error!(target: TARGET, "failed with status {}", status);
        }
        ServerErrorsFailureClass::Error(err) => {
            tracing::error!(target: TARGET, "failed with error {}", err);
        }
    }
}
