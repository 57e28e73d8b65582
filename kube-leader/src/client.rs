//! An API client for candidates over HTTP/2 (feature `http2`).
//!
//! kube's own client speaks HTTP/1.1, where every open watch holds a connection of its own: a
//! follower keeps a second one for the write that takes over (it reads its lock once when it
//! starts to follow), which hyper drops after 90 s idle; a takeover over a new connection waits
//! for the API server's delayed ACK, as kube's connector leaves `TCP_NODELAY` off (about 40 ms;
//! see docs/benchmarks.md). Over HTTP/2 the watches and the writes share one connection, as
//! client-go's do.
//!
//! [`http2`] builds a [`kube::Client`] with kube's own layers, in kube's order: the base URI,
//! kube's retry of 429, 503 and 504 (`Config::default_retry`), the credentials (tokens that
//! refresh, exec plugins and their certificate's expiry, `Client::valid_until`), the extra
//! headers (impersonation), kube's `HTTP` tracing span, and the configuration's connect and
//! write timeouts; over a connection pool that speaks HTTP/2 where the server offers it
//! (ALPN), with `TCP_NODELAY`. A silent API server is noticed within bounds derived from the
//! renew deadline:
//!
//! - the TCP connect and the TLS handshake together take at most half the renew deadline;
//! - every request, a watch too, gets its response headers within the renew deadline (this
//!   bound replaces the read timeout, which would close every quiet watch on a shared
//!   connection; a shorter `Config::read_timeout` shortens it);
//! - a connection that has read nothing for a third of the renew deadline is PINGed, and closed if
//!   the answer takes longer than that again, so a dead connection (and every watch on it)
//!   fails at most twice that after its last frame: well inside a term.
//!
//! With a proxy in the configuration, the client is kube's own (HTTP/1.1)
//! with the same connect and response-headers bounds. What this client does not add:
//! kube's `gzip` decompression (a feature of kube's the library cannot see).
//!
//! The feature brings rustls with ring (kube's `rustls-tls` and `ring`, hyper-rustls with ring):
//! a binary that picks another TLS provider should use kube's client.
//!
//! ```no_run
//! use std::time::Duration;
//! use kube_leader::{LeaseConfig, LeaseElector};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let renew_deadline = Duration::from_secs(10);
//! let config = kube::Config::infer().await?;
//! let client = kube_leader::client::http2(config, renew_deadline)?;
//! let elector = LeaseElector::new(client, "my-operator")
//!     .config(LeaseConfig::default().renew_deadline(renew_deadline));
//! # let _ = elector;
//! # Ok(())
//! # }
//! ```

pub(crate) mod builder;
pub(crate) mod liveness;
mod timeout;
mod trace;

pub use builder::http2;
