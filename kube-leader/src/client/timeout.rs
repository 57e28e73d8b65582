//! The bounds of [`Liveness`](super::Liveness) that are tower layers: the connect bound of the
//! connector and the response-headers bound of every request.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Uri};
use tower::{BoxError, Layer, Service};

/// A connector whose connections (TCP, then TLS) are made within `timeout`, or fail saying so.
#[derive(Debug, Clone)]
pub(super) struct BoundedConnect<C> {
    pub(super) inner: C,
    pub(super) timeout: Duration,
}

impl<C> Service<Uri> for BoundedConnect<C>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let timeout = self.timeout;
        let what = format!(
            "{}:{}",
            uri.host().unwrap_or_default(),
            uri.port_u16().unwrap_or(443)
        );
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => {
                    Err(format!("TCP connect and TLS handshake with {what} took over {timeout:?}").into())
                }
            }
        })
    }
}

/// Bounds the wait for response headers: a request the API server does not start answering
/// within the bound fails (for a watch: its start; the body streams on unbounded).
#[derive(Debug, Clone, Copy)]
pub(super) struct HeadersTimeoutLayer(pub(super) Duration);

impl<S> Layer<S> for HeadersTimeoutLayer {
    type Service = HeadersTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HeadersTimeout {
            inner,
            timeout: self.0,
        }
    }
}

/// See [`HeadersTimeoutLayer`].
#[derive(Debug, Clone)]
pub(super) struct HeadersTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S, B> Service<Request<B>> for HeadersTimeout<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let timeout = self.timeout;
        let what = format!("{} {}", req.method(), req.uri().path());
        let answering = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(timeout, answering).await {
                Ok(r) => r.map_err(|e| connect_error_in_words(e.into())),
                Err(_) => Err(format!("the API server did not answer {what} within {timeout:?}").into()),
            }
        })
    }
}

/// The pool's "client error (Connect)" says nothing of the cause it wraps (a refused
/// connection, a timeout, a certificate): such an error becomes one message with its causes.
fn connect_error_in_words(e: BoxError) -> BoxError {
    let is_connect = e
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(hyper_util::client::legacy::Error::is_connect);
    if !is_connect {
        return e;
    }
    let mut message = "cannot connect to the API server".to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    message.into()
}
