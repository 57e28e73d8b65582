#!/usr/bin/env bash
# Checks a kube-leader image archive (docker-archive, as scripts/image.sh writes it):
#
#   scripts/check-image.sh ARCHIVE amd64|arm64
#
# - its config says linux/<arch>, user 65532:65532, entry point /usr/local/bin/kube-leader;
# - it has one layer holding exactly usr/local/bin/kube-leader (FROM scratch: no shell, no libc);
# - that binary is a static ELF executable of <arch> (e_machine 62 x86-64, 183 AArch64).
# Prints the image's figures (archive size, binary size); exits 1 naming what is wrong.
set -euo pipefail
archive=${1:?usage: check-image.sh ARCHIVE amd64|arm64}
arch=${2:?usage: check-image.sh ARCHIVE amd64|arm64}
case "$arch" in amd64) machine=62 ;; arm64) machine=183 ;; *) echo "unknown arch $arch" >&2; exit 2 ;; esac
fail() { echo "check-image: $archive: $*" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kube-leader-check-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xf "$archive" -C "$work"
python3 - "$work" "$arch" <<'PY' || fail "config or layers"
import json, sys, os
work, arch = sys.argv[1], sys.argv[2]
manifest = json.load(open(os.path.join(work, "manifest.json")))
assert len(manifest) == 1, "one image"
config = json.load(open(os.path.join(work, manifest[0]["Config"])))
problems = []
if (config.get("os"), config.get("architecture")) != ("linux", arch):
    problems.append(f"platform {config.get('os')}/{config.get('architecture')}, expected linux/{arch}")
c = config.get("config", {})
if c.get("User") != "65532:65532":
    problems.append(f"user {c.get('User')!r}, expected 65532:65532")
if c.get("Entrypoint") != ["/usr/local/bin/kube-leader"]:
    problems.append(f"entry point {c.get('Entrypoint')!r}")
if len(manifest[0]["Layers"]) != 1:
    problems.append(f"{len(manifest[0]['Layers'])} layers, expected 1 (FROM scratch, one COPY)")
for p in problems:
    print("check-image:", p, file=sys.stderr)
sys.exit(1 if problems else 0)
PY
layer=$(python3 -c 'import json,sys,os; m=json.load(open(os.path.join(sys.argv[1],"manifest.json"))); print(os.path.join(sys.argv[1], m[0]["Layers"][0]))' "$work")
files=$(tar -tf "$layer" | sed 's|^\./||; s|/$||' | grep -v '^$' | sort | tr '\n' ' ')
[ "$files" = "usr usr/local usr/local/bin usr/local/bin/kube-leader " ] \
  || fail "the layer holds more than usr/local/bin/kube-leader: $files"
mkdir -p "$work/root"
tar -xf "$layer" -C "$work/root"
bin="$work/root/usr/local/bin/kube-leader"
got=$(od -An -t u2 -j 18 -N 2 "$bin" | tr -d ' ')
[ "$got" = "$machine" ] || fail "ELF machine $got, expected $machine ($arch)"
# The program headers read whole, then searched (no `| grep -q`: see scripts/check-scripts.sh).
headers=$(readelf -lW "$bin") || fail "readelf -lW failed on the binary"
if grep -q 'Requesting program interpreter' <<<"$headers"; then
  fail "the binary is dynamically linked"
fi
echo "image linux/$arch: $(( $(stat -c %s "$archive") / 1024 )) KiB archive, binary $(stat -c %s "$bin") bytes, static, ELF machine $got, user 65532, one layer"
