//! How long a client waits for a silent API server, derived from the renew deadline.

use std::time::Duration;

/// The shortest bound of each kind, whatever the renew deadline: below it a loaded machine
/// would take a slow answer for a dead server.
const FLOOR: Duration = Duration::from_millis(500);

/// The renew deadline of [`Liveness::default`]: client-go's and the library's default
/// (`LeaseConfig::renew_deadline`, 10 s).
const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// How long the client waits for a silent API server before it gives up on a connection or a
/// request, derived from the renew deadline ([`Liveness::for_renew_deadline`]).
///
/// A leader that cannot reach the API server stops leading when its renew deadline passes; a
/// follower that waits longer than that on a dead connection notices a release or an expiry
/// late. Each bound is therefore a part of the renew deadline. The fields can be changed after
/// construction:
///
/// ```
/// use std::time::Duration;
/// use kube_leader::internal::client::Liveness;
///
/// let mut liveness = Liveness::for_renew_deadline(Duration::from_secs(10));
/// assert_eq!(liveness.connect, Duration::from_secs(5));
/// liveness.connect = Duration::from_secs(2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Liveness {
    /// The TCP connect and the TLS handshake, together: half the renew deadline.
    pub connect: Duration,
    /// From sending a request to its response headers (for a watch: its start; the events then
    /// stream on unbounded): the renew deadline, at least the library's API timeout (half of
    /// it for a Lease).
    pub headers: Duration,
    /// HTTP/2: PING a connection after this long without a frame read, and close it if the
    /// answer takes longer than this again: a third of the renew deadline each. A dead
    /// connection, and every watch on it, then fails at most twice this after its last frame,
    /// well inside a term.
    pub keep_alive: Duration,
}

// === impl Liveness ===

impl Liveness {
    /// The bounds for a candidate whose leadership ends `renew_deadline` after its last
    /// confirmation, each at least 500 ms.
    #[must_use]
    pub fn for_renew_deadline(renew_deadline: Duration) -> Self {
        Self {
            connect: (renew_deadline / 2).max(FLOOR),
            headers: renew_deadline.max(FLOOR),
            keep_alive: (renew_deadline / 3).max(FLOOR),
        }
    }
}

impl Default for Liveness {
    /// The bounds for the default renew deadline, 10 s (client-go's): connect 5 s, response
    /// headers 10 s, PINGs after 3.33 s.
    fn default() -> Self {
        Self::for_renew_deadline(DEFAULT_RENEW_DEADLINE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn bounds_are_parts_of_the_renew_deadline() {
        let l = Liveness::for_renew_deadline(Duration::from_secs(10));
        assert_eq!(l.connect, Duration::from_secs(5));
        assert_eq!(l.headers, Duration::from_secs(10));
        assert_eq!(l.keep_alive, MS(3333) + Duration::from_nanos(333_333));
        // A dead connection is noticed within two keep-alive periods: inside the deadline.
        assert!(l.keep_alive * 2 < Duration::from_secs(10));
        assert_eq!(Liveness::default(), l);
    }

    #[test]
    fn short_deadlines_keep_the_floor() {
        let l = Liveness::for_renew_deadline(MS(600));
        assert_eq!((l.connect, l.headers, l.keep_alive), (MS(500), MS(600), MS(500)));
        let l = Liveness::for_renew_deadline(Duration::ZERO);
        assert_eq!((l.connect, l.headers, l.keep_alive), (MS(500), MS(500), MS(500)));
    }

    #[test]
    fn bounds_grow_with_the_deadline() {
        let mut last = Liveness::for_renew_deadline(Duration::ZERO);
        for secs in 1..=120 {
            let l = Liveness::for_renew_deadline(Duration::from_secs(secs));
            assert!(l.connect >= last.connect && l.headers >= last.headers);
            assert!(l.keep_alive >= last.keep_alive);
            assert!(l.connect <= l.headers && l.keep_alive <= l.headers);
            last = l;
        }
    }
}
