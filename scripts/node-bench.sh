#!/usr/bin/env bash
# The real-node figures, rerunnable: runs the node tests (e2e/tests/node.rs) RUNS times (default
# 3) and prints kube-leader (leader for life, Lease) and client-go's leaderelection side by side,
# the range over the runs of each figure, with the load average before each run:
#
#   scripts/node-bench.sh [RUNS]
#
# The tests apply deploy/ (and the client-go candidate in the same Deployment shape) to a real
# kubelet node and print each figure on a line `node: figure LABEL NAME MS`; this script only
# collects those lines. Where the machine cannot run a node, the tests print why and there are no
# figures. Needs what ./scripts/test.sh installs (it is not run here).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-3}
case "$RUNS" in ''|*[!0-9]*) echo "usage: $0 [RUNS]" >&2; exit 2 ;; esac

KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(./scripts/testenv-assets.sh)}"
KUBE_LEADER_GO_CANDIDATE="${KUBE_LEADER_GO_CANDIDATE:-$(./scripts/go-candidate.sh)}"
export KUBEBUILDER_ASSETS KUBE_LEADER_GO_CANDIDATE
cargo build --quiet -p kube-leader-cli

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
failed=0
for run in $(seq "$RUNS"); do
  echo "run $run of $RUNS: load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%F %T') UTC" >&2
  cargo test --quiet -p kube-leader-e2e --test node -- --nocapture 2>&1 | tee -a "$LOG" \
    | grep -E '^(node: |kube-leader-testenv: SKIPPED|test result)' >&2 || true
  [ "${PIPESTATUS[0]}" = 0 ] || { failed=1; echo "run $run: the node tests failed (figures kept)" >&2; }
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
FIGURES=$(grep '^node: figure ' "$LOG" || true)

if [ -z "$FIGURES" ]; then
  echo "no figures: the node tests did not run (see above)" >&2
  exit 1
fi

awk -v runs="$RUNS" '
  function range(key,   lo, hi) {
    if (!(key in min)) return "–"
    lo = min[key]; hi = max[key]
    if (hi >= 5000) return sprintf("%.1f–%.1f s", lo / 1000, hi / 1000)
    return sprintf("%d–%d ms", lo, hi)
  }
  {
    key = $3 " " $4; v = $5 + 0
    if (!(key in min) || v < min[key]) min[key] = v
    if (!(key in max) || v > max[key]) max[key] = v
  }
  END {
    split("delete_to_next delete_stopped_to_next evict_to_next evict_ended_to_next rollout_gap", names, " ")
    title["delete_to_next"] = "`kubectl delete pod` leader → next leader"
    title["delete_stopped_to_next"] = "of which: old leader stopped (SIGTERM) → next leader"
    title["evict_to_next"] = "eviction: limit exceeded → next leader"
    title["evict_ended_to_next"] = "of which: old leader ended (killed) → next leader"
    title["rollout_gap"] = "`kubectl rollout restart`: longest leaderless gap"
    printf "%d run(s)\n\n", runs
    print "| | leader for life | kube-leader Lease | client-go Lease |"
    print "| --- | ---: | ---: | ---: |"
    for (i = 1; i <= 5; i++) {
      n = names[i]
      printf "| %s | %s | %s | %s |\n", title[n], range("for-life " n), range("lease " n), range("client-go " n)
    }
  }
' <<<"$FIGURES"
exit "$failed"
