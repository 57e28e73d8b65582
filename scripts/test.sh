#!/usr/bin/env bash
# The one test command (README.md names it; .ci/run calls it).
#
# On a fresh machine it installs and builds what is missing (cached afterwards):
#   - the control-plane and node binaries of Kubernetes 1.37.2, the current release, and of
#     1.34.4, the oldest served release of kube 5's range (scripts/testenv-assets.sh →
#     KUBEBUILDER_ASSETS; both built from the Go modules pinned under tools/k8s/),
#   - the client-go candidate used by the interoperability tests (scripts/go-candidate.sh),
#   - what a real kubelet node needs (scripts/node-deps.sh: containerd, runc, the loopback CNI
#     plugin, busybox-static, gcc); the node tests build their images with scripts/image.sh,
# then runs formatting and lint checks, and every test on 1.37.2: unit, doc, control-plane and
# real-node tests (e2e/tests/node.rs; skipped with one line where the machine cannot run a node);
# then the election, interop, fence and node tests again on 1.34.4. A failure names its release.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
step() { printf '\n==> %s   [%ds]\n' "$*" "$(( $(date +%s) - start ))"; }
# Runs a test phase against one release; a failure says which release and which phase.
on_release() {
  local version="$1" what="$2"; shift 2
  "$@" || {
    echo "FAILED on Kubernetes $version: $what ($*)" >&2
    return 1
  }
}

step "disk space"
# A clean build of the workspace's tests takes about 6 GB under target/, the control planes and
# node images a few more; a full disk fails the run half-way with a linker's bus error.
need_gb=${KUBE_LEADER_MIN_FREE_GB:-12}
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
echo "free on $(df -P . | awk 'NR==2 {print $6}'): ${free_gb} GB (need ${need_gb} GB)"
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "not enough free disk space for the test run: ${free_gb} GB free, ${need_gb} GB needed" >&2
  echo "(free space under $(pwd) or set KUBE_LEADER_MIN_FREE_GB)" >&2
  exit 1
fi

# The control planes of this run live under a directory of their own, so the final check can
# tell their processes from any other run's.
RUN_TMP="$(mktemp -d "${TMPDIR:-/tmp}/kube-leader-test.XXXXXX")"
ASSETS_PID=""
cleanup() {
  # A background build still running (the run failed before it was needed) stops with it.
  if [ -n "$ASSETS_PID" ]; then kill -- "-$ASSETS_PID" 2>/dev/null || true; fi
  rm -rf "$RUN_TMP"
}
trap cleanup EXIT

