"""Sweep launch variants of the GDN ReplaySSM decode kernel on one GPU (one process).

Times every variant at one batch over all L phases (cold L2, CUDA-graph replay, as
``bench_decode``), with SGLang's packed decode and built-in ReplaySSM kernel as peers, and checks
each variant against the plain-torch reference and the one-launch kernel (checkpoint bits) on a
mixed batch.  Prints a table last; writes JSON to ``--out``.

    python -m benchmarks.sweep_gdn --batch 256 --out /tmp/sweep
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

from benchmarks import bench_decode as bd

VARIANTS = {
    "fused_32x1": dict(split=False),
    "split_o32x4": dict(split=True, out_block_v=32, out_num_warps=4),
    "split_o32x8": dict(split=True, out_block_v=32, out_num_warps=8),
    "split_o64x4": dict(split=True, out_block_v=64, out_num_warps=4),
    "split_o64x8": dict(split=True, out_block_v=64, out_num_warps=8),
    "split_o128x8": dict(split=True, out_block_v=128, out_num_warps=8),
    "split_o128x16": dict(split=True, out_block_v=128, out_num_warps=16),
    "outonly_o32x4": dict(split="out", out_block_v=32, out_num_warps=4),
    "foldonly": dict(split="fold"),
}


def main(argv=None) -> int:
    import torch

    from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode_fwd
    from replayssm_kernels.gdn_decode.reference import gdn_replay_decode_ref

    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = bd.parse_args(["--family", "gdn", "--batch", str(a.batch), "--out", str(a.out)])
    peers, perr = bd.load_peers(cfg)
    timer = bd.Timer(cfg)
    copy = bd.measure_copy_bandwidth(cfg)
    names = a.variants.split(",")
    fns = {n: functools.partial(gdn_replay_decode_fwd, **VARIANTS[n]) for n in names}
    res: dict = {"copy_bw": copy["bytes_per_s"], "peer_errors": perr, "variants": {}}

    # correctness on a mixed batch: vs the reference (outputs) and vs the fused kernel (bits)
    fam = bd.GDNFamily(cfg, {"gdn": None}, peers)
    args0, _, _ = fam.refcheck_args(rows=24, slots=40)
    def run_on(fn):
        a2 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in args0.items()}
        fam.refcheck_call(fn, a2)
        torch.cuda.synchronize()
        return a2
    ref = run_on(gdn_replay_decode_ref)
    fused = run_on(functools.partial(gdn_replay_decode_fwd, split=False))
    live = args0["slot_idx"] >= 0
    for n in names:
        if n in ("outonly_o32x4", "foldonly"):
            continue
        got = run_on(fns[n])
        o, r = got["out"][live].float(), ref["out"][live].float()
        rel = ((o - r).norm() / r.norm()).item()
        st_bits = torch.equal(got["state"].view(torch.int32), fused["state"].view(torch.int32))
        ring_eq = {k: torch.equal(got[k], fused[k]) for k in fam.ring_names}
        res["variants"].setdefault(n, {})["check"] = dict(
            out_rel_vs_ref=rel, finite=bool(torch.isfinite(o).all()), state_bits_eq_fused=st_bits,
            ring_eq_fused=ring_eq)
        print(f"[check] {n}: out rel {rel:.2e} state bits == fused: {st_bits} rings == fused: "
              f"{ring_eq}", flush=True)

    def time_case(case):
        g = bd.capture_graph(case.fn)
        ph = []
        for w in range(cfg.L):
            case.set_phase(w)
            samples = []
            for _ in range(a.passes):
                samples += timer.measure(g.replay, a.repeats, 5)
            ph.append(statistics.median(samples))
        case.set_mixed()
        samples = []
        for _ in range(a.passes):
            samples += timer.measure(g.replay, a.repeats, 5)
        return ph, statistics.median(samples)

    rows = []
    for n in names:
        fam = bd.GDNFamily(cfg, {"gdn": fns[n]}, {})
        case = [c for c in fam.cases(a.batch) if c.key == "ours"][0]
        ph, mixed = time_case(case)
        res["variants"].setdefault(n, {}).update(phase_us=ph, mixed_us=mixed)
        rows.append((n, ph, mixed))
        print(f"[time] {n}: " + " ".join(f"{x:.1f}" for x in ph) + f" | mixed {mixed:.1f}",
              flush=True)
    fam = bd.GDNFamily(cfg, {"gdn": None}, peers)
    for case in fam.cases(a.batch):
        if case.key == "packed":
            g = bd.capture_graph(case.fn)
            s = []
            for _ in range(a.passes):
                s += timer.measure(g.replay, a.repeats, 5)
            res["packed_us"] = statistics.median(s)
            rows.append(("sglang_packed", [res["packed_us"]] * cfg.L, res["packed_us"]))
        elif case.key == "builtin":
            ph, mixed = time_case(case)
            res["builtin"] = dict(phase_us=ph, mixed_us=mixed)
            rows.append(("sglang_builtin", ph, mixed))
            print("[time] builtin: " + " ".join(f"{x:.1f}" for x in ph), flush=True)
    (a.out / "sweep.json").write_text(json.dumps(res, indent=1))
    print(f"\ncopy BW {copy['bytes_per_s'] / 1e12:.2f} TB/s; batch {a.batch}, L {cfg.L}")
    print(f"{'variant':<16} {'mean':>7} {'w0':>7} {'w1-14':>7} {'flush':>7} {'mixed':>7}")
    for n, ph, mixed in rows:
        L = len(ph)
        print(f"{n:<16} {sum(ph) / L:7.1f} {ph[0]:7.1f} {sum(ph[1:-1]) / (L - 2):7.1f} "
              f"{ph[-1]:7.1f} {mixed:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
