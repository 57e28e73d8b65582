//! `kube-leader fence`: an admission webhook by which Kubernetes itself refuses a deposed
//! leader's writes (docs/fence.md).
//!
//! The rules file ([`config`]) names the fenced objects, the lock that guards them and the
//! fenced writers; [`decide`] holds every decision as a pure function; [`server`] is the TLS
//! webhook server around it, [`tls`] its certificates, [`webhooks`] the webhook
//! configurations; [`command`] runs the subcommands; [`proxy`] is `run --fence`'s loopback
//! proxy for COMMAND.

mod command;
mod config;
mod decide;
mod proxy;
mod server;
mod tls;
mod webhooks;

pub(crate) use command::{fence, proxy_user};
pub(crate) use proxy::{start as start_proxy, Proxy, Tokens};
