#!/usr/bin/env bash
# scripts/k8s-assets.sh VERSION   (for example 1.37.2)
#
# Builds, once, a KUBEBUILDER_ASSETS directory for a current Kubernetes release from Go
# modules, and prints its path (stdout holds only that line; progress goes to stderr):
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/assets/VERSION/
#     etcd kube-apiserver kube-controller-manager kubectl     the control plane (envtest)
#     kubelet kube-scheduler                                  the real node's Kubernetes parts
#     containerd containerd-shim-runc-v2 ctr runc cni/loopback the node's runtime parts
#     pause.c                                                 the sandbox image's source
#
# Every version is pinned with its go.sum in one place, tools/k8s/:
#   tools/k8s/vMAJOR.MINOR/  k8s.io/kubernetes (and its staging modules) and etcd's server
#   tools/k8s/node/          containerd 2.x, runc, the CNI plugins (shared by every version)
# The Go build and module caches are shared too, under .../kube-leader/go/.
#
# Needs Go 1.26.8 or later (/usr/local/go/bin/go is used if `go` is not on PATH) and, for
# runc's seccomp support (the Pods use seccompProfile RuntimeDefault), cgo with
# libseccomp-dev, which is installed with apt-get when missing (as root).
#
# Idempotent: a complete directory is printed at once. Kubernetes 1.20.2 (Debian's source,
# Debian's node packages) stays with scripts/testenv-assets.sh.
set -euo pipefail

log() { printf 'k8s-assets: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ $# -eq 1 ] || die "usage: $0 VERSION (for example 1.37.2)"
VERSION="${1#v}"
[[ "$VERSION" =~ ^1\.([0-9]+)\.[0-9]+$ ]] || die "not a Kubernetes version: $1"
MINOR="${BASH_REMATCH[1]}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
K8S_MODULE="$REPO/tools/k8s/v1.$MINOR"
NODE_MODULE="$REPO/tools/k8s/node"
[ -f "$K8S_MODULE/go.mod" ] || die "no pinned module $K8S_MODULE for Kubernetes $VERSION"
grep -Eq "^[[:space:]]*k8s.io/kubernetes v$VERSION([[:space:]]|$)" "$K8S_MODULE/go.mod" \
  || die "$K8S_MODULE/go.mod does not pin k8s.io/kubernetes v$VERSION"

K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd)
NODE_BINARIES=(containerd containerd-shim-runc-v2 ctr runc loopback)

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader"
ASSETS="$CACHE_ROOT/assets/$VERSION"

complete_dir() {
  local d="$1" b
  [ -d "$d" ] || return 1
  for b in "${K8S_BINARIES[@]}" containerd containerd-shim-runc-v2 ctr runc cni/loopback; do
    [ -x "$d/$b" ] || return 1
  done
  [ -f "$d/pause.c" ]
}

if complete_dir "$ASSETS"; then
  log "using cached $ASSETS"
  printf '%s\n' "$ASSETS"
  exit 0
fi

# One builder at a time per version (parallel test binaries or a second shell).
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.k8s-assets-$VERSION.lock"
flock 9
if complete_dir "$ASSETS"; then
  printf '%s\n' "$ASSETS"
  exit 0
fi

# --- tools ---------------------------------------------------------------------------------
GO="$(command -v go || true)"
[ -n "$GO" ] || GO=/usr/local/go/bin/go
[ -x "$GO" ] || die "no Go toolchain (go on PATH or /usr/local/go/bin/go)"
export GOTOOLCHAIN=local GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build"
# The pinned go.mod and go.sum are complete: nothing may change them during a build.
export GOFLAGS="-mod=readonly -buildvcs=false"
log "using $("$GO" version)"

seccomp_dev() { [ -f /usr/include/seccomp.h ] && command -v pkg-config >/dev/null 2>&1; }
if ! seccomp_dev; then
  [ "$(id -u)" = 0 ] || die "libseccomp-dev and pkg-config are missing (runc's seccomp support) and this is not root"
  log "installing libseccomp-dev and pkg-config (runc's seccomp support)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config gcc libc6-dev >&2
fi

# The Go build is silent for many minutes: say every minute that it is still going.
with_progress() {
  local what="$1"; shift
  local t0 ticker rc=0
  t0=$(date +%s)
  ( while sleep 60; do log "$what: still building, $(( $(date +%s) - t0 ))s so far"; done ) &
  ticker=$!
  "$@" >&2 || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  log "$what: $( [ "$rc" = 0 ] && echo built || echo FAILED ) in $(( $(date +%s) - t0 ))s"
  return "$rc"
}

