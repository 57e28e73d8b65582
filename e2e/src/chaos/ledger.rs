//! The fenced ledger: a ConfigMap that only accepts a write carrying a fencing token at least as
//! great as the greatest it has accepted.
//!
//! A write is a compare-and-swap: read the ConfigMap, refuse if its token is greater than the
//! writer's, else replace it with the writer's token under the `resourceVersion` just read (the
//! API server's precondition), and start again after a 409. The precondition makes the check
//! and the write one atomic step: a write can only land on the very state it checked. So the
//! tokens the ledger accepts never decrease, and a deposed leader's write is refused as soon as
//! a newer leader has written once.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{api::PostParams, Api, Client};

/// The ledger ConfigMap's name in the run's namespace.
pub const LEDGER: &str = "ledger";

const TOKEN: &str = "token";
const HOLDER: &str = "holder";
const WRITES: &str = "writes";
/// Conflicts after which a write gives up (another writer keeps winning the race).
const MAX_CONFLICTS: usize = 16;

/// What became of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written; the ledger held `previous` before.
    Accepted {
        /// The token the ledger held before.
        previous: u64,
    },
    /// Refused by the fencing check: the ledger holds the greater token `stored`.
    Rejected {
        /// The ledger's token.
        stored: u64,
    },
    /// Not written: the ledger could not be read, so no write was sent.
    Unreached(String),
    /// Unknown: the write was sent but its answer is not known (it may have landed).
    Unknown(String),
}

impl Outcome {
    /// `accepted`, `rejected`, `unreached` or `unknown`.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Accepted { .. } => "accepted",
            Outcome::Rejected { .. } => "rejected",
            Outcome::Unreached(_) => "unreached",
            Outcome::Unknown(_) => "unknown",
        }
    }
}

/// A handle on the ledger of one namespace.
#[derive(Clone)]
pub struct Ledger {
    api: Api<ConfigMap>,
    timeout: Duration,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("timeout", &self.timeout).finish()
    }
}

// === impl Ledger ===

impl Ledger {
    /// The ledger in `namespace`; every API call is bounded by `timeout`.
    pub fn new(client: Client, namespace: &str, timeout: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            timeout,
        }
    }

    /// Creates the ledger with token 0 (nothing written yet); an existing one is kept.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: the ConfigMap is created or not.
    pub async fn create(&self) -> kube::Result<()> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(LEDGER.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (TOKEN.to_string(), "0".to_string()),
                (HOLDER.to_string(), String::new()),
                (WRITES.to_string(), "0".to_string()),
            ])),
            ..ConfigMap::default()
        };
        match self.api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The ledger's token, its last writer and how many writes it accepted.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe.
    pub async fn read(&self) -> kube::Result<(u64, String, u64)> {
        let cm = self.api.get(LEDGER).await?;
        Ok((
            field(&cm, TOKEN),
            cm.data
                .as_ref()
                .and_then(|d| d.get(HOLDER).cloned())
                .unwrap_or_default(),
            field(&cm, WRITES),
        ))
    }

    /// Writes `token` for `writer` with the fencing check; see the [module documentation](self).
    ///
    /// # Cancellation safety
    ///
    /// Not cancel-safe: a replace in flight may land although the future was dropped. Let it
    /// finish to learn the outcome.
    pub async fn write(&self, writer: &str, token: u64) -> Outcome {
        for _ in 0..MAX_CONFLICTS {
            let cm = match tokio::time::timeout(self.timeout, self.api.get(LEDGER)).await {
                Ok(Ok(cm)) => cm,
                Ok(Err(e)) => return Outcome::Unreached(format!("read: {e}")),
                Err(_) => return Outcome::Unreached(format!("read: no answer within {:?}", self.timeout)),
            };
            let stored = field(&cm, TOKEN);
            if stored > token {
                return Outcome::Rejected { stored };
            }
            let writes = field(&cm, WRITES) + 1;
            let mut next = cm;
            let data = next.data.get_or_insert_with(BTreeMap::new);
            data.insert(TOKEN.into(), token.to_string());
            data.insert(HOLDER.into(), writer.into());
            data.insert(WRITES.into(), writes.to_string());
            // `next` carries the resourceVersion read: the API server refuses the replace with
            // 409 if anybody wrote in between.
            let params = PostParams::default();
            let replace = self.api.replace(LEDGER, &params, &next);
            match tokio::time::timeout(self.timeout, replace).await {
                Ok(Ok(_)) => return Outcome::Accepted { previous: stored },
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
                // A refusal with a status (403, 422, ...) did not write; anything else may have.
                Ok(Err(kube::Error::Api(s))) if s.code < 500 => {
                    return Outcome::Unreached(format!("write refused: {}", s.message))
                }
                Ok(Err(e)) => return Outcome::Unknown(format!("write: {e}")),
                Err(_) => {
                    return Outcome::Unknown(format!(
                        "write: no answer within {:?} (it may still land)",
                        self.timeout
                    ))
                }
            }
        }
        Outcome::Unreached(format!("{MAX_CONFLICTS} conflicts in a row"))
    }
}

fn field(cm: &ConfigMap, key: &str) -> u64 {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
