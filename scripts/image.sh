#!/usr/bin/env bash
# Builds container images offline, without any registry: docker-archive tarballs loadable by
# containerd (`ctr images import`), docker and podman (`load`) and kind (`kind load
# image-archive`).
#
#   scripts/image.sh [kube-leader] [--arch amd64|arm64] [--binary FILE] [--no-load]
#       The kube-leader image, localhost/kube-leader:<version> (the image of deploy/): the
#       Dockerfile's `prebuilt` stage, built with buildah (daemonless, no base image: FROM
#       scratch) from the static binary of scripts/static.sh (or FILE, which must be static):
#       /usr/local/bin/kube-leader and nothing else, user 65532. --arch arm64 builds the arm64
#       image (cross-compiled; not loaded on an amd64 machine).
#   scripts/image.sh app [--no-load]
#       An image that knows nothing of kube-leader, the stand-in for a user's program in the
#       real-node tests of deploy/patterns: busybox, and /usr/local/bin/app, a shell loop that
#       prints "app: started as $POD_NAME" and "app: stopping as $POD_NAME" on SIGTERM.
#   scripts/image.sh busybox [--no-load]
#       The stand-in for the public app image that deploy/base names, busybox:1.36 (its full
#       reference docker.io/library/busybox:1.36): no registry here, so this machine's
#       busybox-static (Debian's, 1.35) with a link per applet, user 65532. The demo and the
#       real-node test of deploy/ as shipped load it under that name.
#   scripts/image.sh copy-from [--binary FILE] [--no-load]
#       deploy/patterns/copy-from/Dockerfile built with buildah: the app image above with
#       kube-leader copied in (`COPY --from=` the kube-leader image).
#   scripts/image.sh pause [--no-load]
#       The Pod sandbox ("pause") image, built with `gcc -static` from build/pause/linux/pause.c
#       of the Kubernetes source tree that scripts/testenv-assets.sh unpacks.
#   scripts/image.sh node-test --binary FILE [--no-load]
#       The real-node tests' image: FILE (stripped, with its libraries), busybox, dash as `sh`
#       and the instrumented test workload (scripts/images/workload.c) as `sleep`, so deploy/'s
#       sample COMMAND `sh -c '...; exec sleep infinity'` writes start/stop records.
#   scripts/image.sh go-candidate [--binary FILE] [--no-load]
#       The client-go candidate (tools/go-candidate, the static binary scripts/go-candidate.sh
#       builds, or FILE) as /usr/local/bin/kube-leader-go-candidate, with busybox, user 65532:
#       the real-node tests run it in deploy/'s Deployment shape beside kube-leader.
#
# Prints `<image reference> <archive path>` on stdout; everything else goes to stderr.
# Archives are cached by content: ${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/images/, named by
# the SHA-256 of their layer (or buildah's image ID); app, pause, node-test and go-candidate
# images carry its first 12 hex digits in their tag, so an image that changed never hides behind
# an old one with the same name. buildah keeps its storage in .../kube-leader/buildah.
#
# Loading: into containerd when one is reachable at $CONTAINERD_ADDRESS (default
# /run/containerd/containerd.sock), namespace k8s.io (the kubelet's). --no-load skips it.
# Needs: gcc, libc6-dev, busybox-static, buildah, musl-tools, gcc-aarch64-linux-gnu
# (scripts/node-deps.sh installs them), GNU tar, sha256sum.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

KIND=kube-leader
case "${1:-}" in
  kube-leader|app|busybox|copy-from|pause|node-test|go-candidate) KIND=$1; shift ;;
esac
BINARY=""
LOAD=1
ARCH=amd64
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) BINARY=${2:?--binary needs a file}; shift 2 ;;
    --arch)
      case "${2:-}" in
        amd64 | arm64) ARCH=$2 ;;
        *) die "--arch takes amd64 or arm64, not '${2:-}'" ;;
      esac
      shift 2 ;;
    --no-load) LOAD=0; shift ;;
    -h|--help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

