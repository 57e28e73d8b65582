//! The flags of `kube-leader fence`: the admission webhook that refuses a deposed leader's
//! writes (docs/fence.md).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Subcommand};

use super::{parse_addr, parse_duration, ClusterArgs};

/// `kube-leader fence`.
#[derive(Debug, Clone, Args)]
pub(crate) struct FenceArgs {
    #[command(subcommand)]
    pub(crate) command: FenceCommand,
}

/// The subcommands of `kube-leader fence`.
#[derive(Debug, Clone, Subcommand)]
pub(crate) enum FenceCommand {
    /// Serve the webhook: POST /mutate/<rule> stamps a fenced writer's token on the objects it
    /// writes, POST /validate/<rule> refuses writes whose token is older than the object's or
    /// the lock's; GET /healthz.
    Serve(FenceServeArgs),
    /// Generate a CA (ca.crt, ca.key) and a serving certificate (tls.crt, tls.key) for the
    /// names and addresses the API server reaches the webhook by.
    Certs(FenceCertsArgs),
    /// Print (or apply) the MutatingWebhookConfiguration and ValidatingWebhookConfiguration of
    /// the rules (failurePolicy Fail, sideEffects None, the CA as caBundle).
    Webhooks(FenceWebhooksArgs),
    /// Check a rules file and print what it fences.
    Check(FenceRulesArg),
}

/// The rules file.
#[derive(Debug, Clone, Args)]
pub(crate) struct FenceRulesArg {
    /// The fence rules (YAML or JSON; docs/fence.md): fenced resources, selectors, the lock
    /// or shard set that guards them, the fenced writers. Rules that could cover Leases, lock
    /// ConfigMaps or kube-system are refused.
    #[arg(long, value_name = "FILE")]
    pub(crate) rules: PathBuf,
}

/// `kube-leader fence serve`.
#[derive(Debug, Clone, Args)]
pub(crate) struct FenceServeArgs {
    #[command(flatten)]
    pub(crate) rules: FenceRulesArg,

    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// Where to listen: IP:PORT, or :PORT for every interface (in a Pod behind a Service).
    #[arg(long, value_name = "ADDR", value_parser = parse_addr, default_value = ":9443")]
    pub(crate) listen: SocketAddr,

    /// The directory holding tls.crt and tls.key (a mounted kubernetes.io/tls Secret, or the
    /// output of `kube-leader fence certs`).
    #[arg(long, value_name = "DIR")]
    pub(crate) tls_dir: PathBuf,

    /// Log what would be refused and allow it (audit only: for a first rollout, and to count
    /// what the fence prevents).
    #[arg(long)]
    pub(crate) audit_only: bool,

    /// How long to retry reaching the API server at start before giving up (exit code 123).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub(crate) connect_timeout: Duration,
}

/// `kube-leader fence certs`.
#[derive(Debug, Clone, Args)]
pub(crate) struct FenceCertsArgs {
    /// The directory to write ca.crt, ca.key, tls.crt and tls.key into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,

    /// A DNS name or IP address the API server reaches the webhook by (repeatable): for a
    /// Service NAME in NAMESPACE, NAME.NAMESPACE.svc; for a URL, its host.
    #[arg(long = "san", value_name = "NAME", required = true)]
    pub(crate) sans: Vec<String>,
}

/// `kube-leader fence webhooks`.
#[derive(Debug, Clone, Args)]
pub(crate) struct FenceWebhooksArgs {
    #[command(flatten)]
    pub(crate) rules: FenceRulesArg,

    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// The CA certificate (PEM) that signed the webhook's serving certificate: the caBundle.
    #[arg(long, value_name = "FILE")]
    pub(crate) ca_bundle: PathBuf,

    /// Reach the webhook by URL, https://HOST:PORT (the paths are added).
    #[arg(
        long,
        value_name = "URL",
        conflicts_with = "service",
        required_unless_present = "service"
    )]
    pub(crate) url: Option<String>,

    /// Reach the webhook by Service: NAMESPACE/NAME[:PORT] (port 443 by default).
    #[arg(long, value_name = "NAMESPACE/NAME[:PORT]")]
    pub(crate) service: Option<String>,

    /// The name of both configurations.
    #[arg(long, value_name = "NAME", default_value = "kube-leader-fence")]
    pub(crate) name: String,

    /// The API server's timeout for one call of the webhook (1s to 30s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub(crate) timeout: Duration,

    /// Leave out the MutatingWebhookConfiguration: the writers stamp their writes themselves
    /// (`Leadership::fenced_client` does). For API servers that cannot apply a webhook's JSON
    /// patch (Kubernetes 1.20 built with Go 1.18 or later crashes on one: its vendored
    /// reflect2 1.0.1); the validating half still refuses an unstamped write.
    #[arg(long)]
    pub(crate) without_mutating: bool,

    /// Apply them (server-side apply) instead of printing them.
    #[arg(long)]
    pub(crate) apply: bool,
}
