//! What a current kubelet proves about a leader Pod's end, and which API servers have such
//! kubelets.
//!
//! The kubelet's status manager holds a Pod's terminal phase (`Failed`, `Succeeded`) back while
//! any of its containers could still be running: `mergePodStatus` in
//! pkg/kubelet/status/status_manager.go keeps the old phase while `couldHaveRunningContainers`
//! (kubernetes#108366, kubelet 1.24). Since 1.27 a deleted Pod reaches a terminal phase too
//! (kubernetes#115331), and since 1.31 a Pod about to be disrupted carries a `DisruptionTarget`
//! condition. The 1.20 kubelet wrote `Failed`/`Evicted` first and killed the containers after.
//!
//! What is checked is the API server's release: by the version skew policy its kubelets are at
//! most two (before 1.28) or three (since) minor releases older, so every kubelet of a 1.27 or
//! later server is 1.24 or later. A phase is the kubelet's only if its field manager owns it
//! ([`PodView::phase_by_kubelet`](super::record::PodView::phase_by_kubelet)).

use std::time::Duration;

use kube::Client;
use tracing::{debug, info, warn};

/// The first API server release all of whose kubelets hold a terminal phase back until the
/// Pod's containers have stopped.
pub(crate) const FIRST_RELEASE: (u32, u32) = (1, 27);

/// Whether the API server's `/version` (`major`, `minor`; a provider's `"37+"` counts as 37)
/// is [`FIRST_RELEASE`] or later.
pub(crate) fn guards_terminal_phase(major: &str, minor: &str) -> Option<bool> {
    let number = |s: &str| -> Option<u32> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some((number(major)?, number(minor)?) >= FIRST_RELEASE)
}

/// Reads the API server's version once (`GET /version`, which every user may read) and says
/// whether a kubelet's terminal phase proves that a Pod's containers stopped. Logs the answer
/// once: an older server, or a version that cannot be read, keeps the other proofs only.
pub(crate) async fn terminal_phase_is_proof(client: &Client, timeout: Duration) -> bool {
    let info = match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the API server's version (GET /version); a leader \
                Pod's terminal phase is not taken as proof that its containers stopped");
            return false;
        }
        Err(_) => {
            warn!(
                ?timeout,
                "reading the API server's version (GET /version) timed out; a leader \
                Pod's terminal phase is not taken as proof that its containers stopped"
            );
            return false;
        }
    };
    match guards_terminal_phase(&info.major, &info.minor) {
        Some(true) => {
            debug!(version = %info.git_version, "a terminal phase written by the kubelet proves \
                that a leader Pod's containers stopped");
            true
        }
        Some(false) => {
            info!(version = %info.git_version, "API server older than 1.27: its kubelets may \
                write a Pod's terminal phase before its containers stop, so a waiting candidate \
                takes over only on a release, a completed deletion, a lapsed liveness heartbeat \
                or the Pod's grace");
            false
        }
        None => {
            warn!(major = %info.major, minor = %info.minor, "the API server's version cannot be \
                read as a number; a leader Pod's terminal phase is not taken as proof");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_from_1_27_guard_the_terminal_phase() {
        assert_eq!(guards_terminal_phase("1", "37"), Some(true));
        assert_eq!(guards_terminal_phase("1", "34"), Some(true));
        assert_eq!(guards_terminal_phase("1", "27"), Some(true));
        assert_eq!(guards_terminal_phase("1", "30+"), Some(true));
        assert_eq!(guards_terminal_phase("1", "26"), Some(false));
        assert_eq!(guards_terminal_phase("1", "20"), Some(false));
        assert_eq!(guards_terminal_phase("2", "0"), Some(true));
        assert_eq!(guards_terminal_phase("1", ""), None);
        assert_eq!(guards_terminal_phase("", "37"), None);
    }
}