# --- Kubernetes and etcd -------------------------------------------------------------------
# The version the binaries report (`kube-apiserver --version`, the kubelet's node status,
# the API server's /version), as the release's own build (hack/lib/version.sh) sets it.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
K8S_OUT="$CACHE_ROOT/build/k8s-$VERSION"
k8s_built() { local b; for b in "${K8S_BINARIES[@]}"; do [ -x "$K8S_OUT/$b" ] || return 1; done; }
build_k8s() {
  mkdir -p "$K8S_OUT"
  cd "$K8S_MODULE"
  CGO_ENABLED=0 "$GO" build -trimpath -ldflags="$ldflags" -o "$K8S_OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet ./etcd
}
if ! k8s_built; then
  log "building Kubernetes $VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet) and etcd from $K8S_MODULE"
  with_progress "kubernetes $VERSION" build_k8s || die "building Kubernetes $VERSION failed (see above)"
fi

# --- node runtime parts --------------------------------------------------------------------
# Keyed by the pins: a changed tools/k8s/node builds anew.
node_key=$(cat "$NODE_MODULE/go.mod" "$NODE_MODULE/go.sum" | sha256sum | cut -c1-12)
NODE_OUT="$CACHE_ROOT/build/node-$node_key"
node_built() { local b; for b in "${NODE_BINARIES[@]}"; do [ -x "$NODE_OUT/$b" ] || return 1; done; }
# The first match (sed quits there itself: no `| head` under pipefail).
containerd_version() {
  local re='^[[:space:]]*github.com/containerd/containerd/v2 \(v[^ ]*\).*'
  sed -n "\\|$re|{s||\\1|p;q;}" "$NODE_MODULE/go.mod"
}
build_node() {
  mkdir -p "$NODE_OUT"
  cd "$NODE_MODULE"
  local cver tags
  cver=$(containerd_version)
  # No btrfs, devmapper or zfs snapshotters (cgo, and unused: overlayfs is); static, as
  # containerd's own release build.
  tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs osusergo netgo static_build"
  CGO_ENABLED=0 "$GO" build -trimpath -tags "$tags" \
    -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$cver" -o "$NODE_OUT/" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr
  CGO_ENABLED=0 "$GO" build -trimpath -tags "$tags no_grpc" \
    -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$cver" -o "$NODE_OUT/" \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  CGO_ENABLED=0 "$GO" build -trimpath -ldflags="-s -w" -o "$NODE_OUT/" \
    github.com/containernetworking/plugins/plugins/main/loopback
  # runc needs cgo (its nsenter) and libseccomp for seccomp profiles; without the libpathrs
  # tag (a Rust library Debian bookworm does not ship) it uses its Go implementation.
  CGO_ENABLED=1 "$GO" build -trimpath -buildmode=pie -tags "seccomp urfave_cli_no_docs" \
    -ldflags="-s -w" -o "$NODE_OUT/" github.com/opencontainers/runc
}
if ! node_built; then
  log "building containerd $(containerd_version), runc and the CNI loopback plugin from $NODE_MODULE"
  with_progress "node parts" build_node || die "building the node parts failed (see above)"
fi

# --- the assets directory ------------------------------------------------------------------
pause_c="$GOMODCACHE/k8s.io/kubernetes@v$VERSION/build/pause/linux/pause.c"
[ -f "$pause_c" ] || die "no $pause_c in the module cache"
rm -rf "$ASSETS.tmp"
mkdir -p "$ASSETS.tmp/cni"
for b in "${K8S_BINARIES[@]}"; do cp "$K8S_OUT/$b" "$ASSETS.tmp/"; done
for b in containerd containerd-shim-runc-v2 ctr runc; do cp "$NODE_OUT/$b" "$ASSETS.tmp/"; done
cp "$NODE_OUT/loopback" "$ASSETS.tmp/cni/"
cp "$pause_c" "$ASSETS.tmp/pause.c"
chmod -R u+w "$ASSETS.tmp"
rm -rf "$ASSETS"
mv "$ASSETS.tmp" "$ASSETS"
complete_dir "$ASSETS" || die "assets directory $ASSETS is incomplete after the build"
log "assets ready in $ASSETS ($(du -sh "$ASSETS" | cut -f1))"
printf '%s\n' "$ASSETS"
