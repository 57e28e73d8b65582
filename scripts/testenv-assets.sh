#!/usr/bin/env bash
# Prints a directory holding etcd, kube-apiserver, kube-controller-manager and kubectl, usable as
# KUBEBUILDER_ASSETS (the envtest convention), plus what the real-node tests need (kubelet,
# kube-scheduler and, for current releases, containerd, runc and the CNI loopback plugin), for
# the Kubernetes release the tests run against:
#
# - KUBEBUILDER_ASSETS, if it is set and holds the control-plane binaries: used as is;
# - else KUBE_LEADER_KUBERNETES (default 1.37.2, the release the test command runs):
#     1.20.2                 Debian's source package, built with its vendored tree
#                            (scripts/debian-assets.sh; the legacy release, out of kube 5's range);
#     a release pinned under tools/k8s/ (1.37.2, 1.34.4): built from Go modules
#                            (scripts/k8s-assets.sh VERSION).
#
# Built once and cached under ${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/assets/VERSION;
# idempotent. Progress goes to stderr; stdout is only the directory.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'testenv-assets: %s\n' "$*" >&2; }

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  complete=1
  for b in etcd kube-apiserver kube-controller-manager kubectl; do
    [ -x "$KUBEBUILDER_ASSETS/$b" ] || complete=0
  done
  if [ "$complete" = 1 ]; then
    log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks a control-plane binary; building the release instead"
fi

version=${KUBE_LEADER_KUBERNETES:-1.37.2}
version=${version#v}
case "$version" in
  1.20.2) exec env -u KUBEBUILDER_ASSETS ./scripts/debian-assets.sh ;;
  *) exec ./scripts/k8s-assets.sh "$version" ;;
esac
