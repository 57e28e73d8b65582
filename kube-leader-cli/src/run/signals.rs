//! Signals: which stop kube-leader, and the stream of those it forwards to COMMAND.

use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::debug;

use super::own_pod::Ending;

/// SIGTERM, SIGINT and SIGQUIT stop kube-leader (after COMMAND, if it runs).
pub(crate) const STOPS: [SignalKind; 3] = [
    SignalKind::terminate(),
    SignalKind::interrupt(),
    SignalKind::quit(),
];

/// Whether `kind` stops kube-leader ([`STOPS`]).
pub(crate) fn is_stop(kind: SignalKind) -> bool {
    STOPS.contains(&kind)
}

/// The signals kube-leader catches and forwards to COMMAND.
pub(crate) struct Signals {
    streams: Vec<(SignalKind, Signal)>,
    /// `--watch-own-pod`: the Pod's end, which stands for the SIGTERM the kubelet sends after
    /// it (`None` once it has).
    pod_ending: Option<Ending>,
    /// The Pod's end stood for a SIGTERM: the kubelet's own is not forwarded a second time.
    term_given: bool,
}

impl Signals {
    /// Catches `kinds`: each is received, not acted on by the process.
    pub(crate) fn new(kinds: &[SignalKind]) -> std::io::Result<Self> {
        let streams = kinds
            .iter()
            .map(|k| Ok((*k, signal(*k)?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self {
            streams,
            pod_ending: None,
            term_given: false,
        })
    }

    /// From now on, this candidate's Pod ending is received as a SIGTERM (and the kubelet's
    /// SIGTERM after it is not received again).
    pub(crate) fn stop_when_pod_ends(&mut self, ending: Ending) {
        self.pod_ending = Some(ending);
    }

    /// The next signal received.
    ///
    /// # Cancellation safety
    /// Cancel-safe: tokio's `Signal::recv` is.
    pub(crate) async fn recv(&mut self) -> SignalKind {
        loop {
            let recvs = self.streams.iter_mut().map(|(kind, s)| {
                let kind = *kind;
                Box::pin(async move {
                    s.recv().await;
                    kind
                })
            });
            let signal = futures::future::select_all(recvs);
            let kind = match self.pod_ending.as_mut() {
                Some(ending) => tokio::select! {
                    kind = signal => Some(kind.0),
                    // Cancel-safe: the value stays until seen; a closed channel (the watch
                    // task ended) never fires.
                    Ok(_) = ending.wait_for(Option::is_some) => None,
                },
                None => Some(signal.await.0),
            };
            let Some(kind) = kind else {
                self.pod_ending = None;
                self.term_given = true;
                return SignalKind::terminate();
            };
            if kind == SignalKind::terminate() && std::mem::take(&mut self.term_given) {
                debug!("SIGTERM (the kubelet's): already stopping since the Pod's deletion");
                continue;
            }
            if kind == SignalKind::terminate() {
                // Stopping already: the Pod's end need not stand for this SIGTERM again.
                self.pod_ending = None;
            }
            return kind;
        }
    }
}
