//! The error type of the test environment.

use std::{io, path::PathBuf, process::ExitStatus, time::Duration};

/// Why the test environment could not do what was asked.
///
/// Messages describe the failure in words, or expose a `#[source]`, never both: print the
/// whole chain (for example with `{:#}` in `anyhow`, or by walking [`std::error::Error::source`])
/// to see everything.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The etcd, kube-apiserver, kube-controller-manager or kubectl binaries were not found.
    #[error(
        "control-plane binaries not found: run ./scripts/testenv-assets.sh (or set KUBEBUILDER_ASSETS); {searched}"
    )]
    AssetsNotFound {
        /// What was searched and what was missing, in words.
        searched: String,
    },

    /// A file or directory could not be read, written or removed.
    #[error("could not {action} {}", path.display())]
    Io {
        /// What was being done ("write", "create directory", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A control-plane process could not be started.
    #[error("could not start {component} from {}", binary.display())]
    Spawn {
        /// The component ("etcd", "kube-apiserver", ...).
        component: &'static str,
        /// The binary that was executed.
        binary: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A control-plane process exited while it was expected to run.
    #[error(
        "{component} exited with {status}; last lines of {}:\n{tail}",
        log.display()
    )]
    Exited {
        /// The component ("etcd", "kube-apiserver", ...).
        component: &'static str,
        /// How it exited.
        status: ExitStatus,
        /// Its log file (stdout and stderr).
        log: PathBuf,
        /// The last lines of the log file.
        tail: String,
    },

    /// A control-plane process did not become ready in time.
    #[error(
        "{component} was not ready after {waited:?} ({last_problem}); last lines of {}:\n{tail}",
        log.display()
    )]
    NotReady {
        /// The component ("etcd", "kube-apiserver", ...).
        component: &'static str,
        /// How long readiness was awaited.
        waited: Duration,
        /// The last reason the readiness check gave, in words.
        last_problem: String,
        /// Its log file (stdout and stderr).
        log: PathBuf,
        /// The last lines of the log file.
        tail: String,
    },

    /// A helper program (`openssl`) failed.
    #[error("{command} failed with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },

    /// A kubeconfig written by the test environment could not be loaded.
    #[error("could not load kubeconfig {}", path.display())]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Box<kube::config::KubeconfigError>,
    },

    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed: {action}")]
    Kube {
        /// What was being done, in words.
        action: String,
        /// The underlying error.
        #[source]
        source: Box<kube::Error>,
    },

    /// A user name that the control plane does not know.
    #[error("unknown user {0:?}: the control plane knows \"admin\" and \"user-1\" to \"user-40\"")]
    UnknownUser(String),

    /// This machine cannot run a real kubelet node ([`crate::Node::unavailable`] says why).
    #[error("this machine cannot run a kubelet node: {reason}")]
    NodeUnavailable {
        /// Why, in words.
        reason: String,
    },

    /// These binaries' Kubernetes release lacks a feature that was asked for (see
    /// [`crate::ControlPlaneOptions`]).
    #[error("Kubernetes {version} does not support {what}")]
    Unsupported {
        /// The release of the binaries.
        version: crate::KubeVersion,
        /// What it lacks, in words.
        what: String,
    },

    /// The control plane was stopped.
    #[error("the control plane was stopped")]
    Stopped,
}

/// The result type of the test environment.
pub type Result<T, E = Error> = std::result::Result<T, E>;

// === impl Error ===

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }
}

/// Formats an error with all of its sources, one per line, for panic messages.
pub(crate) fn report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str("\n  caused by: ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}
