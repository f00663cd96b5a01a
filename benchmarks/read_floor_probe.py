"""How fast can a GDN decode launch read its checkpoints at all? A read-only probe (issue 3's 85%).

The GDN non-flush step reads each row's checkpoint ``[HV, V, K]`` once and writes nothing of it; at
batch 256 (Qwen3.5-4B shape) it reaches ~80-84% of copy bandwidth by the byte model, SGLang's
built-in ReplaySSM decode the same. This probe times kernels that only read the same bytes, in the
same launch shapes, and reduce each row of a tile to one float (written, so nothing is elided):

- ``warp1_tiles4``: our decode's shape at batch >= 256: one warp per program, a program reads four
  ``[32, K]`` tiles of one value head (``tiles=4``), grid ``(1, HV, batch)``;
- ``warp1_tiles1``: one ``[32, K]`` tile per one-warp program, grid ``(V / 32, HV, batch)``;
- ``warp4_head``: one ``[V, K]`` head per four-warp program, grid ``(1, HV, batch)``;
- ``warp8_head``: the same with eight warps.

Rows sit on random slots of a 1,024-slot pool, as in ``bench_decode``. CUDA events over
``triton.testing.do_bench`` (which clears L2 between repetitions), median. Also times a device copy
of the same bytes (read + write) for the bandwidth reference.

    python -m benchmarks.read_floor_probe --batch 256
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

__all__ = ["main"]


@triton.jit
def _read_rows_kernel(state, slot_idx, out, stride_s_n, stride_s_h, stride_s_v, stride_o_b, stride_o_h,
                      V: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, TILES: tl.constexpr):
    i_g, i_hv, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    s = tl.load(slot_idx + i_b).to(tl.int64)
    o_k = tl.arange(0, K)
    for t in tl.static_range(TILES):
        o_v = (i_g * TILES + t) * BV + tl.arange(0, BV)
        p = state + s * stride_s_n + i_hv * stride_s_h + o_v[:, None] * stride_s_v + o_k[None, :]
        x = tl.load(p, mask=o_v[:, None] < V, other=0.0)
        tl.store(out + i_b * stride_o_b + i_hv * stride_o_h + o_v, tl.sum(x, 1), mask=o_v < V)


VARIANTS = {  # name: (BV, TILES, num_warps)
    "warp1_tiles4": (32, 4, 1),
    "warp1_tiles1": (32, 1, 1),
    "warp4_head": (128, 1, 4),
    "warp8_head": (128, 1, 8),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--slots", type=int, default=1024)
    args = ap.parse_args(argv)
    HV, V, K = 32, 128, 128
    dev = "cuda"
    state = torch.randn(args.slots, HV, V, K, device=dev)
    slot_idx = torch.randperm(args.slots, device=dev)[: args.batch].to(torch.int32)
    out = torch.empty(args.batch, HV, V, device=dev)
    nbytes = args.batch * HV * V * K * 4
    src = torch.randn(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    copy_us = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e3
    copy_bw = 2 * nbytes / (copy_us * 1e-6)
    print(f"{torch.cuda.get_device_name()}; batch {args.batch}; checkpoint bytes {nbytes / 1e6:.1f} MB; "
          f"copy of them (read + write) {copy_us:.1f} us = {copy_bw / 1e12:.3f} TB/s")
    ref = state[slot_idx.long()].sum(-1)
    for name, (BV, TILES, warps) in VARIANTS.items():
        grid = (triton.cdiv(triton.cdiv(V, BV), TILES), HV, args.batch)

        def run(BV=BV, TILES=TILES, warps=warps, grid=grid):
            _read_rows_kernel[grid](state, slot_idx, out, state.stride(0), state.stride(1), state.stride(2),
                                    out.stride(0), out.stride(1), V=V, K=K, BV=BV, TILES=TILES,
                                    num_warps=warps)

        out.fill_(float("nan"))
        run()
        err = ((out - ref).norm() / ref.norm()).item()
        us = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median") * 1e3
        bw = nbytes / (us * 1e-6)
        print(f"{name:>13}: {us:7.1f} us  read {bw / 1e12:.3f} TB/s = {100 * bw / copy_bw:.0f}% of copy "
              f"(rel err vs torch {err:.1e})")


if __name__ == "__main__":
    main()
