#!/usr/bin/env bash
# Builds the statically linked sidecar binary, one file that runs on any Linux of its
# architecture (no libc, no loader): `cargo build --profile sidecar -p kube-leader-cli` for the
# musl targets.
#
#   scripts/static.sh [amd64|arm64|all ...]     (default: amd64)
#
# For each architecture: target/dist/<arch>/kube-leader (the layout the Dockerfile's `prebuilt`
# stage copies from), checked to be a static ELF executable of that architecture, its size
# printed. The path of each binary goes to stdout, one per line, in the order asked; progress and
# figures go to stderr.
#
# arm64 is cross-compiled (Rust target aarch64-unknown-linux-musl, C parts such as ring's with
# aarch64-linux-gnu-gcc, which also links); it cannot run on an amd64 machine, so it is checked,
# not run. amd64 uses musl-gcc for the C parts.
#
# Needs: rustup (adds the targets itself), musl-tools and, for arm64, gcc-aarch64-linux-gnu
# (scripts/node-deps.sh installs both). The build directories are shared between
# checkouts, so that a fresh clone builds incrementally:
# ${KUBE_LEADER_STATIC_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/target-static}
# for amd64, the same with `-arm64` appended for arm64. Two architectures build at once, each
# in its own directory (cargo builds one thing at a time in a directory): the profile's
# single codegen unit and LTO keep one build on one core.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'static: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

arches=()
for a in "${@:-amd64}"; do
  case "$a" in
    amd64 | x86_64) arches+=(amd64) ;;
    arm64 | aarch64) arches+=(arm64) ;;
    all) arches+=(amd64 arm64) ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown architecture: $a (amd64, arm64 or all)" ;;
  esac
done

target_base=${KUBE_LEADER_STATIC_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-leader/target-static}

# ELF header: e_machine is the 16-bit little-endian field at offset 18 (62 x86-64, 183 AArch64).
elf_machine() { od -An -t u2 -j 18 -N 2 "$1" | tr -d ' '; }
# A static executable has no PT_INTERP program header (no loader) and no DT_NEEDED entries.
# The headers are read whole, then searched: `readelf ... | grep -q` under pipefail could take a
# readelf killed by SIGPIPE (grep quit at its match) for a failure, and a failed readelf is an
# error here, not an answer.
is_static() {
  local headers
  if command -v readelf >/dev/null; then
    headers=$(readelf -lW -dW "$1") || die "readelf -lW -dW $1 failed"
    [[ $headers != *'Requesting program interpreter'* && $headers != *'(NEEDED)'* ]]
  else
    headers=$(file -b "$1") || die "file -b $1 failed"
    [[ $headers == *'statically linked'* || $headers == *'static-pie linked'* ]]
  fi
}

# Sets what building for architecture $1 takes: its Rust target, ELF machine, C compiler,
# linker and target directory.
spec() {
  case "$1" in
    amd64) triple=x86_64-unknown-linux-musl machine=62 cc=musl-gcc linker="" target_dir=$target_base ;;
    arm64) triple=aarch64-unknown-linux-musl machine=183 cc=aarch64-linux-gnu-gcc linker=aarch64-linux-gnu-gcc target_dir=$target_base-arm64 ;;
  esac
}

# Builds and checks one architecture's binary; its path goes to stdout.
build() {
  local arch="$1" triple machine cc linker target_dir upper lower start built got size
  spec "$arch"
  mkdir -p "$target_dir"
  upper=$(echo "$triple" | tr 'a-z-' 'A-Z_')
  lower=$(echo "$triple" | tr '-' '_')
  log "building $arch ($triple, profile sidecar) in $target_dir; a cold build takes a few minutes"
  start=$(date +%s)
  env "CC_$lower=$cc" ${linker:+"CARGO_TARGET_${upper}_LINKER=$linker"} \
    cargo build --locked --profile sidecar -p kube-leader-cli --target "$triple" \
      --target-dir "$target_dir" >&2
  built="$target_dir/$triple/sidecar/kube-leader"
  [ -x "$built" ] || die "cargo did not produce $built"
  is_static "$built" || die "$built is not statically linked"
  got=$(elf_machine "$built")
  [ "$got" = "$machine" ] || die "$built has ELF machine $got, expected $machine ($arch)"
  mkdir -p "target/dist/$arch"
  cp "$built" "target/dist/$arch/kube-leader.tmp"
  mv "target/dist/$arch/kube-leader.tmp" "target/dist/$arch/kube-leader"
  size=$(stat -c %s "target/dist/$arch/kube-leader")
  log "$arch: target/dist/$arch/kube-leader, static, ELF machine $got, $size bytes ($(( size / 1024 )) KiB), $(( $(date +%s) - start )) s"
  echo "$PWD/target/dist/$arch/kube-leader"
}

# The compilers and Rust targets first (rustup is not run twice at once).
for arch in "${arches[@]}"; do
  spec "$arch"
  command -v "$cc" >/dev/null || die "$cc is missing (run scripts/node-deps.sh)"
  # The list read whole (rustup, a Rust program, fails on a pipe closed early by `grep -q`).
  installed=$(rustup target list --installed) || die "rustup target list --installed failed"
  if ! grep -qx "$triple" <<<"$installed"; then
    log "rustup target add $triple"
    rustup target add "$triple" >&2
  fi
done

if [ "${#arches[@]}" = 1 ]; then
  build "${arches[0]}"
  exit 0
fi
# Several: built at once; their paths printed in the order asked, once all are built.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
for i in "${!arches[@]}"; do
  build "${arches[$i]}" >"$out/$i" &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
[ "$failed" = 0 ] || die "a build failed (see above)"
for i in "${!arches[@]}"; do
  cat "$out/$i"
done
