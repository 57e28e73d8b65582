#!/usr/bin/env bash
# The legacy release, Kubernetes 1.20.2 (`KUBE_LEADER_KUBERNETES=1.20.2 scripts/testenv-assets.sh`
# calls this; the test command runs 1.37.2 by default).
#
# Prints a directory holding etcd, kube-apiserver, kube-controller-manager and kubectl,
# usable as KUBEBUILDER_ASSETS (the envtest convention), plus kubelet and kube-scheduler for
# the real-node tests (one `make` builds all four Kubernetes binaries, sharing the packages).
#
# - If KUBEBUILDER_ASSETS is set and holds all the binaries, it is used as is.
# - Otherwise the binaries are built once from Debian's `kubernetes` source package
#   (v1.20.2, with Debian's Go) and cached under
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/assets/<version>.
#
# Idempotent: a second run prints the cached directory within seconds. All progress goes to
# stderr; stdout is only the directory.
set -euo pipefail

K8S_VERSION="1.20.2"
ORIG_TARBALL="kubernetes_1.20.5+really1.20.2.orig.tar.gz"
ORIG_SHA256="b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc"
BINARIES=(etcd kube-apiserver kube-controller-manager kubectl)
# Built into the cache too; a KUBEBUILDER_ASSETS without them still serves the control-plane
# tests (the real-node tests then say they are skipped and why).
NODE_BINARIES=(kubelet kube-scheduler)
K8S_TARGETS="cmd/kube-apiserver cmd/kube-controller-manager cmd/kubelet cmd/kube-scheduler"

