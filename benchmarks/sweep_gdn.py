"""Sweep launch variants of the GDN ReplaySSM decode kernel on one GPU (one process).

Times every variant at each batch over all L phases (cold L2, CUDA-graph replay, as
``bench_decode``), with SGLang's packed decode and built-in ReplaySSM kernel as peers, and checks
each variant against the plain-torch reference and the default one-launch kernel on a mixed batch
(24 rows: every phase kind, full-ring and forced flushes, a padding row): outputs vs the reference,
and bit for bit vs the default the flushed checkpoints, every ring tensor and the flush rows'
outputs (``flush_out_bits_eq_fused``).  Prints one table per batch last; writes JSON to ``--out``.

    python -m benchmarks.sweep_gdn --batch 256,1,64 --out /tmp/sweep

Variants (``gdn_replay_decode_fwd`` keyword arguments; notes in benchmarks/notes/gdn_decode.md):

* ``fused_32x1``: the default launch.
* ``tree16`` / ``tree8``: the flush rows' fold in tree form (``fold=16`` / ``8``: SGLang's
  reduction tree written out, 16 / 8 rows on lanes, ``_tree.flush_tree``); same bits.
* ``nf8`` (``nonflush=8``), ``tree16_nf8`` / ``_nf16`` / ``_nf4``: the non-flush rows' sums laid
  out rows-on-lanes (``_tree.nonflush_rows``; outputs and ``u`` equal up to summation order,
  checkpoints and raw records bit-identical), alone or with ``tree16``; ``_r8``: records in
  chunks of 8.
* ``split_b16`` / ``split_tree8_b16`` / ``_nf8``: two launches: the fold launch at 16 rows per
  program (default fold: 168 registers; tree form: 157, instead of 255) and the non-flush launch at
  32 rows x 1 warp (default code or ``nonflush=8``).
* ``fused_32x1_r4`` / ``_r8``: the default with the non-flush rows' records read in chunks of 4 /
  8 instead of 16 (the first record's cost).
* ``foldonly*`` / ``outonly*``: one launch of the split alone (the other rows exit at once):
  diagnostics, not checked.
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
    "tree16": dict(split=False, fold=16),
    "tree8": dict(split=False, fold=8),
    "nf8": dict(split=False, nonflush=8),
    "tree16_nf8": dict(split=False, fold=16, nonflush=8),
    "tree16_nf16": dict(split=False, fold=16, nonflush=16),
    "tree16_nf4": dict(split=False, fold=16, nonflush=4),
    "tree16_nf8_r8": dict(split=False, fold=16, nonflush=8, block_r=8),
    "split_b16": dict(split=True, block_v=16, out_block_v=32, out_num_warps=1),
    "split_tree8_b16": dict(split=True, block_v=16, fold=8, out_block_v=32, out_num_warps=1),
    "split_tree8_b16_nf8": dict(split=True, block_v=16, fold=8, out_block_v=32, out_num_warps=1,
                                nonflush=8),
    "fused_32x1_r4": dict(split=False, block_r=4),
    "fused_32x1_r8": dict(split=False, block_r=8),
    "foldonly": dict(split="fold"),
    "foldonly_tree16": dict(split="fold", fold=16),
    "foldonly_tree8_b16": dict(split="fold", block_v=16, fold=8),
    "outonly_nf8": dict(split="out", out_block_v=32, out_num_warps=1, nonflush=8),
}
DEFAULT_VARIANTS = ("fused_32x1", "tree16", "tree8", "nf8", "tree16_nf8", "tree16_nf16",
                    "tree16_nf4", "tree16_nf8_r8", "split_tree8_b16_nf8", "fused_32x1_r8",
                    "foldonly", "foldonly_tree16")  # fmt: skip


def _int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    import torch

    from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode_fwd
    from replayssm_kernels.gdn_decode.reference import gdn_replay_decode_ref

    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=_int_list, default=[256], help="comma list, e.g. 256,1,64")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--skip-peers", action="store_true", help="no SGLang kernels (CPU smoke runs)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    batches = ",".join(str(b) for b in a.batch)
    cfg = bd.parse_args(["--family", "gdn", "--batch", batches, "--out", str(a.out)]
                        + (["--skip-peers"] if a.skip_peers else []))
    cuda = cfg.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def replayable(fn):
        # a CUDA graph of one launch; on CPU (TRITON_INTERPRET=1 smoke runs) the call itself
        return bd.capture_graph(fn).replay if cuda else fn

    peers, perr = bd.load_peers(cfg)
    timer = bd.Timer(cfg)
    copy = bd.measure_copy_bandwidth(cfg)
    fns = {n: functools.partial(gdn_replay_decode_fwd, **VARIANTS[n]) for n in names}
    res: dict = {"copy_bw": copy["bytes_per_s"], "peer_errors": perr, "variants": VARIANTS,
                 "checks": {}, "batches": {}}  # fmt: skip

    # correctness on a mixed batch: vs the reference (outputs) and vs the default (bits)
    fam = bd.GDNFamily(cfg, {"gdn": None}, peers)
    args0, _, _ = fam.refcheck_args(rows=24, slots=40)

    def run_on(fn):
        a2 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in args0.items()}
        fam.refcheck_call(fn, a2)
        sync()
        return a2

    ref = run_on(gdn_replay_decode_ref)
    fused = run_on(functools.partial(gdn_replay_decode_fwd, split=False))
    live = args0["slot_idx"] >= 0
    fl = live & args0["flush"]
    for n in names:
        if n.startswith(("foldonly", "outonly")):
            continue
        got = run_on(fns[n])
        o, r = got["out"][live].float(), ref["out"][live].float()
        rel = ((o - r).norm() / r.norm()).item()
        st_bits = torch.equal(got["state"].view(torch.int32), fused["state"].view(torch.int32))
        fo_bits = torch.equal(got["out"][fl].view(torch.int16), fused["out"][fl].view(torch.int16))
        ring_eq = {k: torch.equal(got[k], fused[k]) for k in fam.ring_names}
        res["checks"][n] = dict(
            out_rel_vs_ref=rel, finite=bool(torch.isfinite(o).all()), state_bits_eq_fused=st_bits,
            flush_out_bits_eq_fused=fo_bits, ring_eq_fused=ring_eq, flush_rows=int(fl.sum()))
        print(f"[check] {n}: out rel {rel:.2e} state bits == fused: {st_bits} flush outputs "
              f"bits == fused: {fo_bits} ({int(fl.sum())} rows) rings == fused: {ring_eq}",
              flush=True)

    warm = 5 if cuda else 0

    def time_case(case):
        run = replayable(case.fn)
        ph = []
        for w in range(cfg.L):
            case.set_phase(w)
            samples = []
            for _ in range(a.passes):
                samples += timer.measure(run, a.repeats, warm)
            ph.append(statistics.median(samples))
        case.set_mixed()
        samples = []
        for _ in range(a.passes):
            samples += timer.measure(run, a.repeats, warm)
        return ph, statistics.median(samples)

    tables = {}
    for batch in a.batch:
        rows, out_b = [], {}
        for n in names:
            fam = bd.GDNFamily(cfg, {"gdn": fns[n]}, {})
            case = [c for c in fam.cases(batch) if c.key == "ours"][0]
            ph, mixed = time_case(case)
            out_b[n] = dict(phase_us=ph, mixed_us=mixed)
            rows.append((n, ph, mixed))
            print(f"[time b{batch}] {n}: " + " ".join(f"{x:.1f}" for x in ph)
                  + f" | mixed {mixed:.1f}", flush=True)
            del fam, case
            if cuda:
                torch.cuda.empty_cache()
        fam = bd.GDNFamily(cfg, {"gdn": None}, peers)
        for case in fam.cases(batch):
            if case.key == "packed":
                run = replayable(case.fn)
                s = []
                for _ in range(a.passes):
                    s += timer.measure(run, a.repeats, warm)
                out_b["packed_us"] = statistics.median(s)
                rows.append(("sglang_packed", [out_b["packed_us"]] * cfg.L, out_b["packed_us"]))
            elif case.key == "builtin":
                ph, mixed = time_case(case)
                out_b["builtin"] = dict(phase_us=ph, mixed_us=mixed)
                rows.append(("sglang_builtin", ph, mixed))
                print(f"[time b{batch}] builtin: " + " ".join(f"{x:.1f}" for x in ph), flush=True)
        del fam
        if cuda:
            torch.cuda.empty_cache()
        res["batches"][str(batch)] = out_b
        tables[batch] = rows
        (a.out / "sweep.json").write_text(json.dumps(res, indent=1))

    print(f"\ncopy BW {copy['bytes_per_s'] / 1e12:.2f} TB/s; L {cfg.L}")
    for batch, rows in tables.items():
        packed = res["batches"][str(batch)].get("packed_us")
        print(f"\nbatch {batch}")
        print(f"{'variant':<20} {'mean':>7} {'w0':>7} {'w1-14':>7} {'flush':>7} {'mixed':>7}"
              f" {'x packed':>8}")
        for n, ph, mixed in rows:
            L = len(ph)
            mean = sum(ph) / L
            xp = f"{packed / mean:8.2f}" if packed else f"{'-':>8}"
            mid = sum(ph[1:-1]) / (L - 2) if L > 2 else float("nan")
            print(f"{n:<20} {mean:7.1f} {ph[0]:7.1f} {mid:7.1f} {ph[-1]:7.1f} {mixed:7.1f} {xp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
