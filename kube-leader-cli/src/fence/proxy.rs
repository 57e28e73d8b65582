//! `kube-leader run --fence`: a loopback proxy through which COMMAND, in any language, writes
//! with the leader's fencing token, without code changes.
//!
//! COMMAND gets a kubeconfig (`KUBECONFIG`) whose server is `https://127.0.0.1:<port>` (a CA
//! and certificate generated for this term: clients do not send bearer tokens over plain HTTP)
//! and whose bearer token is a random one made for this term. The proxy refuses every request without that
//! token (a Pod on the host network shares its loopback with the node), strips the caller's
//! credentials and impersonation headers, adds the fencing headers (`Impersonate-User` of
//! kube-leader's own user with the term's token as the user extra), stamps the objects and
//! patches it forwards (`kube_leader::fence::stamp_body`), and sends the request to the API
//! server with kube-leader's own credentials. Responses, watches included, stream back.

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
use tokio::net::TcpListener;
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

/// Starts a proxy on 127.0.0.1 that forwards through `client` as `user` with `token`, and
/// writes its kubeconfig into `dir`.
pub(crate) async fn start(client: Client, user: &str, token: u64, dir: &Path) -> Result<Proxy, String> {
    let headers = kube_leader::fence::fencing_headers(user, token)
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
    write_kubeconfig(
        &kubeconfig,
        addr,
        &bearer,
        &certs.ca_cert,
        client.default_namespace(),
    )?;
    let stop = CancellationToken::new();
    let shared = std::sync::Arc::new(Shared {
        client,
        headers,
        bearer: format!("Bearer {bearer}"),
        token,
    });
    tokio::spawn(serve(
        listener,
        tokio_rustls::TlsAcceptor::from(tls),
        shared,
        stop.clone(),
    ));
    info!(%addr, token, "fencing proxy for COMMAND");
    Ok(Proxy { kubeconfig, stop })
}

struct Shared {
    client: Client,
    headers: [(hyper::header::HeaderName, hyper::header::HeaderValue); 2],
    bearer: String,
    token: u64,
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
    let stampable = matches!(
        parts.method,
        hyper::Method::POST | hyper::Method::PUT | hyper::Method::PATCH
    ) && parts
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
        });
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
        .then(|| kube_leader::fence::stamp_body(&bytes, shared.token))
        .flatten()
    {
        Some(stamped) => Bytes::from(stamped),
        None => bytes,
    };
    // COMMAND's own credentials and impersonation never reach the API server.
    let names: Vec<_> = parts
        .headers
        .keys()
        .filter(|k| k.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for k in names {
        parts.headers.remove(k);
    }
    for k in [
        hyper::header::AUTHORIZATION,
        hyper::header::HOST,
        hyper::header::CONTENT_LENGTH,
        hyper::header::CONNECTION,
    ] {
        parts.headers.remove(k);
    }
    for (name, value) in &shared.headers {
        parts.headers.insert(name.clone(), value.clone());
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
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

fn random_hex(n: usize) -> Result<String, String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom for the proxy's bearer token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn write_kubeconfig(
    path: &Path,
    addr: SocketAddr,
    bearer: &str,
    ca_pem: &str,
    namespace: &str,
) -> Result<(), String> {
    use base64::Engine as _;
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-leader-fence\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\nusers:\n- name: kube-leader-fence\n  user:\n    token: \"{bearer}\"\ncontexts:\n- name: kube-leader-fence\n  context:\n    cluster: kube-leader-fence\n    user: kube-leader-fence\n    namespace: {namespace}\ncurrent-context: kube-leader-fence\n"
    );
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

    #[test]
    fn the_bearer_comparison_needs_the_whole_token() {
        assert!(same(b"Bearer abc", b"Bearer abc"));
        assert!(!same(b"Bearer abd", b"Bearer abc"));
        assert!(!same(b"Bearer ab", b"Bearer abc"));
    }
}
