//! `kube-leader install DIR`: the binary copies itself into DIR, for the initContainer pattern
//! (an image without `cp` or `sh` copies kube-leader into an emptyDir that the user's container
//! runs it from).

use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context as _};
use tracing::info;

use crate::exit::{self, Fail};

/// The file name of the installed binary.
const NAME: &str = "kube-leader";

/// `kube-leader install DIR`: copies this binary to `DIR/kube-leader` (mode 0755), written
/// beside and renamed, so that a reader never sees half a binary. A DIR that does not exist,
/// is not a directory or cannot be written is a usage error naming it (exit 125).
pub(crate) fn install(dir: &Path) -> Result<u8, Fail> {
    let source = std::env::current_exe()
        .map_err(|e| Fail::new(exit::INTERNAL, anyhow!(e).context("cannot find this binary")))?;
    let target = install_from(&source, dir).map_err(|e| Fail::new(exit::USAGE, e))?;
    info!(from = %source.display(), to = %target.display(), "installed");
    Ok(0)
}

/// Copies `source` into `dir`; returns the installed path.
fn install_from(source: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let meta = fs::metadata(dir).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => anyhow!(
            "install: {} does not exist (mount an emptyDir there, or create it)",
            dir.display()
        ),
        _ => anyhow!(e).context(format!("install: cannot read {}", dir.display())),
    })?;
    if !meta.is_dir() {
        return Err(anyhow!("install: {} is not a directory", dir.display()));
    }
    let target = dir.join(NAME);
    let partial = dir.join(format!(".{NAME}.partial-{}", std::process::id()));
    let copied = (|| -> io::Result<()> {
        let bytes = fs::read(source)?;
        let mut file = fs::File::create(&partial)?;
        file.write_all(&bytes)?;
        file.set_permissions(fs::Permissions::from_mode(0o755))?;
        file.sync_all()?;
        fs::rename(&partial, &target)
    })();
    if let Err(e) = copied {
        let _ = fs::remove_file(&partial);
        return Err(anyhow!(e)).with_context(|| {
            format!(
                "install: cannot write {} (is {} writable by this user?)",
                target.display(),
                dir.display()
            )
        });
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kube-leader-install-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn copies_itself_executable_and_replaces_an_old_copy() {
        let dir = scratch();
        let source = dir.join("source");
        fs::write(&source, b"\x7fELF new").unwrap();
        let out = dir.join("out");
        fs::create_dir(&out).unwrap();
        fs::write(out.join(NAME), b"old").unwrap();
        let target = install_from(&source, &out).unwrap();
        assert_eq!(target, out.join(NAME));
        assert_eq!(fs::read(&target).unwrap(), b"\x7fELF new");
        let mode = fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        // Nothing else is left in DIR.
        assert_eq!(fs::read_dir(&out).unwrap().count(), 1);
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_bad_dir_is_named() {
        let dir = scratch();
        let source = dir.join("source");
        fs::write(&source, b"x").unwrap();
        let missing = dir.join("missing");
        let e = format!("{:#}", install_from(&source, &missing).unwrap_err());
        assert!(e.contains("does not exist") && e.contains("missing"), "{e}");
        let e = format!("{:#}", install_from(&source, &source).unwrap_err());
        assert!(e.contains("is not a directory"), "{e}");
        let _ = fs::remove_dir_all(dir);
    }
}