log() { printf 'debian-assets: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

complete_dir() {
  local d="$1" b
  [ -n "$d" ] && [ -d "$d" ] || return 1
  for b in "${BINARIES[@]}"; do [ -x "$d/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && complete_dir "$KUBEBUILDER_ASSETS"; then
  log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  printf '%s\n' "$KUBEBUILDER_ASSETS"
  exit 0
fi

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader"
ASSETS="$CACHE_ROOT/assets/$K8S_VERSION"
cache_complete() {
  local b
  complete_dir "$1" || return 1
  for b in "${NODE_BINARIES[@]}"; do [ -x "$1/$b" ] || return 1; done
}

if cache_complete "$ASSETS"; then
  log "using cached $ASSETS"
  printf '%s\n' "$ASSETS"
  exit 0
fi

# One builder at a time (parallel test binaries or a second shell).
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.assets.lock"
flock 9
if cache_complete "$ASSETS"; then
  printf '%s\n' "$ASSETS"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# --- packages ------------------------------------------------------------------------------
need_pkgs=()
# Debian's Go 1.19 (bookworm's own toolchain for this package), called by its own path: whatever
# `go` is first on PATH (Go 1.26 on the polyglot machines) is not used, so the build never
# switches toolchains silently.
GO=/usr/lib/go-1.19/bin/go
[ -x "$GO" ] || need_pkgs+=(golang-1.19-go)
command -v rsync >/dev/null 2>&1 || need_pkgs+=(rsync)
command -v jq >/dev/null 2>&1 || need_pkgs+=(jq)
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need_pkgs+=(etcd-server)
command -v kubectl >/dev/null 2>&1 || need_pkgs+=(kubernetes-client)
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v dpkg-source >/dev/null 2>&1 || need_pkgs+=(dpkg-dev)

SRC_LIST=/etc/apt/sources.list.d/kube-leader-src.sources
apt_updated=0
ensure_deb_src() {
  if [ ! -f "$SRC_LIST" ]; then
    [ -f /etc/apt/sources.list.d/debian.sources ] || die "no /etc/apt/sources.list.d/debian.sources to derive a deb-src entry from"
    log "adding a deb-src entry derived from the machine's apt source"
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources | $SUDO tee "$SRC_LIST" >/dev/null
    apt_updated=0
  fi
  if [ "$apt_updated" = 0 ]; then
    $SUDO apt-get update -qq >&2
    apt_updated=1
  fi
}

if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing: ${need_pkgs[*]}"
  ensure_deb_src
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >&2
fi

go_version=$("$GO" version) || die "$GO version failed"
[[ $go_version == *" go1.19"* ]] || die "$GO is not Go 1.19: $go_version"
log "using $go_version"
ETCD=$(command -v etcd || echo /usr/bin/etcd)
KUBECTL=$(command -v kubectl)

# --- source --------------------------------------------------------------------------------
SRC_CACHE="$CACHE_ROOT/src"
mkdir -p "$SRC_CACHE"
if [ ! -f "$SRC_CACHE/$ORIG_TARBALL" ] || ! echo "$ORIG_SHA256  $SRC_CACHE/$ORIG_TARBALL" | sha256sum -c --status; then
  ensure_deb_src
  log "downloading Debian's kubernetes source package"
  rm -f "$SRC_CACHE/$ORIG_TARBALL"
  (cd "$SRC_CACHE" && apt-get source --download-only kubernetes >&2)
  [ -f "$SRC_CACHE/$ORIG_TARBALL" ] || die "apt-get source did not produce $ORIG_TARBALL (Debian's kubernetes version changed?)"
fi
echo "$ORIG_SHA256  $SRC_CACHE/$ORIG_TARBALL" | sha256sum -c --status \
  || die "sha256 of $ORIG_TARBALL does not match $ORIG_SHA256"

BUILD="$CACHE_ROOT/build/$K8S_VERSION"
if [ ! -f "$BUILD/.unpacked" ]; then
  log "unpacking into $BUILD"
  rm -rf "$BUILD"
  mkdir -p "$BUILD"
  tar -xzf "$SRC_CACHE/$ORIG_TARBALL" -C "$BUILD" --strip-components=1
  touch "$BUILD/.unpacked"
fi

# --- build ---------------------------------------------------------------------------------
build_k8s() {
  (
    cd "$BUILD"
    mkdir -p .go/src/k8s.io .home
    [ -e .go/src/k8s.io/kubernetes ] || ln -s ../../.. .go/src/k8s.io/kubernetes
    export GOPATH="$BUILD/.go" CGO_ENABLED=0 HOME="$BUILD/.home" GO111MODULE=off GOFLAGS=-mod=vendor
    PATH="$(dirname "$GO"):$PATH"
    export PATH
    cd .go/src/k8s.io/kubernetes
    make WHAT="$K8S_TARGETS" >&2
  )
}
# The Go build is silent for many minutes: say every minute that it is still going.
with_progress() {
  local what="$1"; shift
  local t0 ticker rc=0
  t0=$(date +%s)
  ( while sleep 60; do log "$what: still building, $(( $(date +%s) - t0 ))s so far"; done ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$rc"
}
built_all() {
  local b
  for b in kube-apiserver kube-controller-manager "${NODE_BINARIES[@]}"; do
    [ -x "$BUILD/_output/bin/$b" ] || return 1
  done
}
if ! built_all; then
  log "building kube-apiserver, kube-controller-manager, kubelet and kube-scheduler (one make; 25-30 minutes on 2 cores on a cold machine)"
  start=$(date +%s)
  if ! with_progress "kubernetes" build_k8s; then
    log "first build failed; cleaning _output and retrying once"
    rm -rf "$BUILD/_output"
    with_progress "kubernetes (retry)" build_k8s || die "building Kubernetes failed (see the output above)"
  fi
  log "built in $(( $(date +%s) - start ))s"
fi

mkdir -p "$ASSETS.tmp"
cp "$BUILD/_output/bin/kube-apiserver" "$BUILD/_output/bin/kube-controller-manager" \
  "$BUILD/_output/bin/kubelet" "$BUILD/_output/bin/kube-scheduler" "$ASSETS.tmp/"
ln -sf "$ETCD" "$ASSETS.tmp/etcd"
ln -sf "$KUBECTL" "$ASSETS.tmp/kubectl"
rm -rf "$ASSETS"
mv "$ASSETS.tmp" "$ASSETS"
cache_complete "$ASSETS" || die "assets directory $ASSETS is incomplete after the build"
log "assets ready in $ASSETS"
printf '%s\n' "$ASSETS"
