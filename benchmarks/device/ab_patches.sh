#!/usr/bin/env bash
# Run one benchmark command on this checkout's kernels and on copies of them with patches applied,
# one after another in the same call (same machine, same warm caches), for an A/B of untimed
# kernel experiments kept as patch files (how the sixteenth session timed three GDN patches:
# benchmarks/RESULTS.md).
#
#   usage (from the repository root, on the device under on_device.sh):
#     bash benchmarks/device/ab_patches.sh OUT_DIR VARIANT... -- COMMAND [ARG ...]
#
#   VARIANT   NAME=PATCH[+PATCH...]   (patch paths absolute or relative to the repository root); the
#             unpatched checkout always runs first as "base".
#   COMMAND   a command that takes --out DIR and --commit ID (bench_verify, bench_decode);
#             each variant gets --out OUT_DIR/NAME and --commit <HEAD>+NAME appended.
#
# The patches are applied (git apply, or GNU patch where git is missing) to copies of kernels/ and
# tests/ in a temporary folder, and that kernels/ copy is imported as replayssm_kernels ahead of
# the installed package (PYTHONPATH; checked before each run), so the checkout is never modified;
# a patch that does not apply stops the script before anything runs. The commit id recorded is
# $AB_COMMIT if set (a copy of the tree without .git), else git's HEAD, else "unknown".
# Example (one device call):
#   bash benchmarks/device/on_device.sh bash benchmarks/device/ab_patches.sh $OUT/ab \
#     a=benchmarks/notes/a.patch b=benchmarks/notes/b.patch both=benchmarks/notes/a.patch+benchmarks/notes/b.patch \
#     -- python3 -m benchmarks.bench_verify --family gdn --T 4,8 --batch 1,64,256 --refcheck
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 3 ]; then
  echo "usage: ab_patches.sh OUT_DIR VARIANT... -- COMMAND [ARG ...]" >&2
  exit 2
fi
out=$1
shift

apply_patch() {  # git apply where git exists (the device image may lack it), else GNU patch
  if command -v git >/dev/null; then
    git apply "$1"
  elif command -v patch >/dev/null; then
    patch -s -p1 --forward --no-backup-if-mismatch < "$1"
  else
    echo "ab_patches.sh: neither git nor patch on this machine" >&2
    return 1
  fi
}

names=(base)
dirs=("")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  name=${1%%=*}
  patches=${1#*=}
  if [ -z "$name" ] || [ "$name" = "$1" ] || [ -z "$patches" ]; then
    echo "ab_patches.sh: expected NAME=PATCH[+PATCH...], got '$1'" >&2
    exit 2
  fi
  mkdir -p "$work/$name/src" "$work/$name/path"
  cp -r kernels tests "$work/$name/src/"
  IFS=+ read -r -a plist <<< "$patches"
  for p in "${plist[@]}"; do
    case "$p" in /*) ;; *) p="$PWD/$p" ;; esac
    (cd "$work/$name/src" && apply_patch "$p") || {
      echo "ab_patches.sh: $p does not apply to this checkout's kernels/" >&2
      exit 1
    }
  done
  ln -s "$work/$name/src/kernels" "$work/$name/path/replayssm_kernels"
  names+=("$name")
  dirs+=("$work/$name/path")
  shift
done
if [ $# -lt 2 ] || [ "$1" != "--" ]; then
  echo "ab_patches.sh: expected '-- COMMAND ...' after the variants" >&2
  exit 2
fi
shift
head=${AB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
status=0
for i in "${!names[@]}"; do
  name=${names[$i]}
  echo "=== ab_patches: $name" >&2
  if [ -n "${dirs[$i]}" ]; then
    got=$(PYTHONPATH="${dirs[$i]}${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
      "import replayssm_kernels, os; print(os.path.realpath(replayssm_kernels.__file__))")
    case "$got" in
      "$work/$name/src/"*) ;;
      *) echo "ab_patches.sh: $name imports replayssm_kernels from $got, not its copy" >&2
         exit 1 ;;
    esac
    PYTHONPATH="${dirs[$i]}${PYTHONPATH:+:$PYTHONPATH}" "$@" --out "$out/$name" \
      --commit "$head+$name" || status=$?
  else
    "$@" --out "$out/$name" --commit "$head" || status=$?
  fi
done
exit "$status"
