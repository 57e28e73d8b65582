//! `kube-leader run --fence`: a loopback proxy through which COMMAND, in any language, writes
//! with the leader's fencing token, without code changes.
//!
//! COMMAND gets a kubeconfig (`KUBECONFIG`) whose server is `https://127.0.0.1:<port>` (a CA
//! and certificate generated for this term: clients do not send bearer tokens over plain HTTP)
//! and whose bearer token is a random one made for this term. The proxy refuses every request without that
//! token (a Pod on the host network shares its loopback with the node), strips the caller's
//! credentials and impersonation headers, adds the fencing headers (`Impersonate-User` of
//! kube-leader's own user with the term's token as the user extra), stamps the objects and
//! patches it forwards (`kube_leader::internal::fence::stamp_body`), and sends the request to the API
//! server with kube-leader's own credentials. Responses, watches included, stream back.
//!
//! With `--shards` the token is a shard's: the kubeconfig has a context `shard-<i>` per shard
//! (server `https://127.0.0.1:<port>/shards/<i>`), and a request through it carries shard `i`'s
//! current token, or is refused at once (403) while this replica does not hold shard `i`. The
//! default context carries no token: reads pass, fenced writes are refused by the fence.

use std::{
    io::Read as _,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
};

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt as _, Full, Limited};
use hyper::{body::Incoming, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::Client;
use kube_leader::ShardSet;
use tokio::{net::TcpListener, sync::watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// The largest request body forwarded (the API server's own limit is 3 MiB).
const MAX_BODY: usize = 8 << 20;

type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub(crate) struct Proxy {
    /// The kubeconfig COMMAND gets.
    pub(crate) kubeconfig: PathBuf,
    stop: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// The fencing token a request carries.
#[derive(Debug, Clone)]
pub(crate) enum Tokens {
    /// One term's (`run --fence`).
    Term(u64),
    /// The shards': shard `i`'s current token for a request under `/shards/<i>/`
    /// (`run --shards M --fence`).
    Shards {
        /// The shards held now, with their tokens; a shard leaves it the moment it is lost.
        held: watch::Receiver<ShardSet>,
        /// How many shards the set has.
        count: u32,
    },
}

/// Starts a proxy on 127.0.0.1 that forwards through `client` as `user` with `tokens`, and
/// writes its kubeconfig into `dir`.
pub(crate) async fn start(client: Client, user: &str, tokens: Tokens, dir: &Path) -> Result<Proxy, String> {
    kube_leader::internal::fence::fencing_headers(user, 0)
        .map_err(|e| format!("--fence-user {user:?} cannot be a header value: {e}"))?;
    let bearer = random_hex(32)?;
    let certs = super::tls::generate_pem(&["127.0.0.1".to_string()])?;
    let tls = super::tls::server_config_pem(&certs)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(|e| format!("the fencing proxy cannot listen on 127.0.0.1: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("the fencing proxy's address: {e}"))?;
    let kubeconfig = dir.join(format!("kube-leader-fence-{}.kubeconfig", std::process::id()));
    let shards = match &tokens {
        Tokens::Term(_) => 0,
        Tokens::Shards { count, .. } => *count,
    };
    let config = Kubeconfig {
        addr,
        bearer: &bearer,
        ca_pem: &certs.ca_cert,
        namespace: client.default_namespace(),
        shards,
    };
    write_kubeconfig(&kubeconfig, &config)?;
    let stop = CancellationToken::new();
    match &tokens {
        Tokens::Term(token) => info!(%addr, token, "fencing proxy for COMMAND"),
        Tokens::Shards { count, .. } => {
            info!(%addr, shards = count, "fencing proxy for COMMAND (a context per shard)")
        }
    }
    let shared = std::sync::Arc::new(Shared {
        client,
        user: user.to_owned(),
        bearer: format!("Bearer {bearer}"),
        tokens,
    });
    tokio::spawn(serve(
        listener,
        tokio_rustls::TlsAcceptor::from(tls),
        shared,
        stop.clone(),
    ));
    Ok(Proxy { kubeconfig, stop })
}

struct Shared {
    client: Client,
    /// The user the proxy impersonates (checked to be a header value at start).
    user: String,
    bearer: String,
    tokens: Tokens,
}

/// The token for a request to `path`, and the path to forward: `Err` is the refusal. A read
/// (`read`: GET, HEAD) under a shard this replica does not hold passes without a token.
fn token_for<'p>(
    tokens: &Tokens,
    path: &'p str,
    read: bool,
) -> Result<(Option<u64>, &'p str), (StatusCode, String)> {
    let (held, count) = match tokens {
        Tokens::Term(t) => return Ok((Some(*t), path)),
        Tokens::Shards { held, count } => (held, *count),
    };
    let Some(rest) = path.strip_prefix("/shards/") else {
        return Ok((None, path));
    };
    let (index, rest) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let rest = if rest.is_empty() { "/" } else { rest };
    let index: u32 = match index.parse() {
        Ok(i) if i < count => i,
        _ => {
            return Err((
                StatusCode::NOT_FOUND,
                format!("kube-leader's fencing proxy: no shard {index:?}: the set has shards 0..{count} (contexts shard-0 .. shard-{})", count.saturating_sub(1)),
            ))
        }
    };
    let set = held.borrow();
    match set.held.get(&index) {
        Some(token) => Ok((Some(*token), rest)),
        None if read => Ok((None, rest)),
        None => Err((
            StatusCode::FORBIDDEN,
            format!(
                "kube-leader's fencing proxy: shard {index} is not held by this replica (it holds {:?}): a write for it would be a deposed holder's",
                set.held.keys().collect::<Vec<_>>()
            ),
        )),
    }
}

async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: std::sync::Arc<Shared>,
    stop: CancellationToken,
) {
    loop {
        let (tcp, _) = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    debug!(error = %e, "fencing proxy: accept failed");
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let stop = stop.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(e) => return debug!(error = %e, "fencing proxy: TLS handshake failed"),
            };
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(forward(&shared, req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            tokio::select! {
                r = conn => if let Err(e) = r { debug!(error = %e, "fencing proxy: connection ended") },
                () = stop.cancelled() => {}
            }
        });
    }
}

/// Whether `a` equals `b`, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn plain(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "code": status.as_u16(),
    });
    let mut r = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

