#!/usr/bin/env bash
# The kernel tables that issues 3 (decode) and 5 (verify) ask for, at this checkout's kernels, with
# SGLang's kernels timed in the same process (but `mma`, ours only), in one device call per part
# (step limits add up to at most 530 s, inside one call's 600 s), so a session spends one warm
# call per part instead of writing its own script. The limits are estimates: a step that runs past
# its own loses only itself.
#
#   usage (from the repository root, on the device under on_device.sh):
#     bash benchmarks/device/issue_tables.sh decode|verify|late|targets|mma COMMIT
#
#   decode  bench_decode --refcheck: GDN and Mamba-2 at batch 1, 8, 64, 256, 512 (peers), then GDN
#           with a bf16 read copy at 64, 256, 512 (peers) and with an fp8 one (ours only)
#   verify  bench_verify --refcheck (its default flush rule, the served late one): GDN and Mamba-2
#           at T = 4, 8, batch 64, 256, 512 (peers), then GDN at T = 4, batch 256 with a bf16 read
#           copy (peers) and an fp8 one (ours only)
#   late    the verify's late flush rule against the early one at batch 256 with an fp8 copy, ours
#           only, late then early: GDN at T = 4, 8, Mamba-2 at T = 4 (on its ring T rows longer);
#           then each family's late run again with SGLang's peers (snapshot verify, decode step)
#           (benchmarks/notes/verify.md)
#   targets issue 5's three target rows first, at the served (late) rule with SGLang's peers in the
#           same process, batch 256: GDN T = 4, 8 and Mamba-2 T = 4 with an fp8 read copy, then the
#           same with a bf16 copy (GDN) and no copy (Mamba-2)
#   mma     the Mamba-2 verify's read_mma (non-flush outputs from the read copy on tensor cores)
#           against the FMA outputs, batch 256, ours only: per copy (bf16, fp8) the default launch
#           at T = 4, 8 (read_mma and flush_split by the rule), then each T with read_mma off,
#           in one launch (at T = 4 kq_dot off too: the launch without a copy);
#           benchmarks/notes/verify.md
#
# Each step has its own time limit and is followed by a tarball of everything so far
# ($OUT/PART.tgz: each run's results.md / .json / .png), so a step that runs long loses only itself;
# the tables' rows for our kernels are also printed. COMMIT is recorded in every result (the
# device's git metadata may be stale: pass this machine's `git rev-parse --short HEAD`).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 2 ] || { [ "$1" != decode ] && [ "$1" != verify ] && [ "$1" != late ] &&
  [ "$1" != targets ] && [ "$1" != mma ]; }; then
  echo "usage: issue_tables.sh decode|verify|late|targets|mma COMMIT" >&2
  exit 2
fi
part=$1
commit=$2
res=/tmp/issue_tables/$part
mkdir -p "$res"
status=0

step() {  # step NAME SECONDS ARGS...: one benchmark run into $res/NAME, then the tarball
  local name=$1 limit=$2
  shift 2
  echo "=== issue_tables $part: $name" >&2
  timeout "$limit" python3 -m "$@" --commit "$commit" --out "$res/$name" || status=1
  grep -E "ours" "$res/$name/results.md" 2>/dev/null | head -16
  tar czf "${OUT:-/tmp}/$part.tgz" -C /tmp/issue_tables "$part"
}

if [ "$part" = decode ]; then
  step gdn 160 benchmarks.bench_decode --family gdn --batch 1,8,64,256,512 --refcheck
  step mamba2 160 benchmarks.bench_decode --family mamba2 --batch 1,8,64,256,512 --refcheck
  step gdn_bf16 120 benchmarks.bench_decode --family gdn --batch 64,256,512 --refcheck --read-dtype bf16
  step gdn_fp8 80 benchmarks.bench_decode --family gdn --batch 64,256,512 --refcheck --read-dtype fp8 --skip-peers
elif [ "$part" = late ]; then
  step gdn_late_fp8 80 benchmarks.bench_verify --family gdn --T 4,8 --batch 256 --refcheck --skip-peers --read-dtype fp8
  step gdn_early_fp8 60 benchmarks.bench_verify --family gdn --T 4,8 --batch 256 --refcheck --skip-peers --read-dtype fp8 --flush-rule early
  step mamba2_late_fp8 70 benchmarks.bench_verify --family mamba2 --T 4 --batch 256 --refcheck --skip-peers --read-dtype fp8
  step mamba2_early_fp8 50 benchmarks.bench_verify --family mamba2 --T 4 --batch 256 --refcheck --skip-peers --read-dtype fp8 --flush-rule early
  step gdn_peers 120 benchmarks.bench_verify --family gdn --T 4,8 --batch 256 --refcheck --read-dtype fp8
  step mamba2_peers 120 benchmarks.bench_verify --family mamba2 --T 4 --batch 256 --refcheck --read-dtype fp8
elif [ "$part" = targets ]; then
  step gdn_fp8 120 benchmarks.bench_verify --family gdn --T 4,8 --batch 256 --refcheck --read-dtype fp8
  step mamba2_fp8 120 benchmarks.bench_verify --family mamba2 --T 4 --batch 256 --refcheck --read-dtype fp8
  step gdn_bf16 120 benchmarks.bench_verify --family gdn --T 4,8 --batch 256 --refcheck --read-dtype bf16
  step mamba2 120 benchmarks.bench_verify --family mamba2 --T 4 --batch 256 --refcheck
elif [ "$part" = mma ]; then
  m2="benchmarks.bench_verify --family mamba2 --batch 256 --refcheck --skip-peers"
  one=flush_split=0,flush_kq_dot=0  # one launch: without read_mma there is no flush split
  step mamba2_bf16 70 $m2 --T 4,8 --read-dtype bf16
  step mamba2_bf16_t4_fma 50 $m2 --T 4 --read-dtype bf16 --mamba2-verify-launch read_mma=0,kq_dot=0,$one
  step mamba2_bf16_t8_fma 50 $m2 --T 8 --read-dtype bf16 --mamba2-verify-launch read_mma=0,$one
  step mamba2_fp8 70 $m2 --T 4,8 --read-dtype fp8
  step mamba2_fp8_t8_fma 50 $m2 --T 8 --read-dtype fp8 --mamba2-verify-launch read_mma=0,$one
  step mamba2_fp8_t4_fma 50 $m2 --T 4 --read-dtype fp8 --mamba2-verify-launch read_mma=0,kq_dot=0,$one
else
  step gdn 190 benchmarks.bench_verify --family gdn --T 4,8 --batch 64,256,512 --refcheck
  step mamba2 190 benchmarks.bench_verify --family mamba2 --T 4,8 --batch 64,256,512 --refcheck
  step gdn_bf16 90 benchmarks.bench_verify --family gdn --T 4 --batch 256 --refcheck --read-dtype bf16
  step gdn_fp8 60 benchmarks.bench_verify --family gdn --T 4 --batch 256 --refcheck --read-dtype fp8 --skip-peers
fi
exit $status
