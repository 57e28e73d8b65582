//! The webhook server: TLS, HTTP/2 or HTTP/1.1, `POST /mutate/<rule>` and
//! `POST /validate/<rule>` (AdmissionReview v1), `GET /healthz`.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{body::Incoming, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::{
    core::{
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
        DynamicObject, Status,
    },
    Client,
};
use kube_leader::{
    internal::fence::{self, LockReadError, LockState},
    LockRef, Strategy,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    config::{FenceConfig, Guard, Rule},
    decide::{self, Write, Writer},
};

/// The largest AdmissionReview read (the API server's own request limit is 3 MiB of object,
/// which a review holds twice for an update).
const MAX_BODY: usize = 8 << 20;

/// How long one read of a lock may take: well inside the webhooks' timeout.
pub(crate) const LOCK_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// What every request handler shares.
pub(crate) struct Fence {
    pub(crate) config: FenceConfig,
    pub(crate) client: Client,
    /// Audit only: refusals are logged and allowed.
    pub(crate) audit_only: bool,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("rules", &self.config.rules.len())
            .field("audit_only", &self.audit_only)
            .finish_non_exhaustive()
    }
}

/// Which half of the fence a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    Mutate,
    Validate,
}

/// Serves `fence` on `listener` with `tls` until `shutdown` fires.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    fence: Arc<Fence>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let fence = fence.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return debug!(%peer, "TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(move |req| {
                let fence = fence.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&fence, peer, req).await) }
            });
            if let Err(e) = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

async fn handle(fence: &Fence, peer: SocketAddr, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    if path == "/healthz" || path == "/readyz" {
        return text(StatusCode::OK, "ok");
    }
    let (half, rule) = if let Some(rule) = path.strip_prefix("/mutate/") {
        (Half::Mutate, rule.to_owned())
    } else if let Some(rule) = path.strip_prefix("/validate/") {
        (Half::Validate, rule.to_owned())
    } else {
        return text(
            StatusCode::NOT_FOUND,
            "not found: POST /mutate/<rule> or /validate/<rule>",
        );
    };
    if req.method() != hyper::Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview");
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            debug!(%peer, error = %e, "cannot read a request body");
            return text(StatusCode::BAD_REQUEST, "cannot read the body");
        }
    };
    let response = match serde_json::from_slice::<AdmissionReview<DynamicObject>>(&body)
        .ok()
        .and_then(|r| TryInto::<AdmissionRequest<DynamicObject>>::try_into(r).ok())
    {
        Some(request) => review(fence, half, &rule, &request).await,
        None => AdmissionResponse::invalid("not an AdmissionReview v1 with a request"),
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(json) => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json)))
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response")),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "cannot serialize the response"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}

/// The fence's answer to one admission request.
async fn review(
    fence: &Fence,
    half: Half,
    rule_name: &str,
    req: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let allow = AdmissionResponse::from(req);
    let Some(rule) = fence.config.rule(rule_name) else {
        return deny(
            req,
            format!(
                "fenced: no rule {rule_name:?} in this fence's rules: the webhook configuration \
                 and the rules file disagree (apply `kube-leader fence webhooks` for these rules)"
            ),
        );
    };
    let namespace = req.namespace.as_deref();
    if decide::out_of_scope(namespace, &req.resource.group, &req.resource.resource)
        || matches!(req.operation, Operation::Connect)
    {
        return allow;
    }
    let user = req.user_info.username.as_deref().unwrap_or("");
    let writer = decide::writer(rule.fences(user), req.user_info.extra.as_ref());
    debug!(?half, rule = rule_name, operation = ?req.operation, user, ?writer, "review");
    match half {
        Half::Mutate => mutate(allow, req, &writer),
        Half::Validate => {
            let verdict = validate(fence, rule, req, user, &writer).await;
            match verdict {
                Ok(()) => allow,
                Err(message) if fence.audit_only => {
                    info!(rule = rule_name, user, audit_only = true, refusal = %message, "would refuse");
                    let mut allow = allow;
                    allow.audit_annotations.insert("would-refuse".into(), message);
                    allow
                }
                Err(message) => {
                    info!(rule = rule_name, user, refusal = %message, "refused a write");
                    deny(req, message)
                }
            }
        }
    }
}

/// The mutating half: stamps a fenced writer's token on the object it creates or updates.
fn mutate(
    allow: AdmissionResponse,
    req: &AdmissionRequest<DynamicObject>,
    writer: &Writer,
) -> AdmissionResponse {
    let (Writer::Token(token), Some(object)) = (writer, &req.object) else {
        return allow;
    };
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return allow;
    }
    // Already stamped with this token (the fenced client and `run --fence` stamp): no patch.
    if decide::stamp(object.metadata.annotations.as_ref()) == Some(Ok(*token)) {
        return allow;
    }
    let patch = decide::stamp_patch(object.metadata.annotations.is_some(), *token);
    match serde_json::from_value::<json_patch::Patch>(patch)
        .map_err(|e| e.to_string())
        .and_then(|p| allow.clone().with_patch(p).map_err(|e| e.to_string()))
    {
        Ok(patched) => patched,
        Err(e) => deny(req, format!("fenced: cannot stamp the fencing token: {e}")),
    }
}

