#!/usr/bin/env bash
# The real-node figures, rerunnable: runs the node tests (e2e/tests/node.rs) RUNS times (default
# 3) and prints kube-leader (leader for life, Lease) and client-go's leaderelection side by side,
# the range over the runs of each figure, with the load average before each run:
#
#   scripts/node-bench.sh [RUNS] [ROUNDS]
#
# Then `kubectl delete pod` on the leader ROUNDS times in a row per strategy (default 20; the
# tests `delete_pod_rounds_*`, one strategy at a time, so that they do not load each other): the
# percentiles of each step of the handover (docs/node.md, "Where the time goes"). RUNS=0 runs
# only the rounds.
#
# KUBE_LEADER_NODE_ROLLOUTS=N (default 1) makes each run do N `kubectl rollout restart`s per
# strategy in a row: the transitions per rollout and the longest leaderless gap of each are
# summarised (`KUBE_LEADER_NODE_ROLLOUTS=10 scripts/node-bench.sh 1 0`: docs/node.md).
# KUBE_LEADER_NODE_SUCCESSOR=any runs kube-leader's Pods with `--successor any` (no preferred
# successor: the behaviour before it), for a comparison; the tests' assertions on it are off.
#
# The tests apply deploy/ (and the client-go candidate in the same Deployment shape) to a real
# kubelet node and print each figure on a line `node: figure LABEL NAME MS`; this script only
# collects those lines. Where the machine cannot run a node, the tests print why and there are no
# figures. Needs what ./scripts/test.sh installs (it is not run here).
#
# The figures are also written, as the benchmark (bench/) writes its own, to a Markdown file under
# bench/results/: node-DATE-k8s-VERSION.md (node-DATE-HHMM-k8s-VERSION.md when that exists, or
# $KUBE_LEADER_NODE_BENCH_OUT), headed by the date, the Kubernetes version (`kube-apiserver
# --version` of $KUBEBUILDER_ASSETS), the clients, the machine, the commit and the load average.
# Cite that file beside the figures (README.md, "Figures"; scripts/check-figures.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-3}
ROUNDS=${2:-20}
case "$RUNS$ROUNDS" in ''|*[!0-9]*) echo "usage: $0 [RUNS] [ROUNDS]" >&2; exit 2 ;; esac

KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(./scripts/testenv-assets.sh)}"
KUBE_LEADER_GO_CANDIDATE="${KUBE_LEADER_GO_CANDIDATE:-$(./scripts/go-candidate.sh)}"
export KUBEBUILDER_ASSETS KUBE_LEADER_GO_CANDIDATE
cargo build --quiet -p kube-leader-cli

# The report's header, as bench/src/report.rs writes it.
DAY=$(date -u '+%F')
STARTED=$(date -u '+%F %H:%M UTC')
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
K8S=$("$KUBEBUILDER_ASSETS/kube-apiserver" --version 2>/dev/null | sed -n 's/^Kubernetes v//p')
K8S=${K8S:-unknown}
MODEL=$(sed -n '/^model name[[:space:]]*: /{s///p;q;}' /proc/cpuinfo)
MACHINE="${MODEL:-unknown CPU}, $(nproc) cores, $(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo) GiB, Linux $(uname -r)"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || COMMIT="$COMMIT (with uncommitted changes)"
OUT=${KUBE_LEADER_NODE_BENCH_OUT:-bench/results/node-$DAY-k8s-$K8S.md}
[ -n "${KUBE_LEADER_NODE_BENCH_OUT:-}" ] || [ ! -e "$OUT" ] || OUT="bench/results/node-$DAY-$(date -u '+%H%M')-k8s-$K8S.md"
BODY=$(mktemp)

LOG=$(mktemp)
trap 'rm -f "$LOG" "$BODY"' EXIT
failed=0
for run in $(seq 1 "$RUNS"); do
  echo "run $run of $RUNS: load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%F %T') UTC" | tee -a "$BODY" >&2
  cargo test --quiet -p kube-leader-e2e --test node -- --nocapture 2>&1 | tee -a "$LOG" \
    | grep -E '^(node: |kube-leader-testenv: SKIPPED|test result|test .* FAILED|thread .* panicked|assertion|  left| right)' >&2 || true
  [ "${PIPESTATUS[0]}" = 0 ] || { failed=1; echo "run $run: the node tests failed (figures kept)" >&2; }
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
FIGURES=$(grep '^node: figure ' "$LOG" | grep -v ' delete_round_' || true)
# Rollouts: transitions per rollout (a count) and the longest leaderless gap of each.
grep -E '^node: (count [a-z-]+ rollout_transitions|figure [a-z-]+ rollout_gap) ' "$LOG" | awk '
  $2 == "count" { t[$3] = t[$3] " " $5; n[$3]++; if ($5 == 1) one[$3]++ }
  $2 == "figure" { g[$3] = g[$3] " " $5; if ($5 + 0 > gmax[$3]) gmax[$3] = $5 + 0 }
  END {
    if (length(n) == 0) exit
    print "\nrollouts: transitions per rollout, longest leaderless gap (ms) per rollout\n"
    for (s in n) printf "- %s: %d rollouts, %d with exactly 1 transition; transitions:%s; gaps:%s (max %d)\n", s, n[s], one[s], t[s], g[s], gmax[s]
  }' | tee -a "$BODY" >&2 || true

