#!/usr/bin/env bash
# The demo on a real kubelet node (called by scripts/demo.sh; runs alone too):
#   1. starts a local control plane with a real node (target/debug/kube-leader-node: etcd,
#      kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet);
#   2. loads the images deploy/ names into the node's containerd: kube-leader's own image
#      (scripts/image.sh: the Dockerfile's FROM-scratch image of the static binary) and the app
#      image, busybox:1.36 (no registry here: scripts/image.sh busybox, a stand-in built from this
#      machine's busybox-static);
#   3. per strategy: `kubectl apply -k deploy/<strategy>` (three real Pods of deploy/base: the
#      initContainer pattern), shows who leads, `kubectl delete pod` on the leader, and who leads
#      next, with the time from the delete to the new leader's COMMAND (its first log line);
#   4. tears the node down, also on Ctrl-C or error.
#
# Exits 3, after one line saying why, if this machine cannot run a node (scripts/demo.sh then
# runs its demo with Pod objects that never run). Any failed step prints what failed and why and
# exits 1.
#
# The only changes to deploy/'s Deployment are those a one-node cluster without a Pod network
# needs: hostNetwork, the API server's address (KUBERNETES_SERVICE_HOST/PORT), and a status port
# per replica (hostNetwork Pods share the node's ports), with the probes that name the port.
#
# KUBE_LEADER_BIN: the static kube-leader binary (default: scripts/static.sh amd64).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '   %s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# Runs COMMAND with its stderr in LOG; on failure prints WHAT, the log's tail, and exits 1.
checked() { # WHAT LOG COMMAND...
  local what=$1 log=$2; shift 2
  if ! "$@" 2>"$log"; then
    printf 'demo: error: %s failed:\n' "$what" >&2
    tail -n 20 "$log" | sed 's/^/     /' >&2
    exit 1
  fi
}

if [ "$(id -u)" = 0 ]; then ./scripts/node-deps.sh; fi
command -v jq >/dev/null || die "jq is missing (apt-get install jq)"
BIN=${KUBE_LEADER_BIN:-}
if [ -z "$BIN" ]; then
  command -v musl-gcc >/dev/null || { echo "unavailable: musl-gcc is missing for the static binary (scripts/node-deps.sh, as root)"; exit 3; }
  BIN=$(./scripts/static.sh amd64) || die "scripts/static.sh amd64 failed (see above)"
fi
# `file`'s answer read whole, then tested (no `| grep -q`: see scripts/check-scripts.sh).
BIN_TYPE=$(file -L "$BIN") || die "file -L $BIN failed"
[[ $BIN_TYPE == *'statically linked'* || $BIN_TYPE == *'static-pie linked'* ]] \
  || die "$BIN is not statically linked: the image is FROM scratch (build it with scripts/static.sh)"
cargo build --quiet -p kube-leader-testenv --bin kube-leader-node
ASSETS=$(./scripts/testenv-assets.sh)
KUBECTL=$ASSETS/kubectl

step "starting a local control plane with a real node (containerd, kubelet, kube-scheduler)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kube-leader-demo-node.XXXXXX")
mkfifo "$WORK/node-in"
target/debug/kube-leader-node <"$WORK/node-in" >"$WORK/node-out" 2>"$WORK/node.log" &
NODE_PID=$!
exec 7>"$WORK/node-in"   # the node runs until this closes
NODE_UP=0
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  [ "$NODE_UP" = 1 ] && step "cleaning up"
  exec 7>&-
  wait "$NODE_PID" 2>/dev/null || true
  if [ "$code" != 0 ] && [ "$code" != 3 ] && [ -f "$WORK/node.log" ]; then
    printf 'demo: the node'"'"'s log ends with:\n' >&2
    tail -n 15 "$WORK/node.log" | sed 's/^/     /' >&2
  fi
  if [ "${KUBE_LEADER_DEMO_KEEP:-}" = 1 ]; then say "logs kept in $WORK"; else rm -rf "$WORK"; fi
  [ "$NODE_UP" = 1 ] && say "the node is torn down (containers, mounts, cgroups, sysctls) and every process stopped"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
until grep -q '^ready$\|^unavailable' "$WORK/node-out" 2>/dev/null; do
  kill -0 "$NODE_PID" 2>/dev/null || die "the node did not start: $(tail -5 "$WORK/node.log")"
  sleep 0.2
