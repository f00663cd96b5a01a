#!/usr/bin/env bash
# Build, or reuse, the SGLang GPU payload that on_device.sh unpacks on the lent H200.
#
#   usage: bash benchmarks/device/payload.sh        # prints the archive's path
#
# The archive (~50 MiB: SGLang 0.5.17 stripped for sm90, FlashInfer 0.6.15.post1, SGLang's small
# dependencies; see the builder's header) lives in the git-ignored .device/ of this checkout. An
# existing archive that passes `xz -t` is reused; otherwise it is built (a few minutes, needs the
# package index) by build-sglang-payload.sh from $SHARED_DEVICE (default: ../shared/device beside
# the checkout), into a temporary name first so that an interrupted build is never taken for one.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# Extra wheels beyond the builder's list: `sglang.bench_serving` imports `datasets` at start-up
# (through its MMMU loader), and the H200 image has neither it nor `multiprocess`. SGLang's EAGLE v2
# worker (STANDALONE speculative decoding) imports the DSA attention backend, which imports `deep_gemm`,
# when it captures the draft's CUDA graphs, whatever the model.
extras=(datasets==5.2.0 multiprocess==0.70.19 sgl-deep-gemm==0.1.5.post1)
archive="$repo/.device/sgl517-bench.tar.xz"
if [ -s "$archive" ] && xz -t "$archive" 2>/dev/null; then
  echo "$archive"
  exit 0
fi
builder="${SHARED_DEVICE:-$repo/../shared/device}/build-sglang-payload.sh"
if [ ! -f "$builder" ]; then
  echo "payload.sh: $builder not found; set SHARED_DEVICE to the folder holding build-sglang-payload.sh" >&2
  exit 1
fi
mkdir -p "$repo/.device"
bash "$builder" "$archive.partial" "${extras[@]}" >&2
mv "$archive.partial" "$archive"
echo "$archive"
