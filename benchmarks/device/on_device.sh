#!/usr/bin/env bash
# Run one command on the lent H200 with SGLang 0.5.17 and this project importable, then exit with its status.
#
#   usage (on the device machine, from the repository root):
#     bash benchmarks/device/on_device.sh COMMAND [ARG ...]
#
# The machine has Python 3.12, torch 2.11, triton 3.6 and nvcc, but no SGLang and no network. This
# unpacks .device/sgl517-bench.tar.xz (made by payload.sh; it must be carried: it is git-ignored) into
# /tmp/sgl unless the same archive is already there from an earlier command on the same warm machine,
# puts it on PYTHONPATH, installs this project offline and without dependencies (editable, so the
# `replayssm` entry point exists), selects only this plug-in (SGLANG_PLUGINS=replayssm) and runs
# COMMAND. See README.md here for the one-call pattern.
#
# Compile caches: if .device/home-cache.tar.xz was carried too (a tarball, relative to $HOME, of a
# warm machine's Triton and FlashInfer JIT caches, made at the end of an earlier call by
# `benchmarks/device/save_caches.sh` and copied into .device/ here), it is unpacked into $HOME once
# per machine, so a cold machine's first server start skips the compiles that match (SGLang's
# kernels; entries of changed sources are simply not hit).
set -euo pipefail
cd "$(dirname "$0")/../.."
archive=.device/sgl517-bench.tar.xz
if [ ! -f "$archive" ]; then
  echo "on_device.sh: $archive missing: run benchmarks/device/payload.sh first and carry .device" >&2
  exit 2
fi
export PYTHONPATH=/tmp/sgl/site${PYTHONPATH:+:$PYTHONPATH}
export SGLANG_PLUGINS=replayssm
# pytest in one process here (pyproject's `-n 2` is for the two-core CI machine; the payload may
# lack pytest-xdist): no xdist, and the ini's addopts dropped.
export PYTEST_ADDOPTS="-p no:xdist -o addopts= ${PYTEST_ADDOPTS:-}"
# Unpack and install under a lock: several on_device.sh may start at once in one call.
(
  flock 9
  sum=$(md5sum "$archive" | cut -d' ' -f1)
  if [ "$(cat /tmp/sgl/.archive-md5 2>/dev/null)" != "$sum" ]; then
    rm -rf /tmp/sgl && mkdir -p /tmp/sgl
    tar -C /tmp/sgl -xJf "$archive"
    echo "$sum" > /tmp/sgl/.archive-md5
  fi
  cache=.device/home-cache.tar.xz
  if [ -f "$cache" ] && [ ! -f "$HOME/.carried-home-cache" ]; then
    tar -C "$HOME" -xJf "$cache" && touch "$HOME/.carried-home-cache"
  fi
  if [ "$(cat /tmp/sgl/.installed-from 2>/dev/null)" != "$PWD" ]; then
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >&2
    echo "$PWD" > /tmp/sgl/.installed-from
  fi
) 9>/tmp/sgl.lock
"$@"