done
if grep -q '^unavailable' "$WORK/node-out"; then
  say "no real node on this machine: $(sed -n 's/^unavailable: //p' "$WORK/node-out")"
  exit 3
fi
NODE_UP=1
# shellcheck disable=SC1090
. <(grep '=' "$WORK/node-out" | sed 's/^/export /')
K8S_VERSION=$("$ASSETS/kube-apiserver" --version | awk '{print $2}')
say "node $NODE ($NODE_IP) Ready, a probe Pod ran: ${STARTED_MS} ms (Kubernetes $K8S_VERSION, API server https://127.0.0.1:$APISERVER_PORT)"
k() { "$KUBECTL" "$@"; }

step "the images deploy/ names, loaded into the node's containerd"
read -r IMAGE ARCHIVE < <(checked "scripts/image.sh kube-leader" "$WORK/image.log" \
  env CONTAINERD_ADDRESS="$CONTAINERD_ADDRESS" ./scripts/image.sh kube-leader --binary "$BIN") \
  || die "scripts/image.sh kube-leader printed no image"
[ -n "${IMAGE:-}" ] || die "scripts/image.sh kube-leader printed no image"
say "$IMAGE ($(( $(stat -c %s "$ARCHIVE") / 1024 )) KiB: FROM scratch, the static kube-leader alone; user 65532)"
read -r APP _ < <(checked "scripts/image.sh busybox" "$WORK/image-app.log" \
  env CONTAINERD_ADDRESS="$CONTAINERD_ADDRESS" ./scripts/image.sh busybox)
[ -n "${APP:-}" ] || die "scripts/image.sh busybox printed no image"
say "$APP (the public app image of deploy/base; here a stand-in from this machine's busybox-static)"

# The PodDisruptionBudget: policy/v1 since Kubernetes 1.21; 1.20 serves only policy/v1beta1.
# Chosen from the API server's list, read whole: a failed `kubectl api-versions` stops the demo
# with its message, and is never taken for an old server (`k api-versions | grep -qx` under
# pipefail once picked v1beta1 on 1.37: grep quit at its match, kubectl died of SIGPIPE).
API_VERSIONS=$(checked "kubectl api-versions" "$WORK/api-versions.log" k api-versions) || exit 1
if grep -qx policy/v1 <<<"$API_VERSIONS"; then
  PDB_API=policy/v1
elif grep -qx policy/v1beta1 <<<"$API_VERSIONS"; then
  PDB_API=policy/v1beta1
else
  die "the API server serves neither policy/v1 nor policy/v1beta1 (kubectl api-versions: ${API_VERSIONS//$'\n'/ })"
fi
say "PodDisruptionBudget: $PDB_API (kubectl api-versions)"

# The app container's log lines with their times: "<RFC3339 time> leading as ...".
leading_lines() { # NAMESPACE
  local p
  for p in $(k -n "$1" get pods -o name); do
    k -n "$1" logs "$p" -c app --timestamps 2>/dev/null | grep ' leading as' || true
  done
}
# The lock's holder, or nothing (no lock yet, or status failed: its error is kept in
# $WORK/status.err, and printed if no holder comes in time).
holder() { # NAMESPACE STRATEGY
  local out
  out=$(KUBECONFIG=$KUBECONFIG "$BIN" status --lock kube-leader-demo -n "$1" --strategy "$2" -o json 2>"$WORK/status.err") || return 0
  jq -r '.holder // ""' <<<"$out"
}
wait_until() { # SECONDS WHAT COMMAND...: until COMMAND succeeds
  local secs=$1 what=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  : >"$WORK/status.err"
  until "$@"; do
    if [ "$(date +%s)" -ge "$end" ]; then
      [ -s "$WORK/status.err" ] && printf 'demo: the last kube-leader status said: %s\n' "$(cat "$WORK/status.err")" >&2
      die "$what: not within ${secs}s"
    fi
    sleep 0.05
  done
}
has_holder() { LEADER=$(holder "$1" "$2"); [ -n "$LEADER" ] && [ "$LEADER" != "${3:-}" ]; }
# The app containers' lines are read whole before they are searched (no `| grep -q`, which
# would end the writer early under pipefail).
has_line() { local lines; lines=$(leading_lines "$1"); grep -q "leading as $2 " <<<"$lines"; }
# The first "leading as POD" line, or nothing.
first_line() { # NAMESPACE POD
  local lines; lines=$(leading_lines "$1")
  grep -m 1 "leading as $2 " <<<"$lines" || true
}

