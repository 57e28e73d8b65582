//! Examples of kube-leader: the `examples/*.rs` targets (`cargo run -p kube-leader-examples
//! --example lease_worker`).
//!
//! This library target holds nothing but the Rust examples of the README and of the guides in
//! `docs/`, compiled as doc tests so that they cannot rot. They live here, in a crate that is
//! not published, because the published `kube-leader` package contains neither file's path.

/// The README's examples.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The library guide's examples.
#[cfg(doctest)]
#[doc = include_str!("../docs/library.md")]
struct LibraryGuideDoctests;
