#!/usr/bin/env bash
# The main job: watch a leader election happen with the `kube-leader` command.
#
# On a fresh machine it sets up what is missing (the control-plane binaries, cached by
# ./scripts/testenv-assets.sh; the static kube-leader binary of scripts/static.sh, or the
# sidecar build where musl-gcc is missing), then:
#   1. starts a local control plane (etcd, kube-apiserver, kube-controller-manager) on free
#      127.0.0.1 ports, in a temporary directory;
#   2. leader for life: three `kube-leader run` candidates (Pod objects stand for them), shows
#      who leads, kills the leader (its process and its Pod), shows the failover and its time;
#   3. Lease: the same, first a crash (the lease must expire), then a graceful stop (the lease
#      is released and taken over at once);
#   4. stops every process it started, also on Ctrl-C or error.
#
# Where the machine can run a real kubelet node, the demo runs there instead
# (scripts/demo-node.sh: `kubectl apply -k deploy/for-life` and `-k deploy/lease`, three real
# Pods each with kube-leader's own image and the app image, `kubectl delete pod` on the leader);
# KUBE_LEADER_DEMO_NODE=0 skips that.
#
# Every takeover is printed on a line of its own, which the test command checks:
#   takeover (STRATEGY, WHERE): N ms from EVENT to NEXT's COMMAND
# Any failed step prints what failed and why, and the demo exits non-zero.
#
# Options (environment): KUBE_LEADER_DEMO_KEEP=1 keeps the temporary directory with all logs.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '   %s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kube-leader-demo.XXXXXX")
PIDS=()            # the control plane
CANDIDATES=()      # kube-leader processes
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  step "cleaning up"
  # Candidates first, gracefully (each forwards SIGTERM to its COMMAND and releases its lock),
  # then the control plane.
  stop_all "${CANDIDATES[@]}"
  stop_all "${PIDS[@]}"
  if [ "${KUBE_LEADER_DEMO_KEEP:-}" = 1 ]; then
    say "logs kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  say "every process started by the demo is stopped"
  exit "$code"
}
stop_all() { # PID...: SIGTERM, up to 5 s, SIGKILL
  [ $# -gt 0 ] || return 0
  local pid alive
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- what is missing --------------------------------------------------------------------------
step "setting up (control-plane binaries, sidecar build)"
ASSETS=$(./scripts/testenv-assets.sh)
command -v openssl >/dev/null || die "openssl is missing (apt-get install openssl)"
command -v python3 >/dev/null || die "python3 is missing (apt-get install python3)"
# What the project ships: the static binary (its image is FROM scratch); the sidecar build where
# this machine cannot build it.
if command -v musl-gcc >/dev/null; then
  BIN=$(./scripts/static.sh amd64) || die "scripts/static.sh amd64 failed (see above)"
else
  say "musl-gcc is missing (scripts/node-deps.sh installs it as root): the glibc sidecar build instead"
  cargo build --profile sidecar --quiet -p kube-leader-cli
  BIN="$PWD/target/sidecar/kube-leader"
fi
K8S_VERSION=$("$ASSETS/kube-apiserver" --version | awk '{print $2}')
# Outputs read whole, then picked from (no `| head`: see scripts/check-scripts.sh).
BIN_VERSION=$("$BIN" --version) || die "$BIN --version failed"
read -r _ BIN_VERSION _ <<<"$BIN_VERSION"
say "kube-leader $BIN_VERSION, $(du -k "$BIN" | cut -f1) KiB; Kubernetes $K8S_VERSION from $ASSETS"

# --- on a real node, where the machine allows it -----------------------------------------------
# Three real Pods of deploy/ per strategy on a kubelet node (scripts/demo-node.sh); where the
# machine cannot run one (it says why), the demo below with Pod objects that never run.
if [ "${KUBE_LEADER_DEMO_NODE:-1}" = 1 ]; then
  node_code=0
  node_bin=()
  bin_type=$(file -L "$BIN") || die "file -L $BIN failed"
  if [[ $bin_type == *'statically linked'* || $bin_type == *'static-pie linked'* ]]; then
    node_bin=(KUBE_LEADER_BIN="$BIN")
  fi
  env "${node_bin[@]}" ./scripts/demo-node.sh || node_code=$?
  [ "$node_code" = 3 ] || exit "$node_code"
  say "so: the demo with Pod objects that never run (no kubelet)"
fi

# --- the control plane ------------------------------------------------------------------------
free_ports() {
  python3 -c 'import socket
ss=[socket.socket() for _ in range('"$1"')]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}
wait_for() { # SECONDS WHAT COMMAND...
  local secs=$1 what=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "$what not ready within ${secs}s (logs in $WORK)"
    sleep 0.2
  done
}
start() { # NAME COMMAND... (logs to $WORK/NAME.log)
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  LAST_PID=$!
  disown "$LAST_PID"   # no "Killed" notices from bash
}

step "starting a local control plane (etcd, kube-apiserver, kube-controller-manager)"
t0=$(now_ms)
read -r ETCD_PORT PEER_PORT API_PORT < <(free_ports 3)
start etcd "$ASSETS/etcd" --name=default --data-dir="$WORK/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$PEER_PORT" \
  --initial-cluster="default=http://127.0.0.1:$PEER_PORT"
PIDS+=("$LAST_PID")
wait_for 30 etcd sh -c "curl -sf http://127.0.0.1:$ETCD_PORT/health | grep -q '\"health\":\"true\"'"

ssl() { # ARGS...: openssl, its messages kept unless it fails
  openssl "$@" 2>"$WORK/openssl.log" || die "openssl $1 failed: $(cat "$WORK/openssl.log")"
}
ssl genrsa -out "$WORK/sa.key" 2048
ssl rsa -in "$WORK/sa.key" -pubout -out "$WORK/sa.pub"
TOKEN=$(ssl rand -hex 16)
# Flags that only some releases take: 1.20 still has an insecure port, to be turned off, and a
# controller manager port; 1.24 and later refuse both flags.
LEGACY_APISERVER=() LEGACY_KCM=()
case "$K8S_VERSION" in
  v1.1[0-9].* | v1.2[0-3].*) LEGACY_APISERVER=(--insecure-port=0) LEGACY_KCM=(--port=0) ;;
esac
echo "$TOKEN,admin,1,\"system:masters\"" >"$WORK/tokens.csv"
start kube-apiserver "$ASSETS/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --secure-port="$API_PORT" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 "${LEGACY_APISERVER[@]}" \
  --cert-dir="$WORK/certs" --token-auth-file="$WORK/tokens.csv" \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$WORK/sa.pub" \
  --service-account-signing-key-file="$WORK/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
  --authorization-mode=RBAC --disable-admission-plugins=ServiceAccount --profiling=false \
  --endpoint-reconciler-type=none \
  --enable-priority-and-fairness=false
PIDS+=("$LAST_PID")
export KUBECONFIG="$WORK/kubeconfig"
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster: {server: "https://127.0.0.1:$API_PORT", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: demo
  context: {cluster: demo, user: admin, namespace: demo}
current-context: demo
EOF
KUBECTL=("$ASSETS/kubectl" --kubeconfig "$KUBECONFIG")
wait_for 60 kube-apiserver sh -c "curl -skf -H 'Authorization: Bearer $TOKEN' https://127.0.0.1:$API_PORT/readyz"
wait_for 30 "the default namespace" "${KUBECTL[@]}" get namespace default
start kube-controller-manager "$ASSETS/kube-controller-manager" --kubeconfig="$KUBECONFIG" \
  --controllers=garbagecollector,namespace --leader-elect=false --bind-address=127.0.0.1 \
  --secure-port=0 "${LEGACY_KCM[@]}"
PIDS+=("$LAST_PID")
"${KUBECTL[@]}" create namespace demo >/dev/null
say "ready in $(( ($(now_ms) - t0) )) ms: https://127.0.0.1:$API_PORT, namespace demo (no kubelet: Pods never run)"

# --- candidates -------------------------------------------------------------------------------
# COMMAND, the program that must run only on the leader: it notes when it started and then
# works (sleeps) until it is stopped.
COMMAND='echo "$(date +%s%N) $KUBE_LEADER_IDENTITY $KUBE_LEADER_FENCING_TOKEN $$" >>"$LEADERS"; exec sleep 100000'
declare -A CANDIDATE_PID
TIMINGS=(--lease-duration 4s --renew-deadline 3s --retry-period 500ms --grace 1s)

candidates() { # STRATEGY
  local strategy=$1 i
  for i in 1 2 3; do
    local pod="candidate-$i"
    LEADERS="$WORK/leaders-$strategy" POD_NAME="$pod" POD_NAMESPACE=demo \
      start "$strategy-$pod" "$BIN" run --lock "demo-$strategy" --strategy "$strategy" "${TIMINGS[@]}" \
      -- sh -c "$COMMAND"
    CANDIDATES+=("$LAST_PID")
    CANDIDATE_PID[$strategy-$pod]=$LAST_PID
  done
}
# Waits for the Nth leader's COMMAND to start; sets LEADER, TOKEN and STARTED_MS.
nth_leader() { # STRATEGY N
  local file="$WORK/leaders-$1" end=$(( $(date +%s) + 60 ))
  until [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$2" ]; do
    [ "$(date +%s)" -lt "$end" ] || die "no leader number $2 within 60s (logs in $WORK)"
    sleep 0.02
  done
  read -r started_ns LEADER TOKEN _ < <(sed -n "${2}p" "$file")
  STARTED_MS=$(( started_ns / 1000000 ))
}
show_status() { # STRATEGY (RUST_LOG=error: the demo's kubeconfig skips TLS verification, which
  # kube-leader would warn about on every call; errors still show)
  RUST_LOG=error "$BIN" status --lock "demo-$1" --strategy "$1" | sed 's/^/     /'
}
followers_idle() { # STRATEGY: how many of the COMMANDs ever started run now
  local n=0 m=0 pid
  for pid in $(cut -d' ' -f4 "$WORK/leaders-$1"); do
    m=$((m + 1))
    kill -0 "$pid" 2>/dev/null && n=$((n + 1))
  done
  say "COMMANDs of the 3 candidates: $m started so far, $n running now"
}

step "leader for life: 3 candidates, lock demo-for-life (a ConfigMap owned by the leader's Pod)"
for i in 1 2 3; do
  "${KUBECTL[@]}" create -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: candidate-$i, namespace: demo}
spec: {containers: [{name: main, image: busybox}]}
EOF
done
candidates for-life
nth_leader for-life 1
say "$LEADER leads (fencing token $TOKEN); kube-leader status says:"
show_status for-life
followers_idle for-life
say "killing the leader: SIGKILL $LEADER's kube-leader, and delete Pod $LEADER"
t_kill=$(now_ms)
kill -KILL "${CANDIDATE_PID[for-life-$LEADER]}"
"${KUBECTL[@]}" delete pod "$LEADER" --wait=false >/dev/null
old=$LEADER
nth_leader for-life 2
say "$LEADER took over $(( STARTED_MS - t_kill )) ms after the kill (fencing token $TOKEN):"
say "takeover (for-life, Pod objects): $(( STARTED_MS - t_kill )) ms from the leader's kill to $LEADER's COMMAND"
say "the garbage collector deleted $old's lock with its Pod. With no kubelet, nothing but the"
say "lock's liveness heartbeat proves that the killed leader's COMMAND is gone: $LEADER waited"
say "for it to lapse (--liveness 5s, the default, + --grace 1s + a 2 s kill margin)"
sleep 0.5
followers_idle for-life

step "Lease: 3 candidates, lock demo-lease (lease 4s, renew deadline 3s, retry 500ms)"
candidates lease
nth_leader lease 1
say "$LEADER leads (fencing token $TOKEN); kube-leader status says (after its first renewal,"
say "which stores the token in the Lease for readers):"
sleep 0.6
show_status lease
say "crash: SIGKILL $LEADER's kube-leader (its supervisor stops its COMMAND; the lease must expire)"
t_kill=$(now_ms)
kill -KILL "${CANDIDATE_PID[lease-$LEADER]}"
nth_leader lease 2
say "$LEADER took over $(( STARTED_MS - t_kill )) ms after the crash (fencing token $TOKEN)"
say "takeover (lease crash, Pod objects): $(( STARTED_MS - t_kill )) ms from the leader's kill to $LEADER's COMMAND"
say "graceful stop: SIGTERM $LEADER's kube-leader (COMMAND stops, then the lease is released)"
t_kill=$(now_ms)
kill -TERM "${CANDIDATE_PID[lease-$LEADER]}"
nth_leader lease 3
say "$LEADER took over $(( STARTED_MS - t_kill )) ms after the SIGTERM (fencing token $TOKEN)"
say "takeover (lease, Pod objects): $(( STARTED_MS - t_kill )) ms from the leader's SIGTERM to $LEADER's COMMAND"
sleep 0.5
followers_idle lease
