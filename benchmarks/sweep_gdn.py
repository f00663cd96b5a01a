"""Time the GDN ReplaySSM decode kernel beside SGLang's GDN decode kernels on one GPU (one process).

Times our default launch (``gdn_replay_decode_fwd``) at each batch over all L phases (cold L2,
CUDA-graph replay, as ``bench_decode``) and on a mixed batch, with SGLang's packed decode and its
built-in ReplaySSM kernel as peers, and checks ours against the plain-torch reference on a mixed
batch (24 rows: every phase kind, full-ring and forced flushes, a padding row).  Prints one table
per batch last (cycle mean, w0, w1-14, flush, mixed, x packed); writes JSON to ``--out``.

    python -m benchmarks.sweep_gdn --batch 256,64,1 --out /tmp/sweep

The launch variants this script compared (tree-form fold 16 / 8 rows on lanes, non-flush rows on
4 / 8 / 16 lanes, the split launch, record chunks of 4 / 8, the per-record fold) were measured on
the H200 at 42bdf52; the winner became the default and the others were deleted
(``benchmarks/notes/gdn_decode.md``, "Result").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks import bench_decode as bd

OURS = "ours_default"


def _int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    import torch

    from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode_fwd
    from replayssm_kernels.gdn_decode.reference import gdn_replay_decode_ref

    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=_int_list, default=[256], help="comma list, e.g. 256,1,64")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--skip-peers", action="store_true", help="no SGLang kernels (CPU smoke runs)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    batches = ",".join(str(b) for b in a.batch)
    cfg = bd.parse_args(["--family", "gdn", "--batch", batches, "--out", str(a.out)]
                        + (["--skip-peers"] if a.skip_peers else []))
    cuda = cfg.device == "cuda"
    if not cuda:  # the interpreter's casts as the GPU's (RTNE), SGLang's kernels runnable on CPU
        from benchmarks import _cpu_shims

        _cpu_shims.apply(sglang=not a.skip_peers)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def replayable(fn):
        # a CUDA graph of one launch; on CPU (TRITON_INTERPRET=1 smoke runs) the call itself
        return bd.capture_graph(fn).replay if cuda else fn

    peers, perr = bd.load_peers(cfg)
    timer = bd.Timer(cfg)
    copy = bd.measure_copy_bandwidth(cfg)
    res: dict = {"copy_bw": copy["bytes_per_s"], "peer_errors": perr, "checks": {},
                 "batches": {}}  # fmt: skip

    # correctness on a mixed batch: vs the reference (outputs, flushed checkpoints)
    fam = bd.GDNFamily(cfg, {"gdn": None}, peers)
    args0, _, _ = fam.refcheck_args(rows=24, slots=40)

    def run_on(fn):
        a2 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in args0.items()}
        fam.refcheck_call(fn, a2)
        sync()
        return a2

    ref = run_on(gdn_replay_decode_ref)
    got = run_on(gdn_replay_decode_fwd)
    live = args0["slot_idx"] >= 0
    fl = live & args0["flush"]

    def rel(x, y):
        x, y = x.double(), y.double()
        return ((x - y).norm() / y.norm()).item()

    out_rel = rel(got["out"][live], ref["out"][live])
    st_rel = rel(got["state"], ref["state"])
    rings = {k: rel(got[k], ref[k]) for k in fam.ring_names}
    res["checks"][OURS] = dict(
        out_rel_vs_ref=out_rel, state_rel_vs_ref=st_rel, rings_rel_vs_ref=rings,
        finite=bool(torch.isfinite(got["out"][live]).all()), flush_rows=int(fl.sum()))
    print(f"[check] {OURS}: out rel {out_rel:.2e}, state rel {st_rel:.2e} ({int(fl.sum())} flush "
          "rows), rings rel " + " ".join(f"{k} {v:.1e}" for k, v in rings.items()), flush=True)

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
        fam = bd.GDNFamily(cfg, {"gdn": gdn_replay_decode_fwd}, {})
        case = [c for c in fam.cases(batch) if c.key == "ours"][0]
        ph, mixed = time_case(case)
        out_b[OURS] = dict(phase_us=ph, mixed_us=mixed)
        rows.append((OURS, ph, mixed))
        print(f"[time b{batch}] {OURS}: " + " ".join(f"{x:.1f}" for x in ph)
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
