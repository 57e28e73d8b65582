//! The subcommands of `kube-leader fence`: serve, certs, webhooks, check.

use std::sync::Arc;

use anyhow::anyhow;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::{
    api::{Patch, PatchParams},
    Api,
};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::{
    config::{FenceConfig, Guard},
    server::{self, Fence},
    tls,
    webhooks::{self, Endpoint, Options},
};
use crate::{
    cli::{FenceArgs, FenceCertsArgs, FenceCommand, FenceServeArgs, FenceWebhooksArgs},
    exit::{self, Fail, OrExit},
};

/// The field manager of `kube-leader fence webhooks --apply`.
const FIELD_MANAGER: &str = "kube-leader-fence";

/// `run --fence` (`fence`): the user the proxy impersonates (`--fence-user`, else the
/// in-cluster ServiceAccount's), or `None` without `--fence`.
pub(crate) fn proxy_user(fence: bool, fence_user: Option<String>) -> Result<Option<String>, Fail> {
    if !fence {
        return Ok(None);
    }
    match fence_user.or_else(super::proxy::in_cluster_user) {
        Some(user) => Ok(Some(user)),
        None => Err(Fail::new(
            exit::USAGE,
            anyhow!(
                "--fence: no --fence-user, and no in-cluster ServiceAccount token to read the \
                 user from: give --fence-user USER (kube-leader's own user name, as in \
                 system:serviceaccount:NAMESPACE:NAME)"
            ),
        )),
    }
}

/// `kube-leader fence`: returns the exit code.
pub(crate) async fn fence(args: FenceArgs) -> Result<u8, Fail> {
    match args.command {
        FenceCommand::Serve(a) => serve(a).await,
        FenceCommand::Certs(a) => certs(&a),
        FenceCommand::Webhooks(a) => webhooks(a).await,
        FenceCommand::Check(a) => {
            let config = rules(&a.rules)?;
            print!("{}", summary(&config));
            Ok(0)
        }
    }
}

fn rules(path: &std::path::Path) -> Result<FenceConfig, Fail> {
    FenceConfig::read(path).map_err(|e| Fail::new(exit::USAGE, anyhow!(e)))
}

/// One line per rule: what it fences, by which lock, against whom.
fn summary(config: &FenceConfig) -> String {
    let mut s = String::new();
    for r in &config.rules {
        let resources: Vec<String> = r
            .resources
            .iter()
            .map(|x| {
                if x.api_group.is_empty() {
                    x.resource.clone()
                } else {
                    format!("{}.{}", x.resource, x.api_group)
                }
            })
            .collect();
        let guard = match r.guard() {
            None => "no lock".to_string(),
            Some(Guard::Lock(l)) => format!("lock {}/{} ({})", l.namespace, l.name, l.strategy),
            Some(Guard::Shards(sh)) => format!("shard {}/{}-<{}> (lease)", sh.namespace, sh.set, sh.label),
        };
        s.push_str(&format!(
            "rule {}: {} guarded by {guard}; fenced writers: {}\n",
            r.name,
            resources.join(", "),
            r.writers.join(", ")
        ));
    }
    s
}

async fn serve(args: FenceServeArgs) -> Result<u8, Fail> {
    let config = rules(&args.rules.rules)?;
    let files = tls::CertFiles::in_dir(&args.tls_dir);
    let tls = tls::server_config(&files.cert, &files.key).map_err(|e| Fail::new(exit::USAGE, anyhow!(e)))?;
    let client = crate::cluster::connect(
        &args.cluster,
        args.connect_timeout,
        crate::client::ONE_OFF_RENEW_DEADLINE,
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Fail::new(exit::USAGE, anyhow!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr().or_exit(exit::INTERNAL)?;
    info!(%addr, rules = config.rules.len(), audit_only = args.audit_only, "fence serving");
    let fence = Arc::new(Fence {
        config,
        client,
        audit_only: args.audit_only,
    });
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).or_exit(exit::INTERNAL)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stop.cancel();
    });
    server::serve(listener, tls, fence, shutdown).await;
    info!("fence stopped");
    Ok(0)
}

fn certs(args: &FenceCertsArgs) -> Result<u8, Fail> {
    let files = tls::generate(&args.out, &args.sans).map_err(|e| Fail::new(exit::USAGE, anyhow!(e)))?;
    println!(
        "wrote {} (the webhooks' caBundle), {}, {} and ca.key (keep it secret, or delete it)",
        files.ca_cert.display(),
        files.cert.display(),
        files.key.display()
    );
    Ok(0)
}

/// `--service NAMESPACE/NAME[:PORT]`.
fn parse_service(s: &str) -> Result<Endpoint, String> {
    let (namespace, rest) = s
        .split_once('/')
        .ok_or_else(|| format!("--service {s:?}: write NAMESPACE/NAME[:PORT]"))?;
    let (name, port) = match rest.split_once(':') {
        Some((n, p)) => (
            n,
            p.parse()
                .map_err(|_| format!("--service {s:?}: the port {p:?} is not a number"))?,
        ),
        None => (rest, 443),
    };
    Ok(Endpoint::Service {
        namespace: namespace.into(),
        name: name.into(),
        port,
    })
}

