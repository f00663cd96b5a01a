"""Launch-variant sweep for the Mamba-2 ReplaySSM decode kernel (one GPU call, several variants).

    python -m benchmarks.sweep_mamba2 --batch 256,64,1 [--variants base,RF72] [--out FILE]
    python -m benchmarks.sweep_mamba2 --offline [--variants ...]   # no GPU: ptxas regs / spills

Per batch and variant: a refcheck on fresh data (bench_decode.refcheck_family: vs the torch
reference, every untouched byte checked), then the variant against the kernel's default launch
configuration on the same refcheck inputs: flushed checkpoints and appended ring records bit for
bit (``bit``), outputs as the largest relative difference (``dout``); then the median time of a
CUDA-graph replay at every ring phase w = 0..L-1 (all rows in one phase; cold L2, as
bench_decode), the cycle mean, the mixed-phase step (rows spread over all phases: ~1/L of them
flush, as in serving), and SGLang's selective_state_update in the same process. Prints one table
per batch last.

``--offline`` compiles every variant for sm_90a at the Nano-4B shape (batch 256: unsplit) with
this venv's ptxas and prints registers / spill bytes and the CTAs per SM the register count
allows (64K registers per SM). Needs no GPU.

Variants are ``LaunchConfig`` field overrides of the default ``launch_config``. The rounds before
2026-11-30 (benchmarks/notes/mamba2_decode.md) swept code paths that have since been deleted
(register-held tile prefetch, the pipeliner, the fold through shared memory, the split flush
launch); their variants are in git history (42bdf52).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

# Overrides of launch_config(P, N, R). ptxas (sm_90a, Nano-4B, unsplit) registers / spill-store
# bytes / CTAs per SM in the comments.
VARIANTS = {
    "base": {},  # the default launch (Round 3's RFw2): 2 warps, 96 / 0 / 10
    # Round 3's runner-up at batch 256 (314.3 us against 300.9): the same code with 4 warps at a
    # 72-register cap, 72 / 0 / 7. Kept to recheck the 2-warp choice on another GPU or compiler.
    "RF72": dict(num_warps=4, maxnreg=72),
    # Launches with a read copy (issue 8; run with --read-dtype): the default's 96-register cap
    # spills there (bf16 copy 20 B, fp8 92 B). In the comments: bf16 / fp8 copy.
    "RC112": dict(maxnreg=112),  # 2 warps, 112 / 0 / 9; 112 / 28 / 9
    "RC128": dict(maxnreg=128),  # 2 warps, 121 / 0 / 8; 128 / 0 / 8
    "RC4w80": dict(num_warps=4, maxnreg=80),  # 80 / 0 / 6; 80 / 40 / 6
    "RC4w96": dict(num_warps=4, maxnreg=96),  # 91 / 0 / 5; 96 / 0 / 5
}
DEFAULT_VARIANTS = list(VARIANTS)


def variant_config(name: str, P: int, N: int, R: int):
    """The LaunchConfig of variant ``name`` at head shape ``(P, N)`` and ring size ``R``."""
    import replayssm_kernels.mamba2_decode.kernel as k

    return k.launch_config(P, N, R)._replace(**VARIANTS[name])


# --------------------------------------------------------------------------------------------
# Offline: sm_90a compile + ptxas -v (no GPU)
# --------------------------------------------------------------------------------------------

NANO = dict(H=96, P=80, N=128, G=8, R=16)  # Nemotron-3-Nano-4B, L = 16


def compile_sm90a(kern, ptrs: dict, ints: dict, const: dict, options: dict):
    """Compile the Triton ``kern`` for sm_90a (no GPU) as a launch on contiguous pool views
    would specialise it: ``ptrs`` maps pointer arguments to Triton types (``"constexpr"``: a
    ``None`` argument), ``const`` the constexprs, ``ints`` the integer arguments; ints equal to 1
    become constexpr, pointers and non-zero multiples of 16 get divisibility 16. Returns the
    compiled kernel (``.asm["ptx"]``, ``.metadata.shared``)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, cx, attrs = {}, {}, {}
    for i, n in enumerate(inspect.signature(kern.fn).parameters):
        if n in ptrs:
            sig[n] = ptrs[n]
            if ptrs[n] == "constexpr":
                cx[n] = None
            else:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in const:
            sig[n], cx[n] = "constexpr", const[n]
        elif ints[n] == 1:
            sig[n], cx[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if ints[n] % 16 == 0 and ints[n] != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn=kern, signature=sig, constexprs=cx, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def offline_build(cfg, p_split: int = 1, shape: dict = NANO, state_dtype: str = "fp32",
                  act_dtype: str = "bf16", read_dtype: str | None = None) -> dict:
    """Compile the launch of ``cfg`` for sm_90a as ``mamba2_replay_decode_fwd`` would launch it
    on contiguous layer views of the pool and the mixer's strided x / B / C / dt, with a
    contiguous read copy of ``read_dtype`` (``"bf16"``, ``"fp16"``, ``"fp8"``; ``None``: none),
    no SR (no GPU); return ``{"ptx", "shared"}``."""
    import triton

    import replayssm_kernels.mamba2_decode.kernel as k

    H, P, N, G, R = shape["H"], shape["P"], shape["N"], shape["G"], shape["R"]
    xbc = H * P + 2 * G * N
    dtw = H + xbc
    n_tiles = -(-P // cfg.block_p)
    tiles = -(-n_tiles // p_split)
    rows_pp = min(P, tiles * cfg.block_p)
    esz = {"bf16": 2, "fp16": 2, "fp32": 4}[act_dtype]
    ptrs = dict(state_ptr=f"*{state_dtype}", ring_x_ptr=f"*{act_dtype}", ring_dt_ptr="*fp32",
                ring_B_ptr=f"*{act_dtype}", x_ptr=f"*{act_dtype}", dt_ptr=f"*{act_dtype}",
                A_ptr="*fp32", B_ptr=f"*{act_dtype}", C_ptr=f"*{act_dtype}", D_ptr="*fp32",
                z_ptr="constexpr", dt_bias_ptr="*fp32", out_ptr=f"*{act_dtype}",
                slot_idx_ptr="*i32", ring_start_ptr="*i32", ring_len_ptr="*i32",
                flush_ptr="*i1", read_ptr="constexpr", read_scale_ptr="constexpr",
                sr_seed_ptr="constexpr")
    if read_dtype is not None:
        ptrs["read_ptr"] = {"bf16": "*bf16", "fp16": "*fp16", "fp8": "*fp8e4nv"}[read_dtype]
        if read_dtype == "fp8":
            ptrs["read_scale_ptr"] = "*fp32"
    ints = dict(P=P, N=N, R=R, heads_per_group=H // G, sr_layer=0,
                stride_state_slot=H * P * N, stride_state_head=P * N, stride_state_p=N,
                stride_state_n=1, stride_rx_slot=H * R * P, stride_rx_head=R * P,
                stride_rx_row=P, stride_rx_p=1, stride_rdt_slot=H * R, stride_rdt_head=R,
                stride_rdt_row=1, stride_rB_slot=G * R * N, stride_rB_group=R * N,
                stride_rB_row=N, stride_rB_n=1, stride_x_batch=xbc, stride_x_head=P,
                stride_x_p=1, stride_dt_batch=dtw, stride_dt_head=1, stride_A_head=1,
                stride_B_batch=xbc, stride_B_group=N, stride_B_n=1, stride_C_batch=xbc,
                stride_C_group=N, stride_C_n=1, stride_D_head=1, stride_D_p=0,
                stride_z_batch=0, stride_z_head=0, stride_z_p=0, stride_dt_bias_head=1,
                stride_out_batch=H * P, stride_out_head=P, stride_out_p=1,
                stride_read_slot=0, stride_read_head=0, stride_read_p=0, stride_read_n=0,
                stride_rs_slot=0, stride_rs_head=0, stride_rs_p=0)
    if read_dtype is not None:
        ints.update(stride_read_slot=H * P * N, stride_read_head=P * N, stride_read_p=N,
                    stride_read_n=1)
        if read_dtype == "fp8":
            ints.update(stride_rs_slot=H * P, stride_rs_head=P, stride_rs_p=1)
    block_n = triton.next_power_of_2(N)
    # As the launcher sets them (kernel.mamba2_replay_decode_fwd) for this case.
    const = dict(DT_SOFTPLUS=True, HAS_DT_BIAS=True, HAS_D=True, HAS_Z=False,
                 BLOCK_P=cfg.block_p, BLOCK_N=block_n, BLOCK_L=cfg.block_l, NUM_PT=tiles,
                 FOLD_UNROLL=cfg.fold_unroll,
                 PF_X=triton.next_power_of_2(-(-rows_pp * esz // 128) + 1),
                 PF_B=triton.next_power_of_2(-(-N * esz // 128)),
                 HAS_READ=read_dtype is not None, READ_FP8=read_dtype == "fp8", P_SPLIT=p_split,
                 SR=False, REC_FUSED=block_n >= cfg.block_l,
                 L2_AHEAD=cfg.l2_ahead, PTX=True)
    opts = dict(num_warps=cfg.num_warps)
    if cfg.maxnreg is not None:
        opts["maxnreg"] = cfg.maxnreg
    ck = compile_sm90a(k._mamba2_replay_decode_fwd_kernel, ptrs, ints, const, opts)
    return {"ptx": ck.asm["ptx"], "shared": ck.metadata.shared}


def ptxas_stats(ptx: str) -> dict:
    """``ptxas -v`` of this venv's Triton (the one it uses for sm_90) on ``ptx``: registers,
    stack frame, spill store / load bytes."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, "-lineinfo", "-v", "--gpu-name=sm_90a", src, "-o",
                            os.path.join(d, "k.cubin")], capture_output=True, text=True)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise RuntimeError(log[-2000:])
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"regs": int(re.search(r"Used (\d+) registers", log).group(1)),
            "stack": int(re.search(r"(\d+) bytes stack frame", log).group(1)),
            "spill_st": int(spill.group(1)), "spill_ld": int(spill.group(2))}


def ctas_per_sm(regs: int, num_warps: int, shared: int = 0) -> int:
    """Resident CTAs per H100/H200 SM allowed by registers (64K per SM, allocated per warp in
    units of 256), warps (64 per SM), CTAs (32) and shared memory (227 KB per SM usable)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // (per_warp * num_warps)
    by_smem = (227 * 1024) // shared if shared else 32
    return min(by_regs, 64 // num_warps, 32, by_smem)


def offline_table(names: list[str], read_dtype: str | None = None) -> list[dict]:
    rows = []
    for name in names:
        cfg = variant_config(name, NANO["P"], NANO["N"], NANO["R"])
        b = offline_build(cfg, read_dtype=read_dtype)
        st = ptxas_stats(b["ptx"])
        st.update(variant=name, num_warps=cfg.num_warps, cap=cfg.maxnreg, shared=b["shared"],
                  ctas=ctas_per_sm(st["regs"], cfg.num_warps, b["shared"]))
        rows.append(st)
        print(f"{name:7} warps {cfg.num_warps} cap {str(cfg.maxnreg):4} regs {st['regs']:3} "
              f"stack {st['stack']:3} spill st/ld {st['spill_st']:3}/{st['spill_ld']:3} "
              f"smem {st['shared']:5}  CTAs/SM {st['ctas']}", flush=True)
    return rows


# --------------------------------------------------------------------------------------------
# GPU sweep
# --------------------------------------------------------------------------------------------


def _bits(t):
    import torch

    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(as_int)


def sweep_batch(batch: int, names: list[str], reps: int, no_ssu: bool,
                device: str | None = None, read_dtype: str = "same") -> dict:
    import torch

    from benchmarks import bench_decode as bd
    import replayssm_kernels.mamba2_decode.kernel as k
    from replayssm_kernels import mamba2_replay_decode_ref

    cfg = bd.parse_args(["--family", "mamba2", "--batch", str(batch), "--window", "16",
                         "--state-dtype", "fp32", "--read-dtype", read_dtype,
                         "--out", "/tmp/sweep_unused"]
                        + (["--device", device] if device else []))
    cuda = cfg.device == "cuda"
    if not cuda:  # the CPU smoke run calls SGLang's kernel as bench_decode's does (interpreter)
        from benchmarks import _cpu_shims

        _cpu_shims.apply(sglang=not no_ssu)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peers, _ = bd.load_peers(cfg)
    timer = bd.Timer(cfg)
    L = cfg.L
    results: dict = {}
    orig_lc = k.launch_config
    fam = bd.Mamba2Family(cfg, {"mamba2": k.mamba2_replay_decode},
                          {} if no_ssu else {"ssu": peers.get("ssu")})
    ssu_done = no_ssu
    try:
        for name in names:
            k.launch_config = orig_lc
            vcfg = variant_config(name, fam.sh.P, fam.sh.N, cfg.R)
            k.launch_config = lambda P, N, R, c=vcfg: c
            fn = k.mamba2_replay_decode
            row: dict = {"config": repr(vcfg)}
            try:
                fam.kernels = {"mamba2": fn}
                rc = bd.refcheck_family(fam, fn, mamba2_replay_decode_ref)
                row["refcheck_ok"] = rc["ok"]
                row["refcheck_problems"] = rc["problems"]
                row["errors"] = rc["errors"]
                # vs the default launch configuration on the same inputs: checkpoint and ring
                # bits (the default is itself bitwise vs SGLang: gpu tests), output difference
                args, _, _ = fam.refcheck_args()
                a1 = {kk: v.clone() for kk, v in args.items()}
                a2 = {kk: v.clone() for kk, v in args.items()}
                k.launch_config = orig_lc
                fam.refcheck_call(k.mamba2_replay_decode, a1)
                k.launch_config = lambda P, N, R, c=vcfg: c
                fam.refcheck_call(fn, a2)
                sync()
                row["bitwise_vs_default"] = {
                    t: bool(torch.equal(_bits(a1[t]), _bits(a2[t])))
                    for t in ("state", "ring_x", "ring_dt", "ring_B")}
                o1, o2 = a1["out"].float(), a2["out"].float()
                live = ~torch.isnan(o1)
                row["nan_pattern_equal"] = bool(torch.equal(live, ~torch.isnan(o2)))
                row["dout_vs_default"] = float(
                    ((o1 - o2).abs()[live].max() / o1.abs()[live].max().clamp_min(1e-30)))
                # timing: every phase (all rows alike), then mixed phases
                cases = fam.cases(batch)
                c_ours = cases[0]
                c_ours.set_phase(0)
                g = bd.capture_graph(c_ours.fn) if cuda else None
                run = g.replay if cuda else c_ours.fn  # cpu (--device cpu): a smoke run only
                ph = []
                for w in range(L):
                    c_ours.set_phase(w)
                    sync()
                    ph.append(statistics.median(timer.measure(run, reps, 3 if cuda else 0)))
                c_ours.set_mixed()
                sync()
                row["mixed_us"] = round(statistics.median(
                    timer.measure(run, reps, 3 if cuda else 0)), 1)
                row["phases_us"] = [round(x, 1) for x in ph]
                row["cycle_mean_us"] = round(sum(ph) / L, 1)
                if not ssu_done and len(cases) > 1:
                    gs = bd.capture_graph(cases[1].fn) if cuda else None
                    results["ssu"] = {"us": round(statistics.median(timer.measure(
                        gs.replay if cuda else cases[1].fn, reps, 3 if cuda else 0)), 1)}
                    ssu_done = True
                del g
            except Exception as e:  # noqa: BLE001
                import traceback

                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            results[name] = row
            print(batch, name, json.dumps(row), flush=True)
    finally:
        k.launch_config = orig_lc
    return results


def print_table(batch: int, results: dict) -> None:
    ssu = results.get("ssu", {}).get("us", float("nan"))
    print(f"\nbatch {batch}  ssu {ssu} us")
    print(f"{'var':7} {'ok':>2} {'bit':>3} {'dout':>8} {'w0':>7} {'w1':>7} {'w8':>7} {'w14':>7} "
          f"{'flush':>7} {'mean':>7} {'xSSU':>5} {'mixed':>7}")
    for name, r in results.items():
        if name == "ssu":
            continue
        if "phases_us" not in r:
            print(f"{name:7} {r.get('error')}")
            continue
        p = r["phases_us"]
        bit = all(r["bitwise_vs_default"].values()) and r["nan_pattern_equal"]
        print(f"{name:7} {int(r['refcheck_ok']):2} {int(bit):3} {r['dout_vs_default']:8.1e} "
              f"{p[0]:7.1f} {p[1]:7.1f} {p[8]:7.1f} {p[14]:7.1f} {p[-1]:7.1f} "
              f"{r['cycle_mean_us']:7.1f} {ssu / r['cycle_mean_us']:5.2f} {r['mixed_us']:7.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="256", help="comma-separated batch sizes")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-ssu", action="store_true")
    ap.add_argument("--offline", action="store_true",
                    help="no GPU: compile the variants for sm_90a, print ptxas registers/spills")
    ap.add_argument("--read-dtype", choices=("same", "bf16", "fp16", "fp8"), default="same",
                    help="launches with a read copy of this dtype beside the fp32 checkpoint "
                         "(bench_decode's --read-dtype; same: none)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="cpu: interpreter at bench_decode's tiny shape, a smoke run of this "
                         "script (no measurement)")
    a = ap.parse_args(argv)
    names = [n for n in a.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if a.offline:
        out = offline_table(names, None if a.read_dtype == "same" else a.read_dtype)
    else:
        out = {}
        for b in [int(x) for x in a.batch.split(",") if x]:
            out[str(b)] = sweep_batch(b, names, a.reps, a.no_ssu, a.device, a.read_dtype)
        for b, res in out.items():
            print_table(int(b), res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