# The first `version = "..."` line (sed quits there itself: no `| head` under pipefail).
VERSION=$(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader"
IMAGES="$CACHE/images"
mkdir -p "$IMAGES"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kube-leader-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$WORK/rootfs"
mkdir -p "$ROOTFS"

for tool in gcc tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing (run scripts/node-deps.sh)"
done

# --- rootfs helpers -------------------------------------------------------------------------
# Copies FILE to the same path in the rootfs, following symlinks.
add_file() {
  mkdir -p "$ROOTFS$(dirname "$1")"
  cp -L "$1" "$ROOTFS$1"
}
# Copies the shared libraries (and the loader) that `ldd` lists for an executable.
add_libraries() {
  local lib
  # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)"
  for lib in $(ldd "$1" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p'); do
    [ -e "$ROOTFS$lib" ] || add_file "$lib"
  done
}
# busybox as /bin/busybox with a link per applet in /bin, except the ones named.
add_busybox() {
  [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 \
    || die "busybox is missing (run scripts/node-deps.sh: package busybox-static)"
  local busybox_type
  busybox_type=$(file -L /bin/busybox) || die "file -L /bin/busybox failed"
  [[ $busybox_type != *'dynamically linked'* ]] || die "/bin/busybox is dynamically linked: install busybox-static"
  mkdir -p "$ROOTFS/bin"
  cp /bin/busybox "$ROOTFS/bin/busybox"
  local applet skip
  for applet in $(/bin/busybox --list); do
    for skip in "$@"; do [ "$applet" = "$skip" ] && continue 2; done
    [ -e "$ROOTFS/bin/$applet" ] || ln -s busybox "$ROOTFS/bin/$applet"
  done
}
add_base() {
  mkdir -p "$ROOTFS/etc" "$ROOTFS/tmp" "$ROOTFS/usr/local/bin"
  chmod 1777 "$ROOTFS/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n' >"$ROOTFS/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$ROOTFS/etc/group"
}
add_kube_leader() { # FILE
  [ -x "$1" ] || die "no kube-leader binary at $1"
  # Debug builds carry hundreds of MB of debug information; the image needs none of it.
  strip -o "$ROOTFS/usr/local/bin/kube-leader" "$1" 2>/dev/null || cp "$1" "$ROOTFS/usr/local/bin/kube-leader"
  chmod 0755 "$ROOTFS/usr/local/bin/kube-leader"
  add_libraries "$1"
}

# --- the archive ----------------------------------------------------------------------------
# write_archive NAME TAG-PREFIX CONFIG-JSON [REF]: the layer from the rootfs, then the archive.
# The tag is TAG-PREFIX, with "-<12 hex of the layer digest>" appended if TAG-PREFIX ends in "-";
# REF, if given, is the image's whole reference instead of localhost/NAME:TAG.
write_archive() {
  local name=$1 tag=$2 config=$3 ref_override=${4:-}
  # Reproducible layer: sorted, owned by root, fixed times; same content, same digest.
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
    -C "$ROOTFS" -cf "$WORK/layer.tar" .
  local diff_id
  diff_id=$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1)
  case "$tag" in *-|"") tag="$tag${diff_id:0:12}" ;; esac
  local ref="${ref_override:-localhost/$name:$tag}"
  local archive="$IMAGES/$name-${diff_id:0:12}.tar"
  if [ ! -s "$archive" ]; then
    mkdir -p "$WORK/archive/$diff_id"
    mv "$WORK/layer.tar" "$WORK/archive/$diff_id/layer.tar"
    printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"kube-leader scripts/image.sh %s"}]}' \
      "$(host_arch)" "$config" "$diff_id" "$KIND" >"$WORK/config.json"
    local config_digest
    config_digest=$(sha256sum "$WORK/config.json" | cut -d' ' -f1)
    mv "$WORK/config.json" "$WORK/archive/$config_digest.json"
    printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
      "$config_digest" "$ref" "$diff_id" >"$WORK/archive/manifest.json"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
      -C "$WORK/archive" -cf "$archive.tmp" .
    mv "$archive.tmp" "$archive"
    log "wrote $archive ($(( $(stat -c %s "$archive") / 1024 )) KiB)"
    # Keep the three newest archives of this image; the content hash names the rest.
    ls -t "$IMAGES/$name"-????????????.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  else
    log "cached $archive"
  fi
  load "$ref" "$archive"
  printf '%s %s\n' "$ref" "$archive"
}