/// The validating half's verdict.
async fn validate(
    fence: &Fence,
    rule: &Rule,
    req: &AdmissionRequest<DynamicObject>,
    user: &str,
    writer: &Writer,
) -> Result<(), String> {
    let object = req.object.as_ref().or(req.old_object.as_ref());
    let name = object
        .and_then(|o| {
            o.metadata
                .name
                .clone()
                .or_else(|| o.metadata.generate_name.clone())
        })
        .unwrap_or_else(|| req.name.clone());
    let namespace = req.namespace.clone().unwrap_or_default();
    let operation = match req.operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    };
    let write = Write {
        operation,
        resource: &req.resource.resource,
        namespace: &namespace,
        name: &name,
        user,
    };
    // The shard guarding the object: by its stored labels (update, delete), else its new ones.
    let labelled = req.old_object.as_ref().or(req.object.as_ref());
    let target = lock_target(rule, labelled.and_then(|o| o.metadata.labels.as_ref()));
    // The lock for the messages, also when the object names no shard.
    let lock_name = match (&target, rule.guard()) {
        (Ok(t), _) => t.lock.to_string(),
        (Err(_), Some(Guard::Shards(s))) => format!("a shard of set {}/{}", s.namespace, s.set),
        (Err(_), Some(Guard::Lock(l))) => format!("{}/{}", l.namespace, l.name),
        (Err(_), None) => "no lock".to_string(),
    };
    let token = match writer {
        Writer::Other => return Ok(()),
        Writer::NoToken => {
            return Err(decide::no_token(
                write,
                "the request carries no fencing token",
                &lock_name,
            ))
        }
        Writer::BadToken(why) => return Err(decide::no_token(write, why, &lock_name)),
        Writer::Token(t) => *t,
    };
    let refused = |e: String| {
        format!(
            "fenced: {} of {} {namespace}/{name} by {user} refused: {e}",
            operation.to_lowercase(),
            write.resource
        )
    };
    let target = target.map_err(refused)?;
    let (lock, lock_version) = read_lock(&fence.client, &target).await.map_err(refused)?;
    judge(req, write, token, &lock_name, (&lock, &lock_version))
}

/// The verdict on a fenced writer's `write` with `token`, given the lock as read (its state
/// and `resourceVersion`); logged as a `fence check` line.
fn judge(
    req: &AdmissionRequest<DynamicObject>,
    write: Write<'_>,
    token: u64,
    lock_name: &str,
    (lock, lock_version): (&LockState, &str),
) -> Result<(), String> {
    let stored = req
        .old_object
        .as_ref()
        .and_then(|o| decide::stamp(o.metadata.annotations.as_ref()));
    let stamped = match req.operation {
        Operation::Create | Operation::Update => Some(
            req.object
                .as_ref()
                .and_then(|o| decide::stamp(o.metadata.annotations.as_ref())),
        ),
        _ => None,
    };
    let verdict = decide::judge(write, token, stored, stamped, lock_name, lock);
    log_check(
        req,
        write,
        token,
        lock_name,
        (lock, lock_version),
        verdict.is_ok(),
    );
    verdict
}

/// One debug line per fenced write checked against its lock (`fence check`): what the check
/// read, so that a run can tell, per committed write, whether the lock moved between this read
/// and the commit. The stored object's `resourceVersion` (`old_version`) names the write: it
/// commits as the object's next version.
fn log_check(
    req: &AdmissionRequest<DynamicObject>,
    write: Write<'_>,
    token: u64,
    lock_name: &str,
    (lock, lock_version): (&LockState, &str),
    allowed: bool,
) {
    let old_version = req
        .old_object
        .as_ref()
        .and_then(|o| o.metadata.resource_version.as_deref());
    let lock_token = match lock {
        LockState::Held { token, .. } => Some(*token),
        LockState::Missing => None,
    };
    debug!(
        operation = write.operation,
        namespace = write.namespace,
        name = write.name,
        token,
        old_version,
        lock = lock_name,
        lock_version,
        lock_token,
        allowed,
        "fence check"
    );
}

/// The lock an object is guarded by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockTarget {
    pub(crate) lock: LockRef,
    pub(crate) strategy: Strategy,
}

