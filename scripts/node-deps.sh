#!/usr/bin/env bash
# Installs what a real kubelet node needs on this machine, from Debian bookworm with apt-get,
# idempotently (a second run only checks):
#   containerd, runc                 the container runtime (started by the tests, never by systemd)
#   containernetworking-plugins      only its `loopback` CNI plugin is used (Pods use hostNetwork)
#   busybox-static                   the shell and tools of the images
#   gcc, libc6-dev                   the pause image and the test workload: static C programs
#   musl-tools, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross the static sidecar binaries
#                                    (scripts/static.sh: amd64 and a
#                                    cross-compiled arm64)
#   buildah                          the daemonless image builder that builds the Dockerfile
#                                    offline (scripts/image.sh)
#
# Without root it installs nothing and says so: the node tests then skip with one line.
# All output goes to stderr.
set -euo pipefail

log() { printf 'node-deps: %s\n' "$*" >&2; }

need=()
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/include/stdio.h ] || need+=(libc6-dev)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v musl-gcc >/dev/null 2>&1 || need+=(musl-tools)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
# The cross compiler's C library headers: only a Recommends of gcc-aarch64-linux-gnu, which
# --no-install-recommends leaves out (ring's C then fails: bits/libc-header-start.h).
[ -f /usr/aarch64-linux-gnu/include/stdio.h ] || need+=(libc6-dev-arm64-cross)
command -v buildah >/dev/null 2>&1 || need+=(buildah)

if [ ${#need[@]} -eq 0 ]; then
  log "all present"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "not root: cannot install ${need[*]} (the real-node tests will be skipped)"
  exit 0
fi

# busybox-static replaces Debian's dynamically linked `busybox` package; both provide /bin/busybox.
log "installing: ${need[*]}"
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
# The package's systemd unit is not used (no systemd here, and the tests run their own
# containerd with a private root, state and socket).
log "installed"