demo() { # STRATEGY
  local strategy=$1 ns="demo-$1"
  step "$strategy: kubectl apply -k deploy/$strategy (namespace $ns)"
  k create namespace "$ns" >/dev/null
  local t0; t0=$(now_ms)
  checked "kubectl kustomize deploy/$strategy" "$WORK/kustomize.log" k kustomize "deploy/$strategy" >"$WORK/$ns.yaml"
  sed -i "s|^apiVersion: policy/v1\$|apiVersion: $PDB_API|" "$WORK/$ns.yaml"
  checked "kubectl create --dry-run of deploy/$strategy" "$WORK/dry-run.log" \
    k -n "$ns" create --dry-run=client -o json -f "$WORK/$ns.yaml" >"$WORK/$ns.objects.json"
  jq -s --arg port "$APISERVER_PORT" '{apiVersion: "v1", kind: "List", items: (map(if .kind == "List" then .items[] else . end) | map(
        del(.metadata.namespace)
        | if .kind != "Deployment" then . else
          .spec.template.spec.hostNetwork = true
          | .spec.template.spec.containers[0] |= (
              .env += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                       {"name": "KUBERNETES_SERVICE_PORT", "value": $port}]
              | .args = (.args | map(if test("^:[0-9]+$") then "127.0.0.1:0" else . end))
              | del(.ports, .readinessProbe, .livenessProbe))
          end))}' "$WORK/$ns.objects.json" >"$WORK/$ns.json" || die "jq could not rewrite deploy/$strategy for the node"
  checked "kubectl apply of deploy/$strategy" "$WORK/apply.log" k -n "$ns" apply -f "$WORK/$ns.json" | sed 's/^/     /'
  if ! k -n "$ns" rollout status deployment kube-leader-demo --timeout=120s >/dev/null 2>"$WORK/rollout.log"; then
    printf 'demo: error: deploy/%s: the Deployment did not roll out within 120 s: %s\n' "$strategy" "$(cat "$WORK/rollout.log")" >&2
    k -n "$ns" get pods -o wide >&2 || true
    k -n "$ns" get events --sort-by=.lastTimestamp 2>&1 | tail -n 15 >&2 || true
    exit 1
  fi
  wait_until 60 "deploy/$strategy: a leader" has_holder "$ns" "$strategy"
  local leader=$LEADER
  say "3 Pods running $(( $(now_ms) - t0 )) ms after the apply:"
  k -n "$ns" get pods -o wide | sed 's/^/     /'
  say "$leader leads; kube-leader status says:"
  # RUST_LOG=error: the node's admin kubeconfig skips TLS verification, which kube-leader would
  # warn about on every call; errors still show.
  KUBECONFIG=$KUBECONFIG RUST_LOG=error "$BIN" status --lock kube-leader-demo -n "$ns" --strategy "$strategy" | sed 's/^/     /'
  wait_until 60 "$leader's COMMAND" has_line "$ns" "$leader"
  say "COMMAND's output in $leader: $(leading_lines "$ns" | grep "leading as $leader " | cut -d' ' -f2-)"

  say "kubectl delete pod $leader"
  local t_delete t_next
  t_delete=$(date +%s%N)
  k -n "$ns" delete pod "$leader" --wait=false >/dev/null
  wait_until 90 "deploy/$strategy: the next leader after deleting $leader" has_holder "$ns" "$strategy" "$leader"
  local next=$LEADER
  wait_until 60 "$next's COMMAND" has_line "$ns" "$next"
  # The time of the new leader's first COMMAND line, as the container runtime stamped it.
  local first; first=$(first_line "$ns" "$next")
  [ -n "$first" ] || die "$next's COMMAND line is gone from its log"
  t_next=$(date -d "${first%% *}" +%s%N)
  local took=$(( (t_next - t_delete) / 1000000 ))
  if [ "$strategy" = lease ]; then
    say "$leader stopped its COMMAND as soon as it saw its Pod being deleted (--watch-own-pod),"
    say "then released the Lease; $next, waiting on the Lease, took it."
  else
    say "$leader stopped its COMMAND as soon as it saw its Pod being deleted, then deleted its"
    say "lock; $next, waiting on the lock, created it."
  fi
  say "The new leader's COMMAND: ${first#* }"
  say "takeover ($strategy, real node): ${took} ms from kubectl delete pod to $next's COMMAND"
  k -n "$ns" get pods | sed 's/^/     /'
}

demo for-life
demo lease
