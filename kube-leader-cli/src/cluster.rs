//! The cluster: a client once the API server answers, and the namespace and identity to use.

use std::time::Duration;

use anyhow::anyhow;
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};
use kube_leader::internal::discovery;
use tokio::time::Instant;
use tracing::debug;

use crate::{
    cli::ClusterArgs,
    client::Liveness,
    exit::{self, Fail, OrExit},
};

/// A client for `args`' configuration ([`config`]), once the API server answers (or `timeout`
/// has passed: exit code 123). Its liveness bounds come from `renew_deadline` (see
/// [`crate::client::Liveness`]).
pub(crate) async fn connect(
    args: &ClusterArgs,
    timeout: Duration,
    renew_deadline: Duration,
) -> Result<Client, Fail> {
    let mut config = config(args).await?;
    // No kube retry layer: it retries 429, 503 and 504 up to 15 times from 5 ms, on top of
    // kube-leader's own retries, which know the renew deadline, honour `Retry-After` and
    // spread themselves; under overload the layer multiplied the load (a retry spiral).
    config.default_retry = false;
    let url = config.cluster_url.to_string();
    let liveness = Liveness::for_renew_deadline(renew_deadline);
    let client = crate::client::build(config, liveness, args.http1).or_exit(exit::CLUSTER)?;
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let err =
            match tokio::time::timeout(left.min(Duration::from_secs(5)), client.apiserver_version()).await {
                Ok(Ok(_)) => return Ok(client),
                Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
                    return Err(Fail::new(
                        exit::CLUSTER,
                        anyhow!("the API server at {url} refused our credentials: {}", s.message),
                    ));
                }
                Ok(Err(e)) => anyhow!(e),
                Err(_) => anyhow!("no answer"),
            };
        if Instant::now() >= deadline {
            return Err(Fail::new(
                exit::CLUSTER,
                err.context(format!(
                    "cannot reach the API server at {url} (tried for {})",
                    humantime::format_duration(timeout)
                )),
            ));
        }
        debug!(error = %format!("{err:#}"), "API server not reachable yet");
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// The configuration: with `--kubeconfig`, that file; else, with `--context`, KUBECONFIG or
/// ~/.kube/config; else in-cluster, then KUBECONFIG or ~/.kube/config (kube's `infer`). A
/// `--context` the kubeconfig lacks is exit code 123, naming the context and the file.
async fn config(args: &ClusterArgs) -> Result<Config, Fail> {
    let fail = |e: anyhow::Error| Fail::new(exit::CLUSTER, e);
    if args.kubeconfig.is_none() && args.context.is_none() {
        return Config::infer()
            .await
            .map_err(|e| fail(anyhow!(e).context("no cluster configuration (in-cluster, or KUBECONFIG)")));
    }
    let source = match &args.kubeconfig {
        Some(path) => format!("--kubeconfig {}", path.display()),
        None => "KUBECONFIG or ~/.kube/config".to_string(),
    };
    let kubeconfig = match &args.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(|e| fail(anyhow!(e).context(format!("cannot read the kubeconfig ({source})"))))?;
    if let Some(name) = &args.context {
        if !kubeconfig.contexts.iter().any(|c| &c.name == name) {
            let known: Vec<&str> = kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
            return Err(fail(anyhow!(
                "--context {name}: the kubeconfig ({source}) has no such context (it has: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
    }
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| fail(anyhow!(e).context(format!("cannot use the kubeconfig ({source})"))))
}

/// `client` as the elector's ServiceAccount `elector` of `namespace`
/// (`--elector-service-account`: kube-leader's own requests by impersonation, COMMAND's as the
/// Pod's), or `client` itself without one. Asks the API server once (`/version`, which every
/// authenticated user may read): a refused impersonation is exit code 123, naming the
/// permission and `rbac`, the `kube-leader rbac` command line (without the ServiceAccounts)
/// that prints the Role granting it.
pub(crate) async fn as_elector(
    client: Client,
    namespace: &str,
    elector: Option<&str>,
    rbac: &str,
) -> Result<Client, Fail> {
    let Some(elector) = elector else {
        return Ok(client);
    };
    let user = crate::client::service_account_user(namespace, elector);
    let impersonating = crate::client::impersonating(client.clone(), &user).or_exit(exit::USAGE)?;
    let probe = tokio::time::timeout(Duration::from_secs(10), impersonating.apiserver_version()).await;
    match probe {
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
            debug!(message = %s.message, "the API server refused the impersonation");
            let requester = who_am_i(&client).await;
            let service_account = requester
                .as_deref()
                .and_then(|u| u.strip_prefix("system:serviceaccount:"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, name)| format!(" --service-account {name}"))
                .unwrap_or_default();
            let who = requester.map(|u| format!(" for {u}")).unwrap_or_default();
            Err(Fail::new(
                exit::CLUSTER,
                anyhow!(
                    "missing permission: impersonate serviceaccounts {elector} in namespace \
                     {namespace}{who} (--elector-service-account {elector}: kube-leader's own \
                     requests go as that ServiceAccount); `{rbac}{service_account} \
                     --elector-service-account {elector}` prints the Role that grants it"
                ),
            ))
        }
        Ok(Err(e)) => {
            // Not a refusal: the election's own calls retry and report what goes on failing.
            debug!(error = %e, "the first request as the elector failed");
            Ok(impersonating)
        }
        Ok(Ok(_)) | Err(_) => Ok(impersonating),
    }
}

/// The user `client` authenticates as (a SelfSubjectReview, which every user may create), for
/// an error message; `None` if the API server does not say.
async fn who_am_i(client: &Client) -> Option<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api = kube::Api::<SelfSubjectReview>::all(client.clone());
    let (params, review) = (kube::api::PostParams::default(), SelfSubjectReview::default());
    let review = tokio::time::timeout(Duration::from_secs(5), api.create(&params, &review))
        .await
        .ok()?
        .ok()?;
    review.status?.user_info?.username
}

/// `--namespace`, else `POD_NAMESPACE`, else the service-account namespace, else the client's
/// (kubeconfig context): the library's rule.
pub(crate) fn resolve_namespace(explicit: Option<&str>, client: &Client) -> String {
    discovery::namespace_or_default(explicit, client)
}

/// `--identity`, else `POD_NAME`, else the host name: the library's rule.
pub(crate) fn resolve_identity(explicit: Option<&str>) -> Option<String> {
    discovery::resolve_identity(explicit)
}
