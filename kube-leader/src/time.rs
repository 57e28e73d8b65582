//! Deadlines: sleeping until an optional instant, and bounding a call by a deadline.

use std::time::Duration;

use tokio::time::Instant;

/// Sleeps until `at`, or forever if `None` (a `select!` branch that is off).
pub(crate) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `timeout`, shortened to what is left until `deadline` (at least 1 ms, so that a call is
/// still made and fails at once rather than not at all).
pub(crate) fn until_deadline(timeout: Duration, deadline: Instant) -> Duration {
    timeout
        .min(deadline.saturating_duration_since(Instant::now()))
        .max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_timeout_never_outlasts_the_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(until_deadline(s, now + 10 * s), s);
        assert_eq!(until_deadline(10 * s, now + s), s);
        assert_eq!(until_deadline(s, now), Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn no_deadline_never_wakes() {
        let r = tokio::time::timeout(Duration::from_secs(3600), sleep_until_opt(None)).await;
        assert!(r.is_err());
        let at = Instant::now() + Duration::from_secs(5);
        sleep_until_opt(Some(at)).await;
        assert!(Instant::now() >= at);
    }
}
