#!/usr/bin/env bash
# The one test command (README.md names it; .ci/run calls it).
#
# On a fresh machine it installs and builds what is missing (cached afterwards):
#   - the control-plane binaries (scripts/testenv-assets.sh → KUBEBUILDER_ASSETS),
#   - the client-go candidate used by the interoperability tests (scripts/go-candidate.sh),
#   - what a real kubelet node needs (scripts/node-deps.sh: containerd, runc, the loopback CNI
#     plugin, busybox-static, gcc); the node tests build their images with scripts/image.sh,
# then runs formatting and lint checks, and every test: unit, doc, control-plane and real-node
# tests (e2e/tests/node.rs; skipped with one line where the machine cannot run a node).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
start=$(date +%s)

step "control-plane binaries"
KUBEBUILDER_ASSETS="$(./scripts/testenv-assets.sh)"
export KUBEBUILDER_ASSETS
echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"

step "client-go candidate"
KUBE_LEADER_GO_CANDIDATE="$(./scripts/go-candidate.sh)"
export KUBE_LEADER_GO_CANDIDATE
echo "KUBE_LEADER_GO_CANDIDATE=$KUBE_LEADER_GO_CANDIDATE"

step "real-node dependencies"
./scripts/node-deps.sh

# The control planes of this run live under a directory of their own, so the final check can
# tell their processes from any other run's.
RUN_TMP="$(mktemp -d "${TMPDIR:-/tmp}/kube-leader-test.XXXXXX")"
export TMPDIR="$RUN_TMP"
trap 'rm -rf "$RUN_TMP"' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo test (unit, integration against the local control plane, examples)"
# Test binaries run one after another; the tests inside one binary share one control plane.
cargo test --workspace --all-targets --no-fail-fast -- --test-threads "${KUBE_LEADER_TEST_THREADS:-4}"

step "doc tests"
cargo test --workspace --doc

step "benchmark harness, CI mode (a few rounds, so it cannot rot; figures in target/bench-ci)"
cargo run --release --quiet -p kube-leader-bench -- --mode ci --out target/bench-ci

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