load() { # REF ARCHIVE
  [ "$LOAD" = 1 ] || return 0
  local address=${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}
  if [ -S "$address" ] && command -v ctr >/dev/null; then
    ctr --address "$address" -n k8s.io images import "$2" >&2
    log "loaded $1 into containerd at $address (namespace k8s.io)"
  else
    log "no containerd at $address: not loaded. To load it:"
    log "  containerd: ctr -n k8s.io images import $2"
    log "  docker:     docker load -i $2"
    log "  podman:     podman load -i $2"
    log "  kind:       kind load image-archive $2"
  fi
}

# --- buildah ----------------------------------------------------------------------------------
# Private storage (vfs: no overlay mounts needed), never a registry: every FROM is local.
BUILDAH_DIR="$CACHE/buildah"
bah() {
  command -v buildah >/dev/null || die "buildah is missing (run scripts/node-deps.sh)"
  buildah --root "$BUILDAH_DIR/storage" --runroot "$BUILDAH_DIR/run" --storage-driver vfs "$@"
}
# bah_build NAME TAG REF-IN-ARCHIVE BUILD-ARGS...: builds, then writes (or reuses) the archive
# named by the image ID (buildah --timestamp 0: the same inputs give the same ID), loads it.
# A REF ending in "-" gets the first 12 hex digits of the image ID appended.
bah_build() {
  local name=$1 tag=$2 ref=$3
  shift 3
  bah build --quiet --timestamp 0 --pull=never --iidfile "$WORK/iid" -t "localhost/$name:$tag" "$@" >&2
  local id
  id=$(sed 's/^sha256://' "$WORK/iid")
  case "$ref" in *-) ref="$ref${id:0:12}" ;; esac
  local archive="$IMAGES/$name-$ARCH-${id:0:12}.tar"
  if [ ! -s "$archive" ]; then
    rm -f "$archive.tmp"
    bah push --quiet "localhost/$name:$tag" "docker-archive:$archive.tmp:$ref" >&2
    mv "$archive.tmp" "$archive"
    log "wrote $archive ($(( $(stat -c %s "$archive") / 1024 )) KiB)"
    ls -t "$IMAGES/$name-$ARCH"-????????????.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  else
    log "cached $archive"
  fi
  if [ "$ARCH" = "$(host_arch)" ]; then load "$ref" "$archive"; else log "$ARCH image: not loaded on $(host_arch)"; fi
  printf '%s %s\n' "$ref" "$archive"
}
host_arch() {
  case "$(uname -m)" in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) uname -m ;; esac
}
# The kube-leader image in buildah's storage as localhost/kube-leader:VERSION-ARCH; prints
# `<ref> <archive>`.
kube_leader_image() {
  if [ -z "$BINARY" ]; then
    BINARY=$(scripts/static.sh "$ARCH")
  fi
  [ -x "$BINARY" ] || die "no kube-leader binary at $BINARY"
  # `file`'s answer read whole, then tested (no `| grep -q`: see scripts/check-scripts.sh).
  local bin_type
  bin_type=$(file -L "$BINARY") || die "file -L $BINARY failed"
  [[ $bin_type == *'statically linked'* || $bin_type == *'static-pie linked'* ]] \
    || die "$BINARY is not statically linked (build it with scripts/static.sh; the image has no libc)"
  local ctx="$WORK/context"
  mkdir -p "$ctx/dist/$ARCH"
  cp "$BINARY" "$ctx/dist/$ARCH/kube-leader"
  cp Dockerfile "$ctx/Dockerfile"
  bah_build kube-leader "$VERSION-$ARCH" "localhost/kube-leader:$VERSION" \
    --target prebuilt --platform "linux/$ARCH" --build-arg DIST=dist -f "$ctx/Dockerfile" "$ctx"
}

