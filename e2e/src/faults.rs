//! A kube client whose requests can be made to fail, hang or end a watch with 410 Gone, by
//! request kind: faults a TCP proxy cannot aim at (one resource's watch, one write), injected in
//! front of a real API server.
//!
//! ```no_run
//! # async fn run(config: kube::Config) {
//! use kube_leader_e2e::faults::{Fault, Faulty, Matcher};
//! let (client, faults) = Faulty::client(config);
//! // Every request about Pods fails with 503 until cleared.
//! faults.set(Matcher::resource("pods"), Fault::Unavailable);
//! faults.clear();
//! # let _ = client; }
//! ```

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, BodyStream, Full, StreamBody};
use kube::client::{Body, ClientBuilder};
use tower::{BoxError, Layer, Service};

/// Which requests a fault applies to.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    /// The resource in the path (`pods`, `configmaps`, `leases`), if it matters.
    pub resource: Option<&'static str>,
    /// Only watch requests (`Some(true)`), only others (`Some(false)`), or both.
    pub watch: Option<bool>,
    /// Only this HTTP method.
    pub method: Option<Method>,
}

impl Matcher {
    /// Every request about `resource`.
    pub fn resource(resource: &'static str) -> Self {
        Self {
            resource: Some(resource),
            ..Self::default()
        }
    }

    /// Every request.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only watches of `resource`.
    pub fn watch(resource: &'static str) -> Self {
        Self {
            resource: Some(resource),
            watch: Some(true),
            method: None,
        }
    }

    /// Only `method` requests (not watches) about `resource`.
    pub fn write(resource: &'static str, method: Method) -> Self {
        Self {
            resource: Some(resource),
            watch: Some(false),
            method: Some(method),
        }
    }

    fn matches<B>(&self, req: &Request<B>) -> bool {
        let path = req.uri().path();
        let query = req.uri().query().unwrap_or_default();
        let is_watch = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
        self.resource
            .is_none_or(|r| path.split('/').any(|segment| segment == r))
            && self.watch.is_none_or(|w| w == is_watch)
            && self.method.as_ref().is_none_or(|m| m == req.method())
    }
}

/// What happens to a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answered at once with 503 Service Unavailable (a transient error), never sent.
    Unavailable,
    /// Never answered (the caller's timeout ends it), never sent.
    Hang,
    /// A watch answered with one `ERROR` event, code 410 (its resourceVersion is too old), so
    /// the watcher lists again; other requests pass.
    Gone,
    /// Sent and answered, but the calling thread is then blocked for this long before the
    /// answer is handed over: to the caller, a pause of its process (SIGSTOP) right after the
    /// server took the request. Use it with a current-thread runtime.
    PauseAfter(std::time::Duration),
}

#[derive(Debug, Default)]
struct Rules {
    rules: Vec<(Matcher, Fault, Option<usize>)>,
}

/// The switchboard of a faulty client: set and clear faults while the client is in use.
#[derive(Debug, Clone)]
pub struct Faulty {
    rules: Arc<Mutex<Rules>>,
    /// Bumped by [`Faulty::cut_watches`]: open watch answers end then.
    cut: Arc<tokio::sync::watch::Sender<u64>>,
    /// Every fault served, and when.
    served: Arc<Mutex<Vec<(Fault, std::time::Instant)>>>,
    /// Every request that passed: method, path and query, when.
    passed: Arc<Mutex<Vec<(Method, String, std::time::Instant)>>>,
}

impl Default for Faulty {
    fn default() -> Self {
        Self {
            rules: Arc::default(),
            cut: Arc::new(tokio::sync::watch::channel(0).0),
            served: Arc::default(),
            passed: Arc::default(),
        }
    }
}

impl Faulty {
    /// A client for `config` with no fault set, and its switchboard.
    pub fn client(config: kube::Config) -> (kube::Client, Faulty) {
        let faults = Faulty::default();
        let builder = ClientBuilder::try_from(config).expect("client for the test control plane");
        let client = builder.with_layer(&faults.clone()).build();
        (client, faults)
    }

    /// Applies `fault` to every matching request from now on (added to the faults already set).
    pub fn set(&self, matcher: Matcher, fault: Fault) {
        self.lock().rules.push((matcher, fault, None));
    }

