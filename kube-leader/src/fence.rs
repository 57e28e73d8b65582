//! Fencing the API server: requests that carry this term's fencing token, so that Kubernetes
//! itself refuses a deposed leader's writes to fenced objects. Users call
//! [`Leadership::fenced_client`](crate::Leadership::fenced_client); the rest is the sidecar's
//! (`kube_leader::internal::fence`).
//!
//! The token travels in the request's user info: the writer impersonates itself with one
//! extra, [`FENCING_TOKEN_EXTRA`]. `kube-leader fence` reads it in
//! `request.userInfo.extra` for every verb, and compares it with [`FENCED_TOKEN_ANNOTATION`] on
//! the object and with the lock's current token. A token is a claim: the fence protects against
//! honest writers that are paused, partitioned or late, not against a malicious one.

pub(crate) mod judge;
pub(crate) mod lock;

use std::{
    fmt,
    task::{Context, Poll},
};

use http::{HeaderName, HeaderValue, Request};
use kube::Client;
use tower::{Layer, Service, ServiceExt as _};

/// The user-info extra that carries a writer's fencing token to the webhook
/// (`request.userInfo.extra["kube-leader.io/fencing-token"] == ["<token>"]`).
pub const FENCING_TOKEN_EXTRA: &str = "kube-leader.io/fencing-token";

/// The annotation `kube-leader fence` stamps on every object a fenced writer creates or updates:
/// the token of that write. A later write with an older token is refused.
pub const FENCED_TOKEN_ANNOTATION: &str = "kube-leader.io/fenced-token";

/// The header that carries [`FENCING_TOKEN_EXTRA`]: `Impersonate-Extra-` and the key
/// percent-encoded, in lower case as header names are (the API server lower-cases the key and
/// percent-decodes `%2f` into `/`).
pub const FENCING_TOKEN_HEADER: &str = "impersonate-extra-kube-leader.io%2ffencing-token";

/// The header that names the impersonated user.
const IMPERSONATE_USER: &str = "impersonate-user";

/// The headers by which a request of `user` carries `token`: `Impersonate-User: <user>` and
/// [`FENCING_TOKEN_HEADER`]`: <token>`.
///
/// # Errors
///
/// If `user` cannot be a header value (a control character).
pub fn fencing_headers(
    user: &str,
    token: u64,
) -> Result<[(HeaderName, HeaderValue); 2], http::header::InvalidHeaderValue> {
    Ok([
        (
            HeaderName::from_static(IMPERSONATE_USER),
            HeaderValue::from_str(user)?,
        ),
        (
            HeaderName::from_static(FENCING_TOKEN_HEADER),
            HeaderValue::from(token),
        ),
    ])
}

/// A tower layer that adds a fencing token to every request (the headers only: see
/// [`stamp_body`] for the objects). [`Leadership::fenced_client`](crate::Leadership::fenced_client)
/// does both.
#[derive(Clone)]
pub struct FencedLayer {
    headers: [(HeaderName, HeaderValue); 2],
    user: String,
    token: u64,
}

impl fmt::Debug for FencedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedLayer")
            .field("user", &self.user)
            .field("token", &self.token)
            .finish()
    }
}

// === impl FencedLayer ===

impl FencedLayer {
    /// A layer by which requests of `user` (the writer's own user name as the API server knows
    /// it: `system:serviceaccount:<namespace>:<name>` for a ServiceAccount) carry `token`.
    ///
    /// # Errors
    ///
    /// If `user` cannot be a header value (a control character).
    pub fn new(user: impl Into<String>, token: u64) -> Result<Self, http::header::InvalidHeaderValue> {
        let user = user.into();
        Ok(Self {
            headers: fencing_headers(&user, token)?,
            user,
            token,
        })
    }

    /// The impersonated user.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The token carried.
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl<S> Layer<S> for FencedLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fenced {
            inner,
            headers: self.headers.clone(),
        }
    }
}

/// The service of a [`FencedLayer`]: adds the fencing headers to every request (replacing any
/// impersonation headers of the same names).
#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    headers: [(HeaderName, HeaderValue); 2],
}

impl<S: fmt::Debug> fmt::Debug for Fenced<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fenced")
            .field("inner", &self.inner)
            .field("token", &self.headers[1].1)
            .finish()
    }
}

impl<S, B> Service<Request<B>> for Fenced<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        for (name, value) in &self.headers {
            req.headers_mut().insert(name.clone(), value.clone());
        }
        self.inner.call(req)
    }
}

