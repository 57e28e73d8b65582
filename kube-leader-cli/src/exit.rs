//! Exit codes: each one means something, and `--help` and docs/sidecar.md list them.
//!
//! kube-leader's own codes are 122–125, next to the codes of the wrappers users know:
//! timeout(1) exits 124 when it stopped COMMAND and 125 when it failed itself, as env(1),
//! chroot(1), nohup(1) and `docker run` do; the shell's 126 and 127 follow, then 128+N for a
//! signal. Programs avoid that range for the same reason, so a supervisor of kube-leader can tell
//! who failed; COMMAND's own code is passed through unchanged.

use std::fmt;

/// kube-leader itself could not work: its runtime, signal handlers or supervisor could not be
/// started.
pub(crate) const INTERNAL: u8 = 122;
/// The cluster could not be used: no configuration, unreachable, unauthenticated, or a missing
/// permission (the log names it).
pub(crate) const CLUSTER: u8 = 123;
/// Leadership was lost while COMMAND ran, and COMMAND was stopped; or the supervisor died and
/// COMMAND was killed with it (timeout(1)'s 124: the wrapper stopped COMMAND).
pub(crate) const LOST: u8 = 124;
/// A usage or configuration error: bad flag, invalid lock name, bad duration, missing COMMAND,
/// no namespace or Pod name to be found (timeout(1)'s and env(1)'s 125: the wrapper failed
/// before COMMAND ran).
pub(crate) const USAGE: u8 = 125;
/// COMMAND was found but could not be executed (shell convention).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// COMMAND was not found (shell convention).
pub(crate) const NOT_FOUND: u8 = 127;

/// The exit codes, for `--help`.
pub(crate) const CODES_HELP: &str = "\
Exit codes: kube-leader's own are 122-125 (as timeout(1)'s 124 and 125); COMMAND's pass through
  0        COMMAND exited with 0, or kube-leader was stopped (SIGTERM/SIGINT) before it led
  1-255    COMMAND's own exit code, unchanged, once it exited by itself or after a forwarded
           signal (128+N if it died of signal N); the lease is released first
  122      kube-leader itself could not start (its runtime, signal handlers or supervisor)
  123      the cluster could not be used: no configuration, unreachable, or a missing permission
  124      leadership was lost: COMMAND got SIGTERM, then SIGKILL after --grace; or the
           supervisor died and COMMAND with it (the lock is not released)
  125      usage or configuration error (bad flag, invalid lock name, bad duration, missing
           COMMAND, --shards M unlike the set's other candidates)
  126/127  COMMAND could not be executed / was not found";

/// A failure that ends the process with `code`.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: u8,
    pub(crate) error: anyhow::Error,
}

impl Fail {
    pub(crate) fn new(code: u8, error: impl Into<anyhow::Error>) -> Self {
        Self {
            code,
            error: error.into(),
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

/// The exit code for an error of the library.
pub(crate) fn for_error(e: &kube_leader::Error) -> u8 {
    use kube_leader::Error as E;
    match e {
        E::InvalidConfig { .. } | E::InvalidLockName { .. } | E::NoNamespace { .. } | E::NoPodName => USAGE,
        E::OwnPodNotFound { .. } => USAGE,
        // `--shards M` disagrees with the set's other candidates: a configuration error.
        E::ShardCountMismatch { .. } => USAGE,
        _ => CLUSTER,
    }
}

/// The exit code that stands for a child's exit status, as a shell reports it.
pub(crate) fn for_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    match status.signal() {
        Some(sig) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(255),
        None => 1,
    }
}

/// Attaches an exit code to errors.
pub(crate) trait OrExit<T> {
    /// Fails with `code` on error.
    fn or_exit(self, code: u8) -> Result<T, Fail>;
}

impl<T, E: Into<anyhow::Error>> OrExit<T> for Result<T, E> {
    fn or_exit(self, code: u8) -> Result<T, Fail> {
        self.map_err(|e| Fail::new(code, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn statuses_map_like_a_shell() {
        assert_eq!(for_status(std::process::ExitStatus::from_raw(0)), 0);
        assert_eq!(for_status(std::process::ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(for_status(std::process::ExitStatus::from_raw(15)), 143);
        assert_eq!(for_status(std::process::ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn library_errors() {
        assert_eq!(for_error(&kube_leader::Error::NoPodName), USAGE);
        assert_eq!(
            for_error(&kube_leader::Error::InvalidConfig {
                field: "x",
                reason: "y".into()
            }),
            USAGE
        );
        let forbidden = kube_leader::Error::Forbidden {
            verb: "get".into(),
            resource: "leases".into(),
            namespace: "ns".into(),
            message: "no".into(),
            hint: "the one `kube-leader rbac --strategy lease` prints",
        };
        assert_eq!(for_error(&forbidden), CLUSTER);
        let mismatch = kube_leader::Error::ShardCountMismatch {
            set: "s".into(),
            namespace: "ns".into(),
            identity: "b".into(),
            ours: 5,
            other: "a".into(),
            theirs: 4,
        };
        assert_eq!(for_error(&mismatch), USAGE);
    }

    #[test]
    fn own_codes_are_122_to_125_and_the_help_lists_each() {
        let own = [INTERNAL, CLUSTER, LOST, USAGE];
        assert_eq!(own, [122, 123, 124, 125]);
        for code in own {
            assert!(
                CODES_HELP.contains(&format!("\n  {code} ")),
                "{code}: {CODES_HELP}"
            );
        }
        assert!(CODES_HELP.contains(&format!("\n  {CANNOT_EXECUTE}/{NOT_FOUND} ")));
        // Below the shell's 126/127 and the signals' 128+N.
        assert!(own.iter().all(|c| *c < CANNOT_EXECUTE));
    }
}