/// The lock that guards an object with `labels` under `rule`.
fn lock_target(
    rule: &Rule,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<LockTarget, String> {
    match rule.guard() {
        None => Err(format!("rule {:?} names no lock", rule.name)),
        Some(Guard::Lock(l)) => Ok(LockTarget {
            lock: LockRef {
                namespace: l.namespace.clone(),
                name: l.name.clone(),
            },
            strategy: l.strategy,
        }),
        Some(Guard::Shards(s)) => {
            let index = labels.and_then(|l| l.get(&s.label)).ok_or_else(|| {
                format!(
                    "the object has no label {} naming its shard of set {}/{}",
                    s.label, s.namespace, s.set
                )
            })?;
            let index: u32 = index
                .parse()
                .map_err(|_| format!("its label {}={index:?} is not a shard index", s.label))?;
            Ok(LockTarget {
                lock: LockRef {
                    namespace: s.namespace.clone(),
                    name: format!("{}-{index}", s.set),
                },
                strategy: Strategy::Lease,
            })
        }
    }
}

/// Reads the lock with a GET (served from etcd, not from the API server's watch cache): its
/// state and the `resourceVersion` read (empty when it does not exist); `Err` is the refusal's
/// reason.
async fn read_lock(client: &Client, target: &LockTarget) -> Result<(LockState, String), String> {
    let lock = &target.lock;
    match fence::read_lock(client, target.strategy, lock, LOCK_READ_TIMEOUT).await {
        Ok(state) => Ok(state),
        Err(LockReadError::Malformed(e)) => Err(format!("lock {lock}: {e}")),
        Err(LockReadError::Forbidden { resource }) => {
            warn!(%lock, "the fence may not read its lock");
            Err(format!(
                "the fence cannot read lock {lock}: missing permission get {resource} {} in \
                 namespace {} for the fence's own user (see deploy/fence/rbac.yaml)",
                lock.name, lock.namespace
            ))
        }
        Err(LockReadError::TimedOut(t)) => Err(format!("the fence could not read lock {lock} within {t:?}")),
        Err(e) => Err(format!("the fence cannot read lock {lock}: {e}")),
    }
}

/// A refusal: 403 Forbidden (a deposed leader must not retry the same write), with `message`.
fn deny(req: &AdmissionRequest<DynamicObject>, message: String) -> AdmissionResponse {
    let mut r = AdmissionResponse::from(req).deny(&message);
    r.result = Status::failure(&message, "Forbidden").with_code(403);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(annotations: serde_json::Value) -> AdmissionRequest<DynamicObject> {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                "resource": {"group": "", "version": "v1", "resource": "configmaps"},
                "name": "orders", "namespace": "app", "operation": "UPDATE",
                "userInfo": {"username": "user-1"},
                "object": {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "orders", "annotations": annotations}},
                "oldObject": null, "dryRun": false
            }
        });
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(review).unwrap();
        review.try_into().unwrap()
    }

    #[test]
    fn the_mutating_half_stamps_only_a_fenced_writers_unstamped_object() {
        let req = request(serde_json::json!({"x": "y"}));
        let allow = AdmissionResponse::from(&req);
        let r = mutate(allow.clone(), &req, &Writer::Token(7));
        let patch: serde_json::Value = serde_json::from_slice(r.patch.as_deref().unwrap()).unwrap();
        assert_eq!(
            patch[0]["path"],
            "/metadata/annotations/kube-leader.io~1fenced-token"
        );
        assert_eq!(patch[0]["value"], "7");
        assert!(mutate(allow.clone(), &req, &Writer::Other).patch.is_none());
        assert!(mutate(allow.clone(), &req, &Writer::NoToken).patch.is_none());
        let stamped = request(serde_json::json!({FENCED: "7"}));
        assert!(mutate(allow, &stamped, &Writer::Token(7)).patch.is_none());
    }

    const FENCED: &str = kube_leader::internal::fence::FENCED_TOKEN_ANNOTATION;

    #[test]
    fn shards_are_named_by_the_objects_label() {
        let config = FenceConfig::parse(
            r#"
rules:
  - name: work
    resources: [{ apiGroup: apps, resource: deployments }]
    namespaceSelector: { matchLabels: { fence: work } }
    shards: { namespace: app, set: work, label: example.com/shard }
    writers: [user-1]
"#,
        )
        .unwrap();
        let rule = &config.rules[0];
        let labels = [("example.com/shard".to_string(), "3".to_string())].into();
        let t = lock_target(rule, Some(&labels)).unwrap();
        assert_eq!(
            (t.lock.namespace.as_str(), t.lock.name.as_str()),
            ("app", "work-3")
        );
        let e = lock_target(rule, None).unwrap_err();
        assert!(e.contains("no label example.com/shard"), "{e}");
        let labels = [("example.com/shard".to_string(), "x".to_string())].into();
        assert!(lock_target(rule, Some(&labels)).is_err());
    }
}
