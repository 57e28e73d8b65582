#!/usr/bin/env bash
# Prints the path of kube-leader-go-candidate, a client-go Lease leader-election program
# (tools/go-candidate: its own Go module, k8s.io/client-go v0.37.2 pinned with its go.sum),
# for interoperability tests and benchmarks.
#
# Built in module mode, `go build -mod=readonly -trimpath`, static (CGO_ENABLED=0), with the
# Go module and build caches that scripts/k8s-assets.sh uses (.../kube-leader/go/mod and
# .../kube-leader/go/build), and cached as
#   ${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/go-candidate/<sha256>/kube-leader-go-candidate
# where <sha256> is that of main.go, go.mod and go.sum together. -mod=readonly: the build
# never changes the pins (a missing module is downloaded into the module cache once).
#
# Needs Go 1.26.8 or later (/usr/local/go/bin/go is used if `go` is not on PATH).
#
# Idempotent: with a cached binary it prints the path immediately. All progress goes to
# stderr; stdout is only the binary's path.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$REPO_ROOT/tools/go-candidate"
NAME="kube-leader-go-candidate"

log() { printf 'go-candidate: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for f in main.go go.mod go.sum; do
  [ -f "$SRC/$f" ] || die "missing $SRC/$f"
done
key() { cat "$SRC/main.go" "$SRC/go.mod" "$SRC/go.sum" | sha256sum | cut -d' ' -f1; }
SHA=$(key)
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader"
OUT_DIR="$CACHE_ROOT/go-candidate/$SHA"
BIN="$OUT_DIR/$NAME"

if [ -x "$BIN" ]; then
  log "using cached $BIN"
  printf '%s\n' "$BIN"
  exit 0
fi

GO="$(command -v go || true)"
[ -n "$GO" ] || GO=/usr/local/go/bin/go
[ -x "$GO" ] || die "no Go toolchain (go on PATH or /usr/local/go/bin/go)"
# The same caches as scripts/k8s-assets.sh: client-go and its dependencies are mostly there.
export GOTOOLCHAIN=local GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build"
export GOFLAGS="-buildvcs=false" GO111MODULE=on CGO_ENABLED=0

# One builder at a time (parallel test binaries or a second shell).
mkdir -p "$CACHE_ROOT/go-candidate"
exec 9>"$CACHE_ROOT/go-candidate/.lock"
flock 9
if [ -x "$BIN" ]; then
  printf '%s\n' "$BIN"
  exit 0
fi

log "building $NAME (sha256 ${SHA:0:12}, $(sed -n 's/^[[:space:]]*k8s.io\/client-go \(v[^ ]*\).*/client-go \1/p' "$SRC/go.mod")) with $("$GO" version)"
start=$(date +%s)
mkdir -p "$OUT_DIR"
(
  cd "$SRC"
  "$GO" build -mod=readonly -trimpath -ldflags='-s -w' -o "$BIN.tmp" .
) >&2 || die "go build failed"
# What was built is what was hashed.
[ "$(key)" = "$SHA" ] || { rm -f "$BIN.tmp"; die "$SRC changed during the build; rerun"; }
mv "$BIN.tmp" "$BIN"
log "built $BIN in $(( $(date +%s) - start ))s"
printf '%s\n' "$BIN"
