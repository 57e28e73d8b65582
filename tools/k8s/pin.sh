#!/usr/bin/env bash
# tools/k8s/pin.sh VERSION   (for example 1.34.4)
#
# Writes tools/k8s/vMAJOR.MINOR/ for a Kubernetes release: a go.mod that requires
# k8s.io/kubernetes vVERSION, replaces every staging module (the list is k8s.io/kubernetes's
# own `replace` block) with its published v0.MINOR.PATCH, requires the etcd server that this
# release itself requires, and names the commands as tools; an etcd/main.go; then
# `go mod tidy` writes go.sum. Run once per new release (it asks the Go module proxy);
# scripts/k8s-assets.sh VERSION then builds from the pins without changing them.
set -euo pipefail

log() { printf 'pin: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ $# -eq 1 ] || die "usage: $0 VERSION (for example 1.34.4)"
VERSION="${1#v}"
[[ "$VERSION" =~ ^1\.([0-9]+)\.([0-9]+)$ ]] || die "not a Kubernetes version: $1"
MINOR="${BASH_REMATCH[1]}"
PATCH="${BASH_REMATCH[2]}"
STAGING="v0.$MINOR.$PATCH"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="$HERE/v1.$MINOR"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader"
GO="$(command -v go || echo /usr/local/go/bin/go)"
export GOTOOLCHAIN=local GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build" GOFLAGS=-mod=mod

src=$(cd /tmp && "$GO" mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$src" ] || die "k8s.io/kubernetes v$VERSION: no go.mod from the module proxy"
go_line=$(grep -m1 '^go ' "$src")
godebug=$(grep -m1 '^godebug ' "$src" || true)
etcd=$(sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\).*/\1/p;T;q' "$src")
[ -n "$etcd" ] || die "k8s.io/kubernetes v$VERSION does not require go.etcd.io/etcd/server/v3"
staging=$(sed -n '/^replace (/,/^)/p' "$src" | awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}')
[ -n "$staging" ] || die "no staging modules in k8s.io/kubernetes v$VERSION's replace block"

mkdir -p "$DIR/etcd"
{
  cat <<EOF
// Kubernetes v$VERSION and the etcd it is built and tested with, pinned with go.sum.
// Written by tools/k8s/pin.sh $VERSION; built by scripts/k8s-assets.sh $VERSION; nothing imports it.
// k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
// ./staging/... in its own go.mod, which does not apply to a dependent module: every one
// is replaced here with its published $STAGING (the list is k8s.io/kubernetes's replace block).
module kube-leader.local/tools/k8s/v1.$MINOR

$go_line
${godebug}

require (
	k8s.io/kubernetes v$VERSION
	// The version k8s.io/kubernetes v$VERSION requires: etcdmain is built from it.
	go.etcd.io/etcd/server/v3 $etcd
)

tool (
	k8s.io/kubernetes/cmd/kube-apiserver
	k8s.io/kubernetes/cmd/kube-controller-manager
	k8s.io/kubernetes/cmd/kube-scheduler
	k8s.io/kubernetes/cmd/kubectl
	k8s.io/kubernetes/cmd/kubelet
)

replace (
EOF
  for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING"; done
  echo ")"
} >"$DIR/go.mod"
cat >"$DIR/etcd/main.go" <<'EOF'
// The etcd server, as the etcd release's own main does it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
rm -f "$DIR/go.sum"
(cd "$DIR" && "$GO" mod tidy) >&2
log "pinned Kubernetes v$VERSION (staging $STAGING, etcd server $etcd) in $DIR"