step "control-plane and node binaries: Kubernetes 1.37.2 and 1.34.4 (built in the background)"
# Both built from Go modules (scripts/k8s-assets.sh, pinned under tools/k8s/; one Go build cache).
# KUBE_LEADER_KUBERNETES names the release of the main run (default 1.37.2; 1.20.2, Debian's
# source, is the legacy release, by hand only); an inherited KUBEBUILDER_ASSETS is not used, so
# that no test runs against another control plane than the one named here.
#
# On a fresh machine the Go builds take a quarter of an hour or more: they run in the background,
# at a lower priority, beside the Rust builds and checks below (which need no control plane), and
# the test steps wait for them. Cached, they are ready at once.
MAIN_RELEASE=${KUBE_LEADER_KUBERNETES:-1.37.2}
MAIN_RELEASE=${MAIN_RELEASE#v}
OLDEST_RELEASE=1.34.4
RELEASES=("$MAIN_RELEASE")
if [ "$MAIN_RELEASE" != "$OLDEST_RELEASE" ] && [ "${KUBE_LEADER_SKIP_OLDEST:-}" != 1 ]; then
  RELEASES+=("$OLDEST_RELEASE")
fi
ASSETS_LOG="$RUN_TMP/assets.log"
# A process group of its own (job control on for this one job), so that it can be stopped whole.
set -m
(
  for rel in "${RELEASES[@]}"; do
    if dir=$(env -u KUBEBUILDER_ASSETS KUBE_LEADER_KUBERNETES="$rel" ./scripts/testenv-assets.sh 2>>"$ASSETS_LOG"); then
      echo "$dir" >"$RUN_TMP/assets-$rel.tmp"
    else
      echo FAILED >"$RUN_TMP/assets-$rel.tmp"
    fi
    mv "$RUN_TMP/assets-$rel.tmp" "$RUN_TMP/assets-$rel"
  done
) &
ASSETS_PID=$!
set +m
renice -n 10 -p "$ASSETS_PID" >/dev/null 2>&1 || true
echo "building ${RELEASES[*]} (pid $ASSETS_PID; log: $ASSETS_LOG)"
# The release every binary reports, checked: a cached directory of another release fails here.
check_release() {
  local dir="$1" want="$2" got
  got=$("$dir/kube-apiserver" --version | sed -n 's/^Kubernetes v//p')
  [ "$got" = "$want" ] || { echo "$dir holds kube-apiserver $got, not $want" >&2; exit 1; }
}
# Waits for the background build of release $1 and prints its directory.
assets_ready() {
  local rel="$1" waited=0 dir
  until [ -f "$RUN_TMP/assets-$rel" ]; do
    sleep 5
    waited=$((waited + 5))
    if [ $((waited % 60)) = 0 ]; then
      echo "waiting for Kubernetes $rel's binaries (${waited}s): $(tail -n 1 "$ASSETS_LOG" 2>/dev/null)" >&2
    fi
  done
  dir=$(cat "$RUN_TMP/assets-$rel")
  if [ "$dir" = FAILED ]; then
    echo "building Kubernetes $rel's binaries failed:" >&2
    cat "$ASSETS_LOG" >&2
    exit 1
  fi
  check_release "$dir" "$rel"
  echo "$dir"
}
# Once every release is ready, the background job is over.
assets_done() {
  wait "$ASSETS_PID" 2>/dev/null || true
  ASSETS_PID=""
}

step "client-go candidate"
KUBE_LEADER_GO_CANDIDATE="$(./scripts/go-candidate.sh)"
export KUBE_LEADER_GO_CANDIDATE
echo "KUBE_LEADER_GO_CANDIDATE=$KUBE_LEADER_GO_CANDIDATE"

step "real-node dependencies"
./scripts/node-deps.sh

step "static sidecar binaries (amd64; arm64 cross-compiled) and the image, built offline"
# The binary the Dockerfile's image ships (scripts/static.sh); the real-node tests of
# deploy/patterns build their images from it. Where musl-gcc is missing (no root for
# node-deps.sh) the node tests skip anyway.
if command -v musl-gcc >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null; then
  mapfile -t static < <(./scripts/static.sh amd64 arm64)
  export KUBE_LEADER_STATIC_AMD64="${static[0]}" KUBE_LEADER_STATIC_ARM64="${static[1]}"
  echo "KUBE_LEADER_STATIC_AMD64=$KUBE_LEADER_STATIC_AMD64"
  echo "KUBE_LEADER_STATIC_ARM64=$KUBE_LEADER_STATIC_ARM64"
  if command -v buildah >/dev/null && [ "$(id -u)" = 0 ]; then
    # Both architectures' images from the Dockerfile's prebuilt stage: FROM scratch, the
    # static binary alone, the architecture in the image's config and in the binary's ELF header.
    for arch in amd64 arm64; do
      var="KUBE_LEADER_STATIC_${arch^^}"
      read -r _ archive < <(./scripts/image.sh kube-leader --arch "$arch" --binary "${!var}" --no-load)
      ./scripts/check-image.sh "$archive" "$arch"
    done
  else
    echo "buildah missing or not root: the image is not built here"
  fi
else
  echo "musl-gcc or aarch64-linux-gnu-gcc missing (scripts/node-deps.sh needs root): SKIPPED"
fi

# Build directories shared between checkouts (the public-API snapshot's, the package and MSRV
# builds): a fresh clone rebuilds only this workspace's crates there.
build_cache=${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader

# The tests' control planes and nodes live under the run's directory.
export TMPDIR="$RUN_TMP"

step "figures: README and docs/ cite results files that hold them"
./scripts/check-figures.sh README.md docs/*.md

step "scripts: no pipe into an early-exiting reader under pipefail; shellcheck"
# scripts/check-scripts.sh: a seconds-long check (installs shellcheck from Debian when missing).
./scripts/check-scripts.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "example binaries (examples/tests run them as their users do)"
# `cargo test --all-targets` compiles the examples as test harnesses, not as the programs
# `cargo run --example` makes: build those, beside the tests that look for them.
cargo build -p kube-leader-examples --examples

step "Kubernetes $MAIN_RELEASE's binaries"
KUBEBUILDER_ASSETS="$(assets_ready "$MAIN_RELEASE")"
export KUBEBUILDER_ASSETS
echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS ($("$KUBEBUILDER_ASSETS/kube-apiserver" --version))"

step "cargo test (unit, integration against the local control plane, examples, public-API snapshot)"
# The public-API snapshot's rustdoc build, in a directory shared between checkouts (its
# dependencies' metadata is built once; the test drops this crate's own build before it).
export KUBE_LEADER_PUBLIC_API_TARGET_DIR="$build_cache/target-public-api"
# Test binaries run one after another; the tests inside one binary share one control plane.
on_release "$MAIN_RELEASE" "cargo test --workspace --all-targets" \
  cargo test --workspace --all-targets --no-fail-fast -- --test-threads "${KUBE_LEADER_TEST_THREADS:-4}"

step "doc tests"
cargo test --workspace --doc

if [ "${#RELEASES[@]}" -gt 1 ]; then
  step "Kubernetes $OLDEST_RELEASE (the oldest served release of kube 5's range): election, interop, fence, node"
  OLDEST_ASSETS="$(assets_ready "$OLDEST_RELEASE")"
  assets_done
  echo "Kubernetes $OLDEST_RELEASE: $OLDEST_ASSETS"
  # The same test binaries (already built) against a control plane and node of that release:
  # both strategies' elections (library and sidecar), client-go 0.37.2 beside kube-leader, the
  # fence, and deploy/ on a real kubelet node. KUBE_LEADER_SKIP_OLDEST=1 leaves this out.
  KUBEBUILDER_ASSETS="$OLDEST_ASSETS" on_release "$OLDEST_RELEASE" "election, interop, fence, node" \
    cargo test -p kube-leader-e2e --no-fail-fast --test lease --test for_life --test successor \
    --test interop --test fence --test node -- --test-threads "${KUBE_LEADER_TEST_THREADS:-4}"
  KUBEBUILDER_ASSETS="$OLDEST_ASSETS" on_release "$OLDEST_RELEASE" "the sidecar's elections" \
    cargo test -p kube-leader-cli --no-fail-fast --test cli --test elect -- \
    --test-threads "${KUBE_LEADER_TEST_THREADS:-4}"
else
  assets_done
  step "Kubernetes $OLDEST_RELEASE: SKIPPED ($( [ "$MAIN_RELEASE" = "$OLDEST_RELEASE" ] && echo "it is the main run's release" || echo "KUBE_LEADER_SKIP_OLDEST=1"))"
fi

step "release checks: documentation, packages, a TLS-free library, the MSRV"
# The library's documentation with no flags (docs.rs: [package.metadata.docs.rs]).
RUSTDOCFLAGS="-D warnings" cargo doc -p kube-leader --no-deps
# The library picks no TLS stack: the binary does.
tls=$(cargo tree -p kube-leader -e normal -i ring 2>/dev/null)
if [ -n "$tls" ]; then
  echo "kube-leader depends on ring (a TLS provider) in a normal build:" >&2
  echo "$tls" >&2
  exit 1
fi
echo "cargo tree -p kube-leader -e normal -i ring: empty"
# Both crates package and build from their packaged sources; the CLI against the packaged
# library (cargo resolves an unpublished workspace crate of the same publish locally). It reads
# the registry's index for the dependencies: retried once, as a network hiccup is not a defect.
# Cargo treats the packaged library as a registry crate of a version it already knows: both its
# unpacked source (`-<hash>` in the registry cache) and its build are reused, however old. Drop
# both, so that the CLI is verified against this run's library.
# The package and MSRV builds use target directories shared between checkouts (like
# scripts/static.sh's): a fresh clone rebuilds only this workspace's two crates, not every
# dependency (four minutes of the run when they lived under the clone's target/).
publish_dir=$build_cache/target-publish
msrv_dir=$build_cache/target-msrv
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
rm -rf "$cargo_home"/registry/src/-*/kube-leader-[0-9]* "$cargo_home"/registry/cache/-*/kube-leader-[0-9]*
rm -rf "$publish_dir"/debug/.fingerprint/kube-leader-* "$publish_dir"/debug/deps/libkube_leader-* \
  "$publish_dir"/debug/deps/kube_leader-*
publish() {
  cargo publish --dry-run --allow-dirty --target-dir "$publish_dir" -p kube-leader -p kube-leader-cli
}
publish || { echo "cargo publish --dry-run failed; retrying once in 10 s" >&2; sleep 10; publish; }
# The MSRV (rust-version) builds. rustup installs the toolchain once; where it cannot,
# KUBE_LEADER_SKIP_MSRV=1 skips this step (and says so).
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if [ "${KUBE_LEADER_SKIP_MSRV:-}" = 1 ]; then
  echo "MSRV $msrv: SKIPPED (KUBE_LEADER_SKIP_MSRV=1)"
else
  if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
    rustup toolchain install "$msrv" --profile minimal || {
      echo "cannot install Rust $msrv (the MSRV); set KUBE_LEADER_SKIP_MSRV=1 to skip this step" >&2
      exit 1
    }
  fi
  cargo "+$msrv" check --locked -p kube-leader -p kube-leader-cli --target-dir "$msrv_dir"
  echo "MSRV $msrv: kube-leader and kube-leader-cli build"
fi

step "benchmark harness, CI mode (a few rounds, so it cannot rot; figures in target/bench-ci)"
# The sidecar the image ships (the static binary) when it was built above. The harness and its
# Rust candidates in the dev profile the tests above built (a release build of them took five
# minutes of the run); the README's figures come from `--release` runs, by hand.
KUBE_LEADER_CLI="${KUBE_LEADER_STATIC_AMD64:-}" \
  cargo run --quiet -p kube-leader-bench -- --mode ci --out target/bench-ci

step "the main job: ./scripts/demo.sh (README), end to end"
# The demo as a user runs it; it fails the run if it fails, and if it shows no takeover or one
# whose figure does not parse: on a real node both strategies after `kubectl delete pod`, else
# the three takeovers of its Pod-object demo.
demo_log="$RUN_TMP/demo.log"
demo_start=$(date +%s)
./scripts/demo.sh 2>&1 | tee "$demo_log"
echo "the demo took $(( $(date +%s) - demo_start )) s"
if grep -q '^   no real node on this machine' "$demo_log"; then
  want=("for-life, Pod objects" "lease crash, Pod objects" "lease, Pod objects")
else
  want=("for-life, real node" "lease, real node")
fi
for w in "${want[@]}"; do
  line=$(grep -F "   takeover ($w): " "$demo_log" || true)
  if ! [[ "$line" =~ ^\ \ \ takeover\ \(.*\):\ ([0-9]+)\ ms\ from ]]; then
    echo "the demo showed no takeover ($w) with a figure in ms; it printed: ${line:-nothing}" >&2
    exit 1
  fi
  echo "demo takeover ($w): ${BASH_REMATCH[1]} ms"
done

step "no control-plane process or node left behind"
sleep 1
left=$(pgrep -af "$RUN_TMP" || true)
if [ -n "$left" ]; then
  echo "processes started by the tests are still running:" >&2
  echo "$left" >&2
  exit 1
fi
# A real node is torn down by its janitor after its test binary exits (about 10 s).
for _ in $(seq 1 120); do
  compgen -G "/var/lib/kube-leader-testenv/node-*" >/dev/null || break
  sleep 0.5
done
if compgen -G "/var/lib/kube-leader-testenv/node-*" >/dev/null \
  || grep -q ' /var/lib/kube-leader-testenv/' /proc/self/mountinfo \
  || compgen -G "/sys/fs/cgroup/*/kubepods" >/dev/null; then
  echo "a real node was not torn down (see /var/lib/kube-leader-testenv/teardown.log):" >&2
  ls -d /var/lib/kube-leader-testenv/node-* /sys/fs/cgroup/*/kubepods 2>/dev/null >&2 || true
  grep ' /var/lib/kube-leader-testenv/' /proc/self/mountinfo >&2 || true
  exit 1
fi

echo
echo "all checks passed in $(( $(date +%s) - start ))s"