async fn forward(shared: &Shared, req: Request<Incoming>) -> Response<ProxyBody> {
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|v| same(v.as_bytes(), shared.bearer.as_bytes()));
    if !authorized {
        tracing::warn!(
            method = %req.method(),
            path = req.uri().path(),
            "fencing proxy: refused a request without COMMAND's bearer token"
        );
        return plain(
            StatusCode::UNAUTHORIZED,
            "kube-leader's fencing proxy: use the bearer token of the KUBECONFIG kube-leader gave COMMAND",
        );
    }
    let (mut parts, body) = req.into_parts();
    let full = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let read = matches!(parts.method, hyper::Method::GET | hyper::Method::HEAD);
    let (token, path) = match token_for(&shared.tokens, &full, read) {
        Ok(t) => t,
        Err((status, message)) => {
            tracing::warn!(method = %parts.method, path = %full, "{message}");
            return plain(status, &message);
        }
    };
    let stampable = token.is_some() && stampable(&parts);
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the request body: {e}"),
            )
        }
    };
    let bytes = match stampable
        .then(|| kube_leader::internal::fence::stamp_body(&bytes, token.unwrap_or_default()))
        .flatten()
    {
        Some(stamped) => Bytes::from(stamped),
        None => bytes,
    };
    if let Err(message) = rewrite_headers(&mut parts.headers, &shared.user, token) {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, message);
    }
    parts.uri = match path.parse() {
        Ok(u) => u,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "invalid request path"),
    };
    let request = Request::from_parts(parts, kube::client::Body::from(bytes));
    match shared.client.send(request).await {
        Ok(response) => response.map(|b| b.map_err(Into::into).boxed_unsync()),
        Err(e) => plain(
            StatusCode::BAD_GATEWAY,
            &format!("kube-leader's fencing proxy cannot reach the API server: {e}"),
        ),
    }
}

/// Whether the request's body is an object or a patch the proxy stamps with the token.
fn stampable(parts: &hyper::http::request::Parts) -> bool {
    let writes = matches!(
        parts.method,
        hyper::Method::POST | hyper::Method::PUT | hyper::Method::PATCH
    );
    writes
        && parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|t| t.split(';').next().unwrap_or("").trim().to_owned())
            .is_some_and(|t| {
                matches!(
                    t.as_str(),
                    "application/json"
                        | "application/merge-patch+json"
                        | "application/strategic-merge-patch+json"
                        | "application/apply-patch+yaml"
                )
            })
}

/// COMMAND's own credentials and impersonation never reach the API server; the fencing
/// headers of `token` (impersonating `user`) do.
fn rewrite_headers(
    headers: &mut hyper::HeaderMap,
    user: &str,
    token: Option<u64>,
) -> Result<(), &'static str> {
    let names: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for k in names {
        headers.remove(k);
    }
    for k in [
        hyper::header::AUTHORIZATION,
        hyper::header::HOST,
        hyper::header::CONTENT_LENGTH,
        hyper::header::CONNECTION,
    ] {
        headers.remove(k);
    }
    if let Some(token) = token {
        let fencing = kube_leader::internal::fence::fencing_headers(user, token)
            .map_err(|_| "the fencing headers cannot be built")?;
        for (name, value) in fencing {
            headers.insert(name, value);
        }
    }
    Ok(())
}