/// `client` with every request carrying `layer`'s headers, and every object it creates or
/// replaces and every merge, strategic-merge or apply patch it sends stamped with the token
/// ([`stamp_body`]; see [`Leadership::fenced_client`](crate::Leadership::fenced_client)).
pub(crate) fn fenced_client(client: Client, layer: &FencedLayer) -> Client {
    let namespace = client.default_namespace().to_owned();
    let token = layer.token;
    let service = layer.layer(tower::service_fn(move |req: Request<kube::client::Body>| {
        let client = client.clone();
        async move {
            let req = stamp_request(req, token).await?;
            client.send(req).await
        }
    }));
    Client::new(service.map_err(tower::BoxError::from), namespace)
}

/// `req` with its body stamped (see [`stamp_body`]) where it is an object or a patch that can
/// carry annotations.
async fn stamp_request(
    req: Request<kube::client::Body>,
    token: u64,
) -> kube::Result<Request<kube::client::Body>> {
    let stampable = matches!(
        *req.method(),
        http::Method::POST | http::Method::PUT | http::Method::PATCH
    ) && req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            // Not a JSON patch (application/json-patch+json): the fence's mutating half
            // stamps those.
            matches!(
                t,
                "application/json"
                    | "application/merge-patch+json"
                    | "application/strategic-merge-patch+json"
                    | "application/apply-patch+yaml"
            )
        });
    if !stampable {
        return Ok(req);
    }
    let (mut parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await?;
    let body = match stamp_body(&bytes, token) {
        Some(stamped) => {
            parts.headers.remove(http::header::CONTENT_LENGTH);
            kube::client::Body::from(stamped)
        }
        None => kube::client::Body::from(bytes),
    };
    Ok(Request::from_parts(parts, body))
}

/// A JSON object (an object to create or replace, or a merge or apply patch of one) with
/// `metadata.annotations["kube-leader.io/fenced-token"]` set to `token`; `None` if `body` is not
/// a JSON object (or its `metadata` or `annotations` are not objects), to be sent unchanged.
///
/// The fence's mutating half stamps every fenced write itself; a client that stamps too makes
/// the stamp independent of it (and of API servers that cannot apply a webhook's patch).
pub fn stamp_body(body: &[u8], token: u64) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object_mut()?;
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()))
        .as_object_mut()?;
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    if annotations.is_null() {
        *annotations = serde_json::Value::Object(serde_json::Map::new());
    }
    annotations
        .as_object_mut()?
        .insert(FENCED_TOKEN_ANNOTATION.into(), token.to_string().into());
    serde_json::to_vec(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_name_the_user_and_the_percent_encoded_extra() {
        let [(user, u), (extra, t)] = fencing_headers("system:serviceaccount:app:orders", 4711).unwrap();
        assert_eq!(user.as_str(), "impersonate-user");
        assert_eq!(u, "system:serviceaccount:app:orders");
        // The API server takes the rest of the name after `Impersonate-Extra-`, lower-cased, and
        // percent-decodes it: the key must come out as FENCING_TOKEN_EXTRA.
        let key = extra.as_str().strip_prefix("impersonate-extra-").unwrap();
        assert_eq!(key.replace("%2f", "/"), FENCING_TOKEN_EXTRA);
        assert_eq!(t, "4711");
    }

    #[test]
    fn bodies_are_stamped_where_they_can_carry_annotations() {
        let stamped = |b: &str| {
            stamp_body(b.as_bytes(), 7).map(|v| serde_json::from_slice::<serde_json::Value>(&v).unwrap())
        };
        let v = stamped(r#"{"metadata":{"name":"a","annotations":{"x":"y"}},"data":{}}"#).unwrap();
        assert_eq!(v["metadata"]["annotations"][FENCED_TOKEN_ANNOTATION], "7");
        assert_eq!(v["metadata"]["annotations"]["x"], "y");
        let v = stamped(r#"{"data":{"v":"1"}}"#).unwrap();
        assert_eq!(v["metadata"]["annotations"][FENCED_TOKEN_ANNOTATION], "7");
        let v = stamped(r#"{"metadata":{"annotations":null}}"#).unwrap();
        assert_eq!(v["metadata"]["annotations"][FENCED_TOKEN_ANNOTATION], "7");
        assert!(stamped(r#"[{"op":"add","path":"/x","value":1}]"#).is_none());
        assert!(stamped("not json").is_none());
    }

    #[test]
    fn a_user_with_a_newline_is_refused() {
        assert!(FencedLayer::new("a\nb", 1).is_err());
    }

    #[tokio::test]
    async fn the_layer_adds_both_headers_and_replaces_older_ones() {
        let layer = FencedLayer::new("user-1", 9).unwrap();
        let mut svc = layer.layer(tower::service_fn(|req: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(req.headers().clone())
        }));
        let req = Request::builder()
            .header("Impersonate-User", "someone-else")
            .body(())
            .unwrap();
        let headers = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(headers.get_all("impersonate-user").iter().count(), 1);
        assert_eq!(headers["impersonate-user"], "user-1");
        assert_eq!(headers[FENCING_TOKEN_HEADER], "9");
    }
}
