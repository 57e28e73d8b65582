#!/usr/bin/env bash
# Prints the path of kube-leader-go-candidate, a client-go (v1.20.2) Lease leader-election
# program built from tools/go-candidate/main.go, for interoperability tests and benchmarks.
#
# The Go source is compiled in GOPATH mode inside the vendored Kubernetes source tree that
# scripts/testenv-assets.sh unpacks (no network, no Go module proxy), and cached as
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/go-candidate/<sha256 of main.go>/kube-leader-go-candidate
#
# Idempotent: with a cached binary it prints the path immediately. All progress goes to
# stderr; stdout is only the binary's path.
set -euo pipefail

K8S_VERSION="1.20.2"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN_GO="$REPO_ROOT/tools/go-candidate/main.go"
NAME="kube-leader-go-candidate"

log() { printf 'go-candidate: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ -f "$MAIN_GO" ] || die "missing $MAIN_GO"
SHA=$(sha256sum "$MAIN_GO" | cut -d' ' -f1)
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader"
OUT_DIR="$CACHE_ROOT/go-candidate/$SHA"
BIN="$OUT_DIR/$NAME"

if [ -x "$BIN" ]; then
  log "using cached $BIN"
  printf '%s\n' "$BIN"
  exit 0
fi

# The source tree. testenv-assets.sh unpacks it (and builds the control plane); it only does
# so when it has to build, hence KUBEBUILDER_ASSETS is unset for the call. If the tree is
# already unpacked, don't wait for a control-plane build that may be in progress.
BUILD="$CACHE_ROOT/build/$K8S_VERSION"
if [ ! -f "$BUILD/.unpacked" ]; then
  log "preparing the Kubernetes $K8S_VERSION source tree via testenv-assets.sh"
  env -u KUBEBUILDER_ASSETS "$REPO_ROOT/scripts/testenv-assets.sh" >/dev/null
fi
[ -f "$BUILD/.unpacked" ] && [ -d "$BUILD/vendor/k8s.io/client-go" ] \
  || die "no unpacked Kubernetes source tree at $BUILD"

GO=$(command -v go || echo /usr/lib/go/bin/go)
[ -x "$GO" ] || die "go not found"

# One builder at a time (the package directory in the tree is shared).
WORK="$CACHE_ROOT/go-candidate"
mkdir -p "$WORK"
exec 9>"$WORK/.lock"
flock 9
if [ -x "$BIN" ]; then
  printf '%s\n' "$BIN"
  exit 0
fi

mkdir -p "$BUILD/.go/src/k8s.io"
[ -e "$BUILD/.go/src/k8s.io/kubernetes" ] || ln -s ../../.. "$BUILD/.go/src/k8s.io/kubernetes"
PKG_DIR="$BUILD/cmd/$NAME"
mkdir -p "$PKG_DIR"
cp "$MAIN_GO" "$PKG_DIR/main.go.tmp"
mv "$PKG_DIR/main.go.tmp" "$PKG_DIR/main.go"
# The copy is what gets built; make sure it is what was hashed.
[ "$(sha256sum "$PKG_DIR/main.go" | cut -d' ' -f1)" = "$SHA" ] || die "$MAIN_GO changed during the build; rerun"

log "building $NAME (sha256 ${SHA:0:12}) with $("$GO" version)"
start=$(date +%s)
mkdir -p "$OUT_DIR" "$WORK/.home" "$WORK/.gocache"
(
  cd "$BUILD/.go/src/k8s.io/kubernetes"
  export GOPATH="$BUILD/.go" GO111MODULE=off GOFLAGS= CGO_ENABLED=0 \
    HOME="$WORK/.home" GOCACHE="$WORK/.gocache"
  "$GO" build -trimpath -ldflags='-s -w' -o "$BIN.tmp" "k8s.io/kubernetes/cmd/$NAME"
) >&2 || die "go build failed"
mv "$BIN.tmp" "$BIN"
log "built $BIN in $(( $(date +%s) - start ))s"
printf '%s\n' "$BIN"
