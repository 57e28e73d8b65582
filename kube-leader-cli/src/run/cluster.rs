//! The cluster: a client once the API server answers, and the namespace and identity to use.

use std::time::Duration;

use anyhow::anyhow;
use kube::Client;
use kube_leader::discovery;
use tokio::time::Instant;
use tracing::debug;

use crate::{
    client::Liveness,
    exit::{self, Fail, OrExit},
};

/// A client, once the API server answers (or `timeout` has passed: exit code 4). Its
/// liveness bounds come from `renew_deadline` (see [`crate::client::Liveness`]).
pub(crate) async fn connect(timeout: Duration, renew_deadline: Duration) -> Result<Client, Fail> {
    let config = kube::Config::infer().await.map_err(|e| {
        Fail::new(
            exit::CLUSTER,
            anyhow!(e).context("no cluster configuration (in-cluster, or KUBECONFIG)"),
        )
    })?;
    let url = config.cluster_url.to_string();
    let client =
        crate::client::build(config, Liveness::for_renew_deadline(renew_deadline)).or_exit(exit::CLUSTER)?;
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

/// `--namespace`, else `POD_NAMESPACE`, else the service-account namespace, else the client's
/// (kubeconfig context): the library's rule.
pub(crate) fn resolve_namespace(explicit: Option<&str>, client: &Client) -> String {
    discovery::namespace_or_default(explicit, client)
}

/// `--identity`, else `POD_NAME`, else the host name: the library's rule.
pub(crate) fn resolve_identity(explicit: Option<&str>) -> Option<String> {
    discovery::resolve_identity(explicit)
}
