#!/usr/bin/env bash
# The GDN decode's tiles-per-program sweep (benchmarks/notes/gdn_decode.md, "A program over
# several of a head's value tiles"): GPU tests of the launch first, then bench_decode at the
# default launch and at each variant, one after another in one call; everything under OUT_DIR,
# then one tarball of it (and the compile caches, save_caches.sh, for the next cold machine) in $OUT.
#
#   usage (one device call, from the repository root):
#     bash benchmarks/device/on_device.sh bash benchmarks/device/sweep_gdn_decode_tiles.sh [VARIANT ...]
#
#   VARIANT   a --gdn-decode-launch value, e.g. tiles=2 or tiles=4,nonflush_rows=8, or "base" (the
#             default launch: tiles by batch size, flush rows first from FLUSH_FIRST_MIN_BATCH);
#             a "+ff" suffix adds --row-order flush-first (every batch), "+bo" --row-order batch.
#             Default: tiles=1+bo tiles=2+bo tiles=4+bo tiles=1+ff tiles=2+ff tiles=4+ff; "base"
#             always runs first.
# Environment: COMMIT (recorded as the commit id; default git's HEAD), BATCH (default 1,64,256),
# PEERS=1 (time SGLang's kernels too in every variant's process: the ratios; default skipped),
# OUT (the device tool's output folder).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set by the device tool}"
work=/tmp/gdn_tiles && rm -rf "$work" && mkdir -p "$work"
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(tiles=1+bo tiles=2+bo tiles=4+bo tiles=1+ff tiles=2+ff tiles=4+ff)
status=0
peers=(--skip-peers)
[ "${PEERS:-0}" = 1 ] && peers=()
python3 -m pytest -q -m gpu tests/kernels/test_gdn_decode.py -k "program_tiles or tiles2 or tiles4" \
  > "$work/gpu_tests.log" 2>&1 || status=1
tail -n 3 "$work/gpu_tests.log"
for v in base "${variants[@]}"; do
  name=${v//[=,+]/_}
  launch=()
  case $v in
    *+ff) launch=(--row-order flush-first); v=${v%+ff};;
    *+bo) launch=(--row-order batch); v=${v%+bo};;
  esac
  [ "$v" = base ] || launch+=(--gdn-decode-launch "$v")
  python3 -m benchmarks.bench_decode --family gdn --batch "${BATCH:-1,64,256}" "${peers[@]}" \
    --refcheck --commit "$commit" "${launch[@]}" --out "$work/$name" > "$work/$name.log" 2>&1 \
    || { status=1; echo "bench_decode $v failed (log: $name.log)"; }
  grep -h "replayssm" "$work/$name/results.md" 2>/dev/null | head -n 20
done
tar czf "$OUT/gdn_tiles.tgz" -C "$work" .
bash benchmarks/device/save_caches.sh || true
exit $status
