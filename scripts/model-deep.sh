#!/usr/bin/env bash
# The model checker's deeper runs (issue 43): the `deep_` tests of kube-leader/src/model (ignored
# by `cargo test`), one at a time, in a release build, each bounded by a timeout. Prints each
# run's line (states, unique states, depth, time) and writes them to
# bench/results/model-deep-<date>.md (or the file named by $1).
#
#   ./scripts/model-deep.sh                      # every deep run
#   KUBE_LEADER_MODEL_FILTER=for_life ./scripts/model-deep.sh   # those whose path has it
#   KUBE_LEADER_MODEL_TIMEOUT=600 ./scripts/model-deep.sh       # seconds per run (default 1800)
#   KUBE_LEADER_MODEL_MEMORY_GB=8 ./scripts/model-deep.sh        # address space per run (default
#                                                                # 3/4 of the machine's memory)
# A breadth-first checker keeps every state it saw: a run over its memory stops with an
# allocation failure (reported as such), not the machine's OOM killer.
set -euo pipefail
cd "$(dirname "$0")/.."

date=$(date -u +%Y-%m-%d)
out=${1:-bench/results/model-deep-$date.md}
timeout_s=${KUBE_LEADER_MODEL_TIMEOUT:-1800}
filter=${KUBE_LEADER_MODEL_FILTER:-}
mem_gb=${KUBE_LEADER_MODEL_MEMORY_GB:-$(awk '/MemTotal/ {print int($2 * 3 / 4 / 1048576)}' /proc/meminfo)}

echo "==> building the library's tests (release)" >&2
bin=$(cargo test --release -p kube-leader --lib --no-run --message-format json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*kube_leader-[^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "the library's test binary did not build" >&2; exit 1; }
echo "    $bin" >&2
mapfile -t runs < <("$bin" --list --ignored 2>/dev/null \
  | sed -n 's/^\(model::.*deep_[a-z0-9_]*\): test$/\1/p' | grep -F -- "$filter")
[ "${#runs[@]}" -gt 0 ] || { echo "no deep model run matches '$filter'" >&2; exit 1; }

{
  echo "# The model checker's deeper runs ($date)"
  echo
  echo "Date: $date. Commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with local changes)')."
  echo "No Kubernetes: the model's API server is a store inside the checker; the shipped code"
  echo "targets Kubernetes 1.37.2. Checker: stateright, breadth-first, 2 threads, release build."
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo);"
  echo "load average at start $(cut -d' ' -f1-3 /proc/loadavg). Command: \`./scripts/model-deep.sh\`"
  echo "(each run alone, at most ${timeout_s} s and ${mem_gb} GB). Each line: the run's settings as the model prints"
  echo "them, states (unique), depth, time; then the run's verdict (every property it names holds,"
  echo "or the failure)."
  echo
} >"$out"

failed=0
for run in "${runs[@]}"; do
  echo "==> $run" >&2
  start=$(date +%s)
  set +e
  log=$(ulimit -v $((mem_gb * 1048576)); timeout "$timeout_s" "$bin" --ignored --exact "$run" --nocapture 2>&1)
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  case $rc in
    0) verdict="holds ($took s)" ;;
    124) verdict="TIMED OUT after $timeout_s s"; failed=1 ;;
    *)
      if grep -q 'memory allocation .* failed' <<<"$log"; then
        verdict="OUT OF MEMORY (over $mem_gb GB) after $took s"
      else
        verdict="FAILED (exit $rc)"
      fi
      failed=1
      ;;
  esac
  lines=$(grep -E '^(for-life |shards )?model ' <<<"$log" || true)
  echo "$lines" >&2
  echo "    $verdict" >&2
  {
    echo "## \`$run\`"
    echo
    echo '```text'
    [ -n "$lines" ] && echo "$lines"
    echo "$verdict"
    if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then
      grep -m 5 -E 'panicked|fails:|error' <<<"$log" || true
    fi
    echo '```'
    echo
  } >>"$out"
done
echo "wrote $out" >&2
exit "$failed"
