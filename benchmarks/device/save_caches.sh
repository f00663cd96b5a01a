#!/usr/bin/env bash
# Write $OUT/home-cache.tar.xz: this machine's Triton and FlashInfer JIT caches (~/.triton/cache,
# ~/.cache/flashinfer, whichever exist), relative to $HOME, for on_device.sh to unpack on a later
# cold machine (copy the file into .device/ here and carry .device). End a device call with it:
#     ...; bash benchmarks/device/save_caches.sh
# Prints the archive's size; skips the archive (exit 0) when no cache exists or it would not fit
# the carry beside the SGLang payload (64 MiB in all, CAP_MIB, default 12).
set -euo pipefail
: "${OUT:?set by the device tool}"
cd "$HOME"
dirs=()
for d in .triton/cache .cache/flashinfer; do [ -d "$d" ] && dirs+=("$d"); done
[ ${#dirs[@]} -eq 0 ] && { echo "save_caches: no cache here"; exit 0; }
tar cJf "$OUT/home-cache.tar.xz" "${dirs[@]}"
size=$(stat -c %s "$OUT/home-cache.tar.xz")
echo "save_caches: ${dirs[*]} -> home-cache.tar.xz, $((size / 1048576)) MiB"
if [ "$size" -gt $(( ${CAP_MIB:-12} * 1048576 )) ]; then
  rm -f "$OUT/home-cache.tar.xz"
  echo "save_caches: over ${CAP_MIB:-12} MiB, not kept (the payload needs the rest of the carry)"
fi
