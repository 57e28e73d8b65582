//! Signals: which stop kube-leader, and the stream of those it forwards to COMMAND.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::supervisor;

/// SIGTERM, SIGINT and SIGQUIT stop kube-leader (after COMMAND, if it runs).
pub(crate) fn is_stop(kind: SignalKind) -> bool {
    [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::quit(),
    ]
    .contains(&kind)
}

/// The signals kube-leader forwards to COMMAND.
pub(crate) struct Signals {
    streams: Vec<(SignalKind, Signal)>,
}

impl Signals {
    pub(crate) fn new() -> std::io::Result<Self> {
        let streams = supervisor::FORWARDED
            .iter()
            .map(|k| Ok((*k, signal(*k)?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self { streams })
    }

    /// The next signal received.
    ///
    /// # Cancellation safety
    /// Cancel-safe: tokio's `Signal::recv` is.
    pub(crate) async fn recv(&mut self) -> SignalKind {
        let recvs = self.streams.iter_mut().map(|(kind, s)| {
            let kind = *kind;
            Box::pin(async move {
                s.recv().await;
                kind
            })
        });
        futures::future::select_all(recvs).await.0
    }
}