ROUNDS_LOG=$(mktemp)
trap 'rm -f "$LOG" "$BODY" "$ROUNDS_LOG"' EXIT
if [ "$ROUNDS" -gt 0 ]; then
  echo "delete rounds: $ROUNDS per strategy, one strategy at a time; load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$BODY" >&2
  KUBE_LEADER_NODE_DELETE_ROUNDS=$ROUNDS cargo test --quiet -p kube-leader-e2e --test node \
    delete_pod_rounds -- --nocapture --test-threads 1 2>&1 | tee "$ROUNDS_LOG" \
    | grep -E '^(node: .*delete round|kube-leader-testenv: SKIPPED|test result)' >&2 || true
  [ "${PIPESTATUS[0]}" = 0 ] || { failed=1; echo "the delete rounds failed (figures kept)" >&2; }
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  grep '^node: figure [a-z-]* delete_round_' "$ROUNDS_LOG" | awk '
    { key = $3 " " $4; n[key]++; v[key, n[key]] = $5 + 0; seen[$3] = 1 }
    function pct(key, f,   i, j, t, m, a) {
      m = n[key]; if (m == 0) return "–"
      for (i = 1; i <= m; i++) a[i] = v[key, i]
      for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      i = int(f * m + 0.999999); if (i < 1) i = 1; if (i > m) i = m
      return a[i]
    }
    function cell(key) {
      if (n[key] == 0) return "–"
      return sprintf("%d / %d / %d / %d", pct(key, 0.5), pct(key, 0.9), pct(key, 0.99), pct(key, 1))
    }
    END {
      split("delete_round_to_next delete_round_kubectl delete_round_noticed delete_round_stopped delete_round_released delete_round_released_to_next", names, " ")
      t["delete_round_to_next"] = "`kubectl delete pod` started → next leader'"'"'s COMMAND"
      t["delete_round_kubectl"] = "`kubectl delete pod` process (start → exit)"
      t["delete_round_noticed"] = "→ old leader noticed (Pod watch or SIGTERM)"
      t["delete_round_stopped"] = "→ old COMMAND got SIGTERM"
      t["delete_round_released"] = "→ lock released"
      t["delete_round_released_to_next"] = "lock released → next leader'"'"'s COMMAND"
      printf "\ndelete rounds, ms p50 / p90 / p99 / max (runs: for-life %d, lease %d, client-go %d)\n\n", n["for-life delete_round_to_next"], n["lease delete_round_to_next"], n["client-go delete_round_to_next"]
      print "| | leader for life | kube-leader Lease | client-go Lease |"
      print "| --- | ---: | ---: | ---: |"
      for (i = 1; i <= 6; i++) {
        k = names[i]
        printf "| %s | %s | %s | %s |\n", t[k], cell("for-life " k), cell("lease " k), cell("client-go " k)
      }
    }' | tee -a "$BODY"
  { echo "load average after the delete rounds: $(cut -d' ' -f1-3 /proc/loadavg)"; echo
    echo "Raw delete-round lines (\`node: figure STRATEGY NAME MS\`):"; echo; echo '```'
    grep '^node: figure [a-z-]* delete_round_' "$ROUNDS_LOG" || true; echo '```'; } >>"$BODY"
fi

# Writes the report: the header, then what was collected in $BODY.
write_report() {
  mkdir -p "$(dirname "$OUT")"
  {
    echo "## kube-leader real-node figures (scripts/node-bench.sh $RUNS $ROUNDS)"
    echo
    echo "$STARTED · Kubernetes $K8S (single kubelet node, e2e/tests/node.rs) · $MACHINE · commit $COMMIT · load average at start $LOAD_START, at the end $(cut -d' ' -f1-3 /proc/loadavg) · kube-leader run: its default client, the library's \`http2\` feature · client-go $(sed -n 's/^[[:space:]]*k8s.io\/client-go v\([^ ]*\).*/\1/p' tools/go-candidate/go.mod)'s leaderelection (tools/go-candidate), Lease 15 s / 10 s / 2 s · KUBE_LEADER_NODE_ROLLOUTS=${KUBE_LEADER_NODE_ROLLOUTS:-1} KUBE_LEADER_NODE_SUCCESSOR=${KUBE_LEADER_NODE_SUCCESSOR:-youngest}"
    [ "$failed" = 0 ] || { echo; echo "Some node tests failed in this run (figures kept)."; }
    echo
    cat "$BODY"
  } >"$OUT"
  echo "==> wrote $OUT" >&2
}

if [ -z "$FIGURES" ]; then
  if [ "$RUNS" = 0 ]; then
    [ ! -s "$BODY" ] || write_report
    exit "$failed"
  fi
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
' <<<"$FIGURES" | { echo; cat; } | tee -a "$BODY"
{ echo; echo "Raw figure lines of the $RUNS run(s) (\`node: figure STRATEGY NAME MS\`):"; echo; echo '```'; echo "$FIGURES"; echo '```'; } >>"$BODY"
write_report
exit "$failed"
