//! Helpers shared by the CLI's integration tests (`mod support;` in each).

use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout`.
pub(crate) fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A new directory under the temporary directory, named after the test binary (`prefix`),
/// this process and `name`.
pub(crate) fn scratch_dir(prefix: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kube-leader-{prefix}-{}-{name}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    fs::create_dir_all(&dir).unwrap();
    dir
}