/// Where the API server reaches the webhooks (`--url` or `--service`) and its call timeout in
/// whole seconds (`--timeout`), or what is wrong with them.
fn endpoint_and_timeout(args: &FenceWebhooksArgs) -> Result<(Endpoint, i32), String> {
    let endpoint = match (&args.url, &args.service) {
        (Some(url), _) if url.starts_with("https://") => Endpoint::Url(url.clone()),
        (Some(url), _) => {
            return Err(format!(
                "--url {url:?}: the API server calls webhooks over https://"
            ))
        }
        (None, Some(s)) => parse_service(s)?,
        (None, None) => return Err("give --url or --service".into()),
    };
    let timeout_seconds = i32::try_from(args.timeout.as_secs()).unwrap_or(0);
    if !(1..=30).contains(&timeout_seconds) {
        return Err(format!(
            "--timeout {}: the API server accepts 1s to 30s",
            humantime::format_duration(args.timeout)
        ));
    }
    Ok((endpoint, timeout_seconds))
}

async fn webhooks(args: FenceWebhooksArgs) -> Result<u8, Fail> {
    let usage = |e: String| Fail::new(exit::USAGE, anyhow!(e));
    let config = rules(&args.rules.rules)?;
    let ca = std::fs::read(&args.ca_bundle).map_err(|e| {
        usage(format!(
            "cannot read --ca-bundle {}: {e}",
            args.ca_bundle.display()
        ))
    })?;
    let (endpoint, timeout_seconds) = endpoint_and_timeout(&args).map_err(usage)?;
    let o = Options {
        name: &args.name,
        endpoint: &endpoint,
        ca_bundle: &ca,
        timeout_seconds,
    };
    if !args.apply {
        print!(
            "{}",
            webhooks::yaml(&config, &o, !args.without_mutating).map_err(usage)?
        );
        return Ok(0);
    }
    apply(&args, &config, &o).await?;
    Ok(0)
}

/// `--apply`: applies the configurations (server-side apply) with the cluster's credentials.
async fn apply(args: &FenceWebhooksArgs, config: &FenceConfig, o: &Options<'_>) -> Result<(), Fail> {
    let client = crate::cluster::connect(
        &args.cluster,
        std::time::Duration::from_secs(10),
        crate::client::ONE_OFF_RENEW_DEADLINE,
    )
    .await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let cluster = |e: kube::Error, kind: &str| {
        let hint = match &e {
            kube::Error::Api(s) if s.code == 403 => format!(
                " (missing permission: patch {kind} {} — cluster-scoped, a ClusterRole)",
                args.name
            ),
            _ => String::new(),
        };
        Fail::new(
            exit::CLUSTER,
            anyhow!("cannot apply {kind} {}: {e}{hint}", args.name),
        )
    };
    if !args.without_mutating {
        let m = webhooks::mutating(config, o);
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .patch(
                &args.name,
                &params,
                &Patch::Apply(with_kind(&m, "MutatingWebhookConfiguration")),
            )
            .await
            .map_err(|e| cluster(e, "mutatingwebhookconfigurations"))?;
    }
    let v = webhooks::validating(config, o);
    Api::<ValidatingWebhookConfiguration>::all(client)
        .patch(
            &args.name,
            &params,
            &Patch::Apply(with_kind(&v, "ValidatingWebhookConfiguration")),
        )
        .await
        .map_err(|e| cluster(e, "validatingwebhookconfigurations"))?;
    let what = if args.without_mutating {
        "ValidatingWebhookConfiguration"
    } else {
        "MutatingWebhookConfiguration and ValidatingWebhookConfiguration"
    };
    println!("applied {what} {}", args.name);
    Ok(())
}

/// A server-side apply body needs its apiVersion and kind.
fn with_kind<T: serde::Serialize>(v: &T, kind: &str) -> serde_json::Value {
    let mut j = serde_json::to_value(v).unwrap_or_default();
    if let Some(o) = j.as_object_mut() {
        o.insert("apiVersion".into(), "admissionregistration.k8s.io/v1".into());
        o.insert("kind".into(), kind.into());
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_parse_with_and_without_a_port() {
        assert_eq!(
            parse_service("app/fence:8443").unwrap(),
            Endpoint::Service {
                namespace: "app".into(),
                name: "fence".into(),
                port: 8443
            }
        );
        assert!(matches!(
            parse_service("app/fence").unwrap(),
            Endpoint::Service { port: 443, .. }
        ));
        assert!(parse_service("fence").unwrap_err().contains("NAMESPACE/NAME"));
    }
}
