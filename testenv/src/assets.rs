//! Finding the control-plane binaries (the envtest `KUBEBUILDER_ASSETS` convention).

use std::{
    collections::HashMap,
    ffi::OsString,
    fmt,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
};

use crate::{Error, Result};

/// The Kubernetes version whose binaries `./scripts/testenv-assets.sh` builds and caches by
/// default, the release the test command runs (`KUBE_LEADER_KUBERNETES` picks another; see
/// [`KubeVersion`]).
pub const KUBERNETES_VERSION: &str = "1.37.2";

/// The legacy release that `./scripts/debian-assets.sh` builds from Debian's source package,
/// whose unpacked tree also holds the pause image's source.
pub const DEBIAN_KUBERNETES_VERSION: &str = "1.20.2";

/// The binaries a complete assets directory holds.
pub const BINARIES: [&str; 4] = ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"];

/// A directory holding every binary in [`BINARIES`], executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assets {
    dir: PathBuf,
}

// === impl Assets ===

impl Assets {
    /// Finds the binaries from the process environment; see [`Assets::locate`].
    pub fn from_env() -> Result<Self> {
        Self::locate(
            std::env::var_os("KUBEBUILDER_ASSETS"),
            std::env::var_os("XDG_CACHE_HOME"),
            std::env::var_os("HOME"),
        )
    }

    /// Finds the binaries, with the same rules as `./scripts/testenv-assets.sh`:
    ///
    /// 1. `kubebuilder_assets` (the value of `KUBEBUILDER_ASSETS`), if it is set: it must hold
    ///    all of them, or the result is [`Error::AssetsNotFound`]. A set but incomplete
    ///    directory never falls back to the cache, so that no test runs against another release
    ///    than the one named;
    /// 2. else `${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/assets/1.37.2` ([`KUBERNETES_VERSION`]),
    ///    if it holds all of them;
    /// 3. else [`Error::AssetsNotFound`], whose message says to run the script.
    ///
    /// Empty values count as unset, as in the shell's `${VAR:-default}`. The values are
    /// parameters so that the rules can be tested without touching the process environment.
    pub fn locate(
        kubebuilder_assets: Option<OsString>,
        xdg_cache_home: Option<OsString>,
        home: Option<OsString>,
    ) -> Result<Self> {
        let mut searched = Vec::new();

        if let Some(dir) = non_empty(kubebuilder_assets) {
            let dir = PathBuf::from(dir);
            return match missing(&dir) {
                None => Ok(Self { dir }),
                Some(problem) => Err(Error::AssetsNotFound {
                    searched: format!(
                        "KUBEBUILDER_ASSETS={} {problem} (no other directory is tried: unset it \
                         to use the cached {KUBERNETES_VERSION})",
                        dir.display()
                    ),
                }),
            };
        }

        let cache_home = non_empty(xdg_cache_home)
            .map(PathBuf::from)
            .or_else(|| non_empty(home).map(|home| Path::new(&home).join(".cache")));
        match cache_home {
            Some(cache_home) => {
                let dir = cache_home
                    .join("kube-leader")
                    .join("assets")
                    .join(KUBERNETES_VERSION);
                match missing(&dir) {
                    None => return Ok(Self { dir }),
                    Some(problem) => searched.push(format!("cache {} {problem}", dir.display())),
                }
            }
            None => searched.push("no cache directory (neither XDG_CACHE_HOME nor HOME is set)".into()),
        }

        Err(Error::AssetsNotFound {
            searched: searched.join("; "),
        })
    }

    /// The directory holding the binaries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of one binary, for example `assets.binary("kubectl")`.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The Kubernetes release of these binaries, from `kube-apiserver --version` (run once per
    /// directory and process). The components' flags depend on it.
    ///
    /// A binary that reports no release (`v0.0.0-master+$Format:%H$`) is taken for 1.20.2:
    /// Debian's source tarball, which `./scripts/testenv-assets.sh` builds, has no git metadata
    /// to stamp a version from, while `./scripts/k8s-assets.sh` stamps its builds.
    pub fn version(&self) -> Result<KubeVersion> {
        static VERSIONS: OnceLock<Mutex<HashMap<PathBuf, KubeVersion>>> = OnceLock::new();
        let versions = VERSIONS.get_or_init(Mutex::default);
        if let Some(version) = versions.lock().unwrap_or_else(|p| p.into_inner()).get(&self.dir) {
            return Ok(*version);
        }
        let binary = self.binary("kube-apiserver");
        let output = Command::new(&binary)
            .arg("--version")
            .output()
            .map_err(|e| Error::io("run", &binary, e))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let version = match KubeVersion::parse(&text) {
            Some(v) if v.major == 0 => KubeVersion::V1_20_2,
            Some(v) if output.status.success() => v,
            _ => {
                return Err(Error::Command {
                    command: format!("{} --version", binary.display()),
                    status: output.status,
                    stderr: format!(
                        "no Kubernetes version in its output: {:?} {:?}",
                        text.trim(),
                        String::from_utf8_lossy(&output.stderr).trim()
                    ),
                })
            }
        };
        versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.dir.clone(), version);
        Ok(version)
    }
}

/// A Kubernetes release, for the flags and settings that differ between releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    /// 1.
    pub major: u32,
    /// 20 in 1.20.2.
    pub minor: u32,
    /// 2 in 1.20.2.
    pub patch: u32,
}

// === impl KubeVersion ===

impl KubeVersion {
    /// The release that `./scripts/testenv-assets.sh` builds.
    pub const V1_20_2: KubeVersion = KubeVersion {
        major: 1,
        minor: 20,
        patch: 2,
    };