USER_CONFIG='"User":"65532:65532","Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"WorkingDir":"/"'

case "$KIND" in
  kube-leader)
    kube_leader_image
    ;;
  app)
    add_base
    add_busybox
    install -m 0755 scripts/images/app.sh "$ROOTFS/usr/local/bin/app"
    write_archive kube-leader-test-app "" "{$USER_CONFIG,\"Entrypoint\":[\"/usr/local/bin/app\"]}"
    ;;
  busybox)
    add_base
    add_busybox
    write_archive busybox 1.36 "{$USER_CONFIG,\"Cmd\":[\"sh\"]}" docker.io/library/busybox:1.36
    ;;
  copy-from)
    [ "$ARCH" = amd64 ] || die "copy-from builds for amd64 only (the app image is this machine's busybox)"
    read -r _ _ < <(LOAD=0 kube_leader_image)
    read -r app_ref app_archive < <(LOAD=0 "$0" app --no-load)
    # The app image into buildah's storage, under its own name (the pattern's FROM).
    bah pull --quiet "docker-archive:$app_archive" >&2
    bah_build kube-leader-copy-from "$VERSION" "localhost/kube-leader-copy-from:$VERSION-" \
      --build-arg "KUBE_LEADER_IMAGE=localhost/kube-leader:$VERSION-$ARCH" \
      --build-arg "APP_IMAGE=$app_ref" \
      -f deploy/patterns/copy-from/Dockerfile deploy/patterns/copy-from
    ;;
  pause)
    # scripts/k8s-assets.sh puts the release's pause.c into its assets directory; the node passes it.
    PAUSE_C="${KUBE_LEADER_PAUSE_C:-$CACHE/build/1.20.2/build/pause/linux/pause.c}"
    [ -f "$PAUSE_C" ] || die "$PAUSE_C is missing: run scripts/testenv-assets.sh (it unpacks the Kubernetes source)"
    gcc -static -O2 -DVERSION=kube-leader -o "$ROOTFS/pause" "$PAUSE_C"
    strip "$ROOTFS/pause"
    write_archive kube-leader-pause "" '{"User":"65535:65535","Entrypoint":["/pause"],"WorkingDir":"/"}'
    ;;
  node-test)
    [ -n "$BINARY" ] || die "node-test needs --binary FILE (the kube-leader binary to test)"
    add_base
    add_busybox sh sleep
    add_kube_leader "$BINARY"
    add_file /bin/dash
    add_libraries /bin/dash
    ln -s dash "$ROOTFS/bin/sh"
    gcc -static -O2 -Wall -o "$ROOTFS/usr/local/bin/sleep" scripts/images/workload.c
    strip "$ROOTFS/usr/local/bin/sleep"
    write_archive kube-leader-node-test "" "{$USER_CONFIG,\"Entrypoint\":[\"/usr/local/bin/kube-leader\"]}"
    ;;
  go-candidate)
    if [ -z "$BINARY" ]; then
      BINARY=$(scripts/go-candidate.sh)
    fi
    [ -x "$BINARY" ] || die "no client-go candidate binary at $BINARY"
    bin_type=$(file -L "$BINARY") || die "file -L $BINARY failed"
    [[ $bin_type == *'statically linked'* ]] \
      || die "$BINARY is not statically linked (scripts/go-candidate.sh builds it with CGO_ENABLED=0)"
    add_base
    add_busybox
    cp "$BINARY" "$ROOTFS/usr/local/bin/kube-leader-go-candidate"
    chmod 0755 "$ROOTFS/usr/local/bin/kube-leader-go-candidate"
    write_archive kube-leader-go-candidate "" "{$USER_CONFIG,\"Entrypoint\":[\"/usr/local/bin/kube-leader-go-candidate\"]}"
    ;;
esac