    /// Applies `fault` to the next `n` matching requests only, before any fault set earlier.
    pub fn set_times(&self, matcher: Matcher, fault: Fault, n: usize) {
        self.lock().rules.insert(0, (matcher, fault, Some(n)));
    }

    /// Removes every fault: requests pass again.
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// Removes the faults set with [`set`](Self::set) about `resource` (`None`: all of them);
    /// those set with [`set_times`](Self::set_times) stay until used up.
    pub fn clear_persistent(&self, resource: Option<&str>) {
        self.lock()
            .rules
            .retain(|(m, _, n)| n.is_some() || resource.is_some_and(|r| m.resource != Some(r)));
    }

    /// When `fault` was last served, if it was.
    pub fn last_served(&self, fault: Fault) -> Option<std::time::Instant> {
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(f, _)| *f == fault)
            .map(|(_, at)| *at)
    }

    /// When the first request after `after` that passed (no fault) and that `what` accepts
    /// (given its method and its path with the query) was sent.
    pub fn first_passed_after(
        &self,
        after: std::time::Instant,
        what: impl Fn(&Method, &str) -> bool,
    ) -> Option<std::time::Instant> {
        self.passed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(m, p, at)| *at >= after && what(m, p))
            .map(|(_, _, at)| *at)
    }

    /// Ends every watch answer that is open now, as a broken connection would (the watcher
    /// then watches again, through whatever faults are set).
    pub fn cut_watches(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fault_for<B>(&self, req: &Request<B>) -> Option<Fault> {
        let mut rules = self.lock();
        let i = rules
            .rules
            .iter()
            .position(|(m, f, n)| m.matches(req) && n != &Some(0) && (*f != Fault::Gone || is_watch(req)))?;
        let (_, fault, n) = &mut rules.rules[i];
        let fault = *fault;
        if let Some(n) = n {
            *n -= 1;
        }
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((fault, std::time::Instant::now()));
        Some(fault)
    }
}

fn is_watch<B>(req: &Request<B>) -> bool {
    Matcher {
        watch: Some(true),
        ..Matcher::default()
    }
    .matches(req)
}

impl<S> Layer<S> for Faulty {
    type Service = FaultyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FaultyService {
            inner,
            faults: self.clone(),
        }
    }
}

/// The service [`Faulty`] wraps around a client's stack.
#[derive(Debug)]
pub struct FaultyService<S> {
    inner: S,
    faults: Faulty,
}

type BoxBody = UnsyncBoxBody<Bytes, BoxError>;

fn full(status: StatusCode, body: String) -> Response<BoxBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

impl<S, B> Service<Request<Body>> for FaultyService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<BoxBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match self.faults.fault_for(&req) {
            Some(Fault::Unavailable) => Box::pin(async {
                Ok(full(
                    StatusCode::SERVICE_UNAVAILABLE,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected fault","reason":"ServiceUnavailable","code":503}"#.into(),
                ))
            }),
            Some(Fault::Hang) => Box::pin(std::future::pending()),
            Some(Fault::PauseAfter(d)) => {
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let res = fut.await.map_err(Into::into)?;
                    std::thread::sleep(d);
                    Ok(res.map(|b| b.map_err(Into::into).boxed_unsync()))
                })
            }
            Some(Fault::Gone) => Box::pin(async {
                Ok(full(
                    StatusCode::OK,
                    "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\",\"message\":\"too old resource version (injected)\",\"reason\":\"Expired\",\"code\":410}}\n".into(),
                ))
            }),
            None => {
                let watch = is_watch(&req);
                let path = req
                    .uri()
                    .path_and_query()
                    .map_or_else(String::new, |p| p.to_string());
                self.faults
                    .passed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((req.method().clone(), path, std::time::Instant::now()));
                let mut cut = self.faults.cut.subscribe();
                cut.mark_unchanged();
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let res = fut.await.map_err(Into::into)?;
                    Ok(res.map(|b| {
                        let b = b.map_err(Into::into);
                        if !watch {
                            return b.boxed_unsync();
                        }
                        // A watch: its answer ends when the watches are cut.
                        let frames = BodyStream::new(b).take_until(async move {
                            let _ = cut.changed().await;
                        });
                        StreamBody::new(frames).boxed_unsync()
                    }))
                })
            }
        }
    }
}
