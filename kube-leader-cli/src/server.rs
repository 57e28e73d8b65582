//! The read-only status server (`--status-addr`).
//!
//! | path       | answer                                                                   |
//! |------------|--------------------------------------------------------------------------|
//! | `/`        | `{"name", "last_update"}`: the retired `leader-elector`'s and nais/elector's |
//! | `/sse`     | nais/elector's Server-Sent Events: `data: <the same JSON>`, once per change |
//! | `/leader`  | holder, is_leader, since, fencing_token, strategy, lock, identity        |
//! | `/events`  | Server-Sent Events: the current state, then one event per change         |
//! | `/healthz` | the election watchdog: 503 if it believes it leads but stopped renewing  |
//! | `/readyz`  | 200 once the first election result is known (or only while leading)      |
//! | `/metrics` | Prometheus / OpenMetrics text                                            |
//!
//! Only `GET` and `HEAD`; nothing changes state.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{
    body::{Frame, Incoming},
    header, Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::{broadcast, Semaphore},
};
use tracing::{debug, info};

use crate::state::{ElectorView, Status};

type Body = BoxBody<Bytes, Infallible>;

/// How often an idle event stream gets a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Binds `addr`; returns the listener and the address it got (port 0 picks one).
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// At most this many connections at once; more are closed as soon as accepted. Probes,
/// scrapers and a few `/events` readers need far fewer; the cap keeps a flood of connections
/// from taking the file descriptors and the memory that the election needs (it shares one
/// thread with the renewals).
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// A client must send a request's headers within this time, from the connection's start or
/// from the end of its previous request (slowloris, idle keep-alive connections).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves until the process ends.
pub(crate) async fn serve(listener: TcpListener, status: Arc<Status>) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "status server listening");
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the cap: close it now rather than let it wait in the backlog, where it
            // would hold a probe's place.
            debug!(
                max = MAX_CONNECTIONS,
                "too many status connections; closing a new one"
            );
            drop(stream);
            continue;
        };
        let status = status.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let status = status.clone();
                async move { Ok::<_, Infallible>(handle(&req, &status)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(error = %e, "status connection ended");
            }
        });
    }
}

fn handle(req: &Request<Incoming>, status: &Status) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut res = text(StatusCode::METHOD_NOT_ALLOWED, "read-only: only GET and HEAD\n");
        res.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return res;
    }
    match req.uri().path() {
        "/" => json(StatusCode::OK, &ElectorView::from(&status.snapshot())),
        "/sse" => elector_events(status),
        "/leader" => json(StatusCode::OK, &status.view()),
        "/events" => events(status),
        "/healthz" => match status.health() {
            Ok(()) => text(StatusCode::OK, "ok\n"),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, &format!("unhealthy: {why}\n")),
        },
        "/readyz" => {
            if status.ready() {
                text(StatusCode::OK, "ok\n")
            } else if status.ready_only_when_leader {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready: not the leader\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: no election result yet\n",
                )
            }
        }
        "/metrics" => {
            let mut res = full(StatusCode::OK, status.metrics.encode());
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            res
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /, /sse, /leader, /events, /healthz, /readyz, /metrics\n",
        ),
    }
}

/// `text/event-stream`: the current state, then one `leader` event per change.
fn events(status: &Status) -> Response<Body> {
    let rx = status.subscribe();
    let first = serde_json::to_string(&status.view()).unwrap_or_default();
    let state = (Some(first), rx);
    let stream = futures::stream::unfold(state, |(first, mut rx)| async move {
        if let Some(first) = first {
            return Some((sse(&first), (None, rx)));
        }
        loop {
            match tokio::time::timeout(KEEP_ALIVE, rx.recv()).await {
                Ok(Ok(json)) => return Some((sse(&json), (None, rx))),
                // Too slow a reader: skip to what is current.
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
                Err(_) => return Some((Bytes::from_static(b": keep-alive\n\n"), (None, rx))),
            }
        }
    });
    event_stream(stream)
}

/// nais/elector's `/sse`: `data: {"name", "last_update"}` for the current leader, then once per
/// change of leader (no `event:` line, as nais/elector writes them).
fn elector_events(status: &Status) -> Response<Body> {
    let mut rx = status.watch();
    let first = ElectorView::from(&*rx.borrow_and_update());
    // The state: whether `sent` is still to be sent, what was sent last, the snapshots.
    let stream = futures::stream::unfold((true, first, rx), |(due, sent, mut rx)| async move {
        if due {
            return Some((elector_sse(&sent), (false, sent, rx)));
        }
        loop {
            match tokio::time::timeout(KEEP_ALIVE, rx.changed()).await {
                Ok(Ok(())) => {
                    let now = ElectorView::from(&*rx.borrow_and_update());
                    // Only a change of leader (its `last_update` moves with it) is an event.
                    if now != sent {
                        return Some((elector_sse(&now), (false, now, rx)));
                    }
                }
                Ok(Err(_)) => return None,
                Err(_) => {
                    return Some((Bytes::from_static(b": keep-alive\n\n"), (false, sent, rx)));
                }
            }
        }
    });
    event_stream(stream)
}

fn elector_sse(view: &ElectorView) -> Bytes {
    Bytes::from(format!(
        "data: {}\n\n",
        serde_json::to_string(view).unwrap_or_default()
    ))
}

/// A `text/event-stream` response of `stream`'s chunks.
fn event_stream(stream: impl futures::Stream<Item = Bytes> + Send + Sync + 'static) -> Response<Body> {
    let body = StreamBody::new(stream.map(|b| Ok::<_, Infallible>(Frame::data(b))));
    let mut res = Response::new(BodyExt::boxed(body));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    res
}

fn sse(json: &str) -> Bytes {
    Bytes::from(format!("event: leader\ndata: {json}\n\n"))
}

fn json(code: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let mut body = serde_json::to_string(value).unwrap_or_default();
    body.push('\n');
    let mut res = full(code, body);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    res
}

fn text(code: StatusCode, body: &str) -> Response<Body> {
    let mut res = full(code, body.to_string());
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

fn full(code: StatusCode, body: String) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from(body)).boxed());
    *res.status_mut() = code;
    res
}
