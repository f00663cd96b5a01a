"""Launch-variant sweep for the Mamba-2 ReplaySSM decode kernel (one GPU call, several variants).

    python -m benchmarks.sweep_mamba2 --batch 256 [--variants A,B,...] [--out DIR]

Per variant: a refcheck on fresh data (bench_decode.refcheck_family: vs the torch reference, every
untouched byte checked) plus the flushed checkpoint compared bitwise with the kernel at its default
launch_config (itself checked bitwise against SGLang by the gpu tests); then the median time of a
CUDA-graph replay at every ring phase w = 0..L-1 (cold L2, as bench_decode), the cycle mean, and
SGLang's selective_state_update in the same process. Prints a table last.

The first kernel's row (``v1``, a frozen copy of the previous decode kernel, since deleted) is
recorded in benchmarks/notes/mamba2_decode.md and notes/mamba2_decode_sweep1.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from benchmarks import bench_decode as bd
import replayssm_kernels.mamba2_decode.kernel as k
from replayssm_kernels import mamba2_replay_decode_ref

VARIANTS = {
    # name: LaunchConfig fields (block_p, block_l, fold_unroll, num_warps, s_prefetch, pf_l1, pipe)
    "A": (16, 16, 4, 4, 2, True, 0),
    "B": (16, 16, 4, 8, 2, True, 0),
    "C": (16, 16, 4, 4, 1, True, 0),
    "D": (16, 16, 4, 4, 1, True, 3),
    "E": (16, 16, 4, 4, 1, True, 4),
    "F": (16, 16, 4, 8, 1, True, 3),
    "G": (16, 16, 4, 4, 2, False, 0),
    "H": (16, 16, 8, 8, 2, True, 0),
    # round 2: register caps (ptxas maxnreg) for more CTAs per SM
    "C96": (16, 16, 4, 4, 1, True, 0, 96),
    "C80": (16, 16, 4, 4, 1, True, 0, 80),
    "C64": (16, 16, 4, 4, 1, True, 0, 64),
    "A96": (16, 16, 4, 4, 2, True, 0, 96),
    "A80": (16, 16, 4, 4, 2, True, 0, 80),
    "D80": (16, 16, 4, 4, 1, True, 3, 80),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-ssu", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cfg = bd.parse_args(["--family", "mamba2", "--batch", str(a.batch), "--window", "16",
                         "--state-dtype", "fp32", "--out", "/tmp/sweep_unused"])
    peers, _ = bd.load_peers(cfg)
    timer = bd.Timer(cfg)
    L = cfg.L
    results = {}

    def make_fam(fn):
        fam = bd.Mamba2Family(cfg, {"mamba2": fn}, {} if a.no_ssu else {"ssu": peers.get("ssu")})
        return fam

    orig_lc = k.launch_config
    entries = [(n, VARIANTS[n]) for n in a.variants.split(",") if n]

    def call_default(args):
        # The bitwise baseline: the kernel at its default launch configuration.
        k.launch_config = orig_lc
        try:
            fam.refcheck_call(k.mamba2_replay_decode, args)
        finally:
            k.launch_config = variant_lc

    fam = make_fam(None)
    base_ssu_done = a.no_ssu
    for name, lc in entries:
        cfgv = k.LaunchConfig(*lc)
        variant_lc = k.launch_config = lambda P, N, R, c=cfgv: c
        fn = k.mamba2_replay_decode
        row = {"config": lc}
        try:
            # correctness: refcheck vs torch reference; flush state bitwise vs the default config
            fam.kernels = {"mamba2": fn}
            rc = bd.refcheck_family(fam, fn, mamba2_replay_decode_ref)
            row["refcheck_ok"] = rc["ok"]
            row["refcheck_problems"] = rc["problems"]
            row["errors"] = rc["errors"]
            args, slot_idx, _ = fam.refcheck_args()
            a1 = {kk: v.clone() for kk, v in args.items()}
            a2 = {kk: v.clone() for kk, v in args.items()}
            call_default(a1)
            fam.refcheck_call(fn, a2)
            torch.cuda.synchronize()
            row["state_bitwise_vs_default"] = bool(torch.equal(a1["state"].view(torch.int32),
                                                               a2["state"].view(torch.int32)))
            # timing over all phases
            cases = fam.cases(a.batch)
            c_ours = cases[0]
            c_ours.set_phase(0)
            g = bd.capture_graph(c_ours.fn)
            ph = []
            for w in range(L):
                c_ours.set_phase(w)
                torch.cuda.synchronize()
                ts = timer.measure(g.replay, a.reps, 3)
                ph.append(statistics.median(ts))
            row["phases_us"] = [round(x, 1) for x in ph]
            row["cycle_mean_us"] = round(sum(ph) / L, 1)
            if not base_ssu_done and len(cases) > 1:
                gs = bd.capture_graph(cases[1].fn)
                results["ssu"] = {"us": round(statistics.median(timer.measure(gs.replay, a.reps, 3)), 1)}
                base_ssu_done = True
            del g
        except Exception as e:  # noqa: BLE001
            import traceback
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        results[name] = row
        print(name, json.dumps(row), flush=True)
    k.launch_config = orig_lc
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    ssu = results.get("ssu", {}).get("us", float("nan"))
    print(f"\nbatch {a.batch}  ssu {ssu} us")
    print(f"{'var':4} {'ok':3} {'bit':3} {'w0':>7} {'w1':>7} {'w8':>7} {'w14':>7} {'flush':>7} {'mean':>7} {'xSSU':>5}")
    for name, r in results.items():
        if name == "ssu" or "phases_us" not in r:
            if name != "ssu":
                print(name, r.get("error"))
            continue
        p = r["phases_us"]
        print(f"{name:4} {int(r['refcheck_ok']):3} {int(r['state_bitwise_vs_default']):3} {p[0]:7.1f} {p[1]:7.1f} "
              f"{p[8]:7.1f} {p[14]:7.1f} {p[15]:7.1f} {r['cycle_mean_us']:7.1f} {ssu / r['cycle_mean_us']:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