    /// The first `vMAJOR.MINOR.PATCH` (or `MAJOR.MINOR.PATCH`) in `text`, for example in
    /// `Kubernetes v1.37.2`; pre-release and build suffixes are ignored.
    pub fn parse(text: &str) -> Option<Self> {
        text.split_whitespace().find_map(|word| {
            let word = word.strip_prefix('v').unwrap_or(word);
            let mut parts = word.splitn(3, '.');
            let major = parts.next()?.parse().ok()?;
            let minor = parts.next()?.parse().ok()?;
            let rest = parts.next()?;
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            let patch = rest[..digits].parse().ok()?;
            Some(Self { major, minor, patch })
        })
    }

    /// Whether this release is `major.minor` or later.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

fn non_empty(value: Option<OsString>) -> Option<OsString> {
    value.filter(|v| !v.is_empty())
}

/// Describes what `dir` lacks, or `None` if it holds every binary, executable.
fn missing(dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some("does not exist".into());
    }
    let lacking: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|name| {
            // `metadata` follows symlinks: the cached etcd and kubectl are links to system binaries.
            !std::fs::metadata(dir.join(name))
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .collect();
    if lacking.is_empty() {
        None
    } else {
        Some(format!("lacks {}", lacking.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_assets(dir: &Path) {
        for name in BINARIES {
            let path = dir.join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn incomplete_kubebuilder_assets_is_an_error_not_a_fallback() {
        let assets = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let cached = cache.path().join("kube-leader/assets").join(KUBERNETES_VERSION);
        std::fs::create_dir_all(&cached).unwrap();
        fake_assets(&cached);

        let err = Assets::locate(Some(assets.path().into()), Some(cache.path().into()), None).unwrap_err();

        assert!(matches!(err, Error::AssetsNotFound { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("KUBEBUILDER_ASSETS={}", assets.path().display())),
            "{message}"
        );
        assert!(
            message.contains("lacks etcd, kube-apiserver, kube-controller-manager, kubectl"),
            "{message}"
        );
        assert!(message.contains("no other directory is tried"), "{message}");
    }

    #[test]
    fn no_kubebuilder_assets_and_no_cache_says_how_to_get_the_binaries() {
        let cache = tempfile::tempdir().unwrap();

        let err = Assets::locate(None, Some(cache.path().into()), None).unwrap_err();

        assert!(matches!(err, Error::AssetsNotFound { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with(
                "control-plane binaries not found: run ./scripts/testenv-assets.sh (or set KUBEBUILDER_ASSETS)"
            ),
            "{message}"
        );
        assert!(message.contains("does not exist"), "{message}");
        assert!(message.contains(&cache.path().display().to_string()), "{message}");
    }

    #[test]
    fn complete_kubebuilder_assets_wins() {
        let assets = tempfile::tempdir().unwrap();
        fake_assets(assets.path());

        let found = Assets::locate(Some(assets.path().into()), None, None).unwrap();

        assert_eq!(found.dir(), assets.path());
    }

    #[test]
    fn falls_back_to_the_cache_under_xdg_cache_home() {
        let cache = tempfile::tempdir().unwrap();
        let dir = cache.path().join("kube-leader/assets").join(KUBERNETES_VERSION);
        std::fs::create_dir_all(&dir).unwrap();
        fake_assets(&dir);

        let found = Assets::locate(
            Some("".into()),
            Some(cache.path().into()),
            Some("/nonexistent".into()),
        )
        .unwrap();

        assert_eq!(found.dir(), dir);
    }

    #[test]
    fn falls_back_to_the_cache_under_home() {
        let home = tempfile::tempdir().unwrap();
        let dir = home
            .path()
            .join(".cache/kube-leader/assets")
            .join(KUBERNETES_VERSION);
        std::fs::create_dir_all(&dir).unwrap();
        fake_assets(&dir);

        let found = Assets::locate(None, Some("".into()), Some(home.path().into())).unwrap();

        assert_eq!(found.dir(), dir);
    }

    #[test]
    fn versions_parse_from_the_version_output() {
        let v = |major, minor, patch| KubeVersion { major, minor, patch };
        assert_eq!(KubeVersion::parse("Kubernetes v1.37.2\n"), Some(v(1, 37, 2)));
        assert_eq!(KubeVersion::parse("Kubernetes v1.20.2-dirty"), Some(v(1, 20, 2)));
        assert_eq!(
            KubeVersion::parse("Kubernetes v0.0.0-master+$Format:%H$"),
            Some(v(0, 0, 0))
        );
        assert_eq!(
            KubeVersion::parse("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1"),
            Some(v(1, 6, 20))
        );
        assert_eq!(KubeVersion::parse("Kubernetes"), None);
        assert!(v(1, 37, 2).at_least(1, 24) && v(1, 24, 0).at_least(1, 24));
        assert!(!KubeVersion::V1_20_2.at_least(1, 24));
        assert_eq!(v(1, 37, 2).to_string(), "1.37.2");
    }

    #[test]
    fn a_binary_that_is_not_executable_does_not_count() {
        let assets = tempfile::tempdir().unwrap();
        fake_assets(assets.path());
        std::fs::set_permissions(assets.path().join("etcd"), std::fs::Permissions::from_mode(0o644)).unwrap();

        let err = Assets::locate(Some(assets.path().into()), None, None).unwrap_err();

        assert!(
            err.to_string().contains("lacks etcd (no other directory"),
            "{err}"
        );
    }
}
