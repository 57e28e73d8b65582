//! Records the commit the binary was built from, for `kube-leader --version` and the build-info
//! metric: `KUBE_LEADER_GIT_COMMIT` (12 hex digits, or `unknown`).
//!
//! From a git checkout it asks git. From a packaged crate (`cargo install kube-leader-cli`, where
//! there is no `.git`) it reads the `.cargo_vcs_info.json` that `cargo package` writes. Neither
//! is required: without both the commit is `unknown` and the build goes on.

use std::{path::Path, process::Command};

fn main() {
    println!("cargo::rerun-if-env-changed=KUBE_LEADER_GIT_COMMIT");
    let commit = std::env::var("KUBE_LEADER_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(from_git)
        .or_else(from_vcs_info)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo::rustc-env=KUBE_LEADER_GIT_COMMIT={commit}");
}

/// `git rev-parse --short=12 HEAD`, and re-run when HEAD moves.
fn from_git() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD names a branch whose ref file (or packed-refs) changes on commit; in a worktree HEAD
    // lives in the worktree's git dir and the refs in the common one.
    if let (Some(dir), Some(common)) = (
        git(&["rev-parse", "--absolute-git-dir"]),
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
    ) {
        println!("cargo::rerun-if-changed={dir}/HEAD");
        println!("cargo::rerun-if-changed={common}/packed-refs");
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let path = Path::new(&common).join(head);
            if path.exists() {
                println!("cargo::rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}

/// `{"git": {"sha1": "..."}}` in `.cargo_vcs_info.json`, written by `cargo package`.
fn from_vcs_info() -> Option<String> {
    let text = std::fs::read_to_string(".cargo_vcs_info.json").ok()?;
    let start = text.find("\"sha1\"")?;
    let rest = &text[start + "\"sha1\"".len()..];
    let sha: String = rest
        .trim_start_matches(|c: char| c == ':' || c.is_whitespace() || c == '"')
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (sha.len() >= 12).then(|| sha[..12].to_string())
}