fn random_hex(n: usize) -> Result<String, String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom for the proxy's bearer token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What COMMAND's kubeconfig says.
struct Kubeconfig<'a> {
    addr: SocketAddr,
    bearer: &'a str,
    ca_pem: &'a str,
    namespace: &'a str,
    /// With `--shards`: a context `shard-<i>` per shard.
    shards: u32,
}

/// The kubeconfig's text: the context `kube-leader-fence` (current), and `shard-<i>` for each
/// shard, whose server's path names the shard.
fn kubeconfig_text(k: &Kubeconfig<'_>) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(k.ca_pem);
    let (addr, bearer, namespace) = (k.addr, k.bearer, k.namespace);
    let names = std::iter::once(("kube-leader-fence".to_string(), String::new()))
        .chain((0..k.shards).map(|i| (format!("shard-{i}"), format!("/shards/{i}"))));
    let (mut clusters, mut contexts) = (String::new(), String::new());
    for (name, path) in names {
        clusters.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: https://{addr}{path}\n    certificate-authority-data: {ca}\n"
        ));
        contexts.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: kube-leader-fence\n    namespace: {namespace}\n"
        ));
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}users:\n- name: kube-leader-fence\n  user:\n    token: \"{bearer}\"\ncontexts:\n{contexts}current-context: kube-leader-fence\n"
    )
}

fn write_kubeconfig(path: &Path, config: &Kubeconfig<'_>) -> Result<(), String> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let text = kubeconfig_text(config);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| {
            format!(
                "cannot write the fencing proxy's kubeconfig {}: {e}",
                path.display()
            )
        })
}

/// The user name in the in-cluster ServiceAccount token (`sub`), for `--fence-user`'s default.
pub(crate) fn in_cluster_user() -> Option<String> {
    let token = std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/token").ok()?;
    let payload = token.trim().split('.').nth(1)?;
    let json = base64url(payload)?;
    let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
    claims.get("sub")?.as_str().map(str::to_owned)
}

/// Decodes unpadded base64url.
fn base64url(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_decodes_a_jwt_payload() {
        // {"sub":"system:serviceaccount:app:orders"}
        let enc = "eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YXBwOm9yZGVycyJ9";
        let json: serde_json::Value = serde_json::from_slice(&base64url(enc).unwrap()).unwrap();
        assert_eq!(json["sub"], "system:serviceaccount:app:orders");
        assert!(base64url("not*base64").is_none());
    }

    fn shards(held: &[(u32, u64)]) -> Tokens {
        let mut set = ShardSet::default();
        set.held = held.iter().copied().collect();
        Tokens::Shards {
            held: watch::channel(set).1,
            count: 4,
        }
    }

    #[test]
    fn a_shard_path_carries_that_shards_token_or_is_refused() {
        let t = shards(&[(1, 70), (3, 90)]);
        assert_eq!(
            token_for(&t, "/shards/1/api/v1/namespaces/a/configmaps", false).unwrap(),
            (Some(70), "/api/v1/namespaces/a/configmaps")
        );
        assert_eq!(token_for(&t, "/shards/3", false).unwrap(), (Some(90), "/"));
        // No shard: no token (reads pass; fenced writes are refused by the fence).
        assert_eq!(
            token_for(&t, "/api/v1/pods", false).unwrap(),
            (None, "/api/v1/pods")
        );
        let (status, m) = token_for(&t, "/shards/2/api", false).unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(m.contains("shard 2 is not held") && m.contains("[1, 3]"), "{m}");
        // A read of a shard not held passes, without a token.
        assert_eq!(token_for(&t, "/shards/2/api", true).unwrap(), (None, "/api"));
        for bad in ["/shards/4/api", "/shards/x/api", "/shards//api"] {
            assert_eq!(
                token_for(&t, bad, false).unwrap_err().0,
                StatusCode::NOT_FOUND,
                "{bad}"
            );
        }
        assert_eq!(
            token_for(&Tokens::Term(5), "/shards/1/api", false).unwrap(),
            (Some(5), "/shards/1/api")
        );
    }

    #[test]
    fn the_kubeconfig_has_a_context_per_shard() {
        let k = Kubeconfig {
            addr: "127.0.0.1:9".parse().unwrap(),
            bearer: "b",
            ca_pem: "ca",
            namespace: "app",
            shards: 2,
        };
        let text = kubeconfig_text(&k);
        for s in [
            "server: https://127.0.0.1:9\n",
            "server: https://127.0.0.1:9/shards/1\n",
            "- name: shard-0",
            "current-context: kube-leader-fence",
        ] {
            assert!(text.contains(s), "{s}: {text}");
        }
        assert!(!text.contains("shard-2"));
    }

    #[test]
    fn the_bearer_comparison_needs_the_whole_token() {
        assert!(same(b"Bearer abc", b"Bearer abc"));
        assert!(!same(b"Bearer abd", b"Bearer abc"));
        assert!(!same(b"Bearer ab", b"Bearer abc"));
    }
}
