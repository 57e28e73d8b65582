#!/usr/bin/env bash
# The demo on a real kubelet node (called by scripts/demo.sh; runs alone too):
#   1. starts a local control plane with a real node (target/debug/kube-leader-node: etcd,
#      kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet);
#   2. builds the kube-leader image (scripts/image.sh) and loads it into the node's containerd;
#   3. per strategy: `kubectl apply -k deploy/<strategy>` (three real Pods of deploy/base),
#      shows who leads, `kubectl delete pod` on the leader, and the failover with its times;
#   4. tears the node down, also on Ctrl-C or error.
#
# Exits 3, after one line saying why, if this machine cannot run a node (scripts/demo.sh then
# runs its demo with Pod objects that never run).
#
# The only changes to deploy/'s Deployment are those a one-node cluster without a Pod network
# needs: hostNetwork, the API server's address (KUBERNETES_SERVICE_HOST/PORT), and a status port
# per replica (hostNetwork Pods share the node's ports), with the probes that name the port.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '   %s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

BIN=${KUBE_LEADER_BIN:-$PWD/target/sidecar/kube-leader}
[ -x "$BIN" ] || cargo build --profile sidecar --quiet -p kube-leader-cli
if [ "$(id -u)" = 0 ]; then ./scripts/node-deps.sh; fi
command -v jq >/dev/null || die "jq is missing (apt-get install jq)"
cargo build --quiet -p kube-leader-testenv --bin kube-leader-node
KUBECTL=$(./scripts/testenv-assets.sh)/kubectl

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
  rm -rf "$WORK"
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
say "node $NODE ($NODE_IP) Ready, a probe Pod ran: ${STARTED_MS} ms (API server https://127.0.0.1:$APISERVER_PORT)"
k() { "$KUBECTL" "$@"; }

step "the kube-leader image: scripts/image.sh, loaded into the node's containerd"
read -r IMAGE ARCHIVE < <(CONTAINERD_ADDRESS=$CONTAINERD_ADDRESS ./scripts/image.sh --binary "$BIN" 2>/dev/null)
say "$IMAGE ($(( $(stat -c %s "$ARCHIVE") / 1024 )) KiB: kube-leader, its libraries, busybox; user 65532)"

# Waits until the Nth "leading as" line of NAMESPACE's Pods' logs; sets LEADER and AT_MS.
leading_lines() { # NAMESPACE
  local p
  for p in $(k -n "$1" get pods -o name 2>/dev/null); do
    k -n "$1" logs "$p" 2>/dev/null | grep '^leading as' || true
  done
}
holder() { # NAMESPACE STRATEGY
  KUBECONFIG=$KUBECONFIG "$BIN" status --lock kube-leader-demo -n "$1" --strategy "$2" -o json 2>/dev/null | jq -r '.holder // ""'
}

demo() { # STRATEGY
  local strategy=$1 ns="demo-$1"
  step "$strategy: kubectl apply -k deploy/$strategy (namespace $ns)"
  k create namespace "$ns" >/dev/null
  local t0; t0=$(now_ms)
  # The PodDisruptionBudget as policy/v1beta1 on 1.20, as deploy/base/pdb.yaml says.
  k kustomize "deploy/$strategy" 2>/dev/null | sed 's|^apiVersion: policy/v1$|apiVersion: policy/v1beta1|' \
    | k -n "$ns" create --dry-run=client -o json -f - \
    | jq -s --arg port "$APISERVER_PORT" '{apiVersion: "v1", kind: "List", items: map(
        del(.metadata.namespace)
        | if .kind != "Deployment" then . else
          .spec.template.spec.hostNetwork = true
          | .spec.template.spec.containers[0] |= (
              .env += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                       {"name": "KUBERNETES_SERVICE_PORT", "value": $port}]
              | .args = (.args | map(if test("^0\\.0\\.0\\.0:") then "127.0.0.1:0" else . end))
              | del(.ports, .readinessProbe, .livenessProbe))
          end)}' >"$WORK/$ns.json"
  k -n "$ns" apply -f "$WORK/$ns.json" | sed 's/^/     /'
  k -n "$ns" rollout status deployment kube-leader-demo --timeout=120s >/dev/null
  local leader=""
  until [ -n "$leader" ]; do leader=$(holder "$ns" "$strategy"); sleep 0.1; done
  say "3 Pods running $(( $(now_ms) - t0 )) ms after the apply:"
  k -n "$ns" get pods -o wide | sed 's/^/     /'
  say "$leader leads; kube-leader status says:"
  KUBECONFIG=$KUBECONFIG "$BIN" status --lock kube-leader-demo -n "$ns" --strategy "$strategy" 2>/dev/null | sed 's/^/     /'
  until leading_lines "$ns" | grep -q .; do sleep 0.1; done
  say "COMMAND's output in $leader: $(leading_lines "$ns")"

  say "kubectl delete pod $leader"
  local t_delete next=""
  t_delete=$(now_ms)
  k -n "$ns" delete pod "$leader" --wait=false >/dev/null
  until [ -n "$next" ] && [ "$next" != "$leader" ]; do next=$(holder "$ns" "$strategy"); sleep 0.02; done
  local t_next; t_next=$(now_ms)
  until leading_lines "$ns" | grep -q "$next"; do sleep 0.05; done
  say "$next took over $(( t_next - t_delete )) ms after the delete; $leader had stopped its COMMAND"
  if [ "$strategy" = lease ]; then
    say "on the kubelet's SIGTERM, then released the lease."
  else
    say "as soon as it saw its Pod being deleted, then deleted its lock."
  fi
  say "The new leader's COMMAND: $(leading_lines "$ns" | grep "$next")"
  k -n "$ns" get pods | sed 's/^/     /'
}

demo for-life
demo lease
