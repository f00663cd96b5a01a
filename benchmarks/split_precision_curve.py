"""Output error vs decode length: split precision (fp32 checkpoint + bf16 read copy) against a
shared bf16 state, both against the float64 recurrence. CPU, plain-torch reference kernels.

One request, ``steps`` decode tokens, small Mamba-2 layer whose heads span slow to fast decay
(``A·Δ`` from -1e-4 to -1e-1 per token: the slow heads are where a 16-bit state fails). Curves:

- ``split-bf16``: ``mamba2_replay_decode_ref``, fp32 checkpoint, bf16 read copy, ``L = 16``;
- ``split-fp8``: the same with an fp8 (e4m3, per-row scales) read copy;
- ``replay-bf16-state``: ReplaySSM with a bf16 checkpoint (rounded once per flush), no copy;
- ``shared-bf16``: the baseline, one bf16 state read and updated every token (``L = 1``: every
  step is the conventional ``selective_state_update`` step with a bf16 ``mamba_ssm_dtype``).

Activations and outputs are fp32 so that the state is the only error source. The error of a block
of ``block`` steps is ``‖y − y64‖ / ‖y64‖`` over the block's outputs.

    python -m benchmarks.split_precision_curve --out benchmarks/results/split_precision_error.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from replayssm_kernels import (
    decode_cursor_step_ref,
    mamba2_conventional_f64,
    mamba2_replay_decode_ref,
)
from replayssm_kernels.read_copy_refresh import refresh_read_copy_ref

__all__ = ["CURVES", "error_curves", "main"]

H, G, P, N = 4, 1, 8, 16
A_DELTA = (-1e-4, -1e-3, -1e-2, -1e-1)  # A·Δ per head and token
CURVES = {
    # name: (checkpoint dtype, read-copy dtype or None, ring window L)
    "split-bf16": (torch.float32, torch.bfloat16, 16),
    "split-fp8": (torch.float32, torch.float8_e4m3fn, 16),
    "replay-bf16-state": (torch.bfloat16, None, 16),
    "shared-bf16": (torch.bfloat16, None, 1),
}


def _inputs(steps: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    delta = torch.full((H,), 0.05)
    return dict(
        state0=torch.randn(H, P, N, generator=gen) * 0.5,
        x=torch.randn(steps, H, P, generator=gen),
        dt=delta.expand(steps, H).clone(),
        A=torch.tensor(A_DELTA) / delta,
        B=torch.randn(steps, G, N, generator=gen) / N**0.5,
        C=torch.randn(steps, G, N, generator=gen),
        D=torch.randn(H, generator=gen),
    )


def _run(inp: dict, state_dtype: torch.dtype, read_dtype: torch.dtype | None, L: int
         ) -> torch.Tensor:
    """Outputs ``[steps, H, P]`` (fp32) of one request decoded step by step."""
    steps = inp["x"].shape[0]
    R, slots = L, 2  # slot 1 serves the request; slot 0 stays idle
    state = inp["state0"].expand(slots, H, P, N).to(state_dtype).contiguous()
    ring_x = torch.zeros(slots, H, R, P)
    ring_dt = torch.zeros(slots, H, R)
    ring_B = torch.zeros(slots, G, R, N)
    read = scale = None
    if read_dtype is not None:
        read = torch.empty(slots, H, P, N, dtype=read_dtype)
        if read_dtype == torch.float8_e4m3fn:
            scale = torch.empty(slots, H, P)
        refresh_read_copy_ref(state, read, scale, torch.arange(slots))
    cursors = torch.zeros(slots, 2, dtype=torch.int32)
    slot_idx = torch.ones(1, dtype=torch.int32)
    no_force = torch.zeros(1, dtype=torch.bool)
    rs, rl = torch.empty(1, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
    fl = torch.empty(1, dtype=torch.bool)
    ys = torch.empty(steps, H, P)
    for t in range(steps):
        decode_cursor_step_ref(cursors, slot_idx, no_force, L, R, rs, rl, fl)
        mamba2_replay_decode_ref(
            state, ring_x, ring_dt, ring_B, inp["x"][t : t + 1], inp["dt"][t : t + 1], inp["A"],
            inp["B"][t : t + 1], inp["C"][t : t + 1], ys[t : t + 1], slot_idx, rs, rl, fl,
            D=inp["D"], read_state=read, read_scale=scale,
        )
    return ys


def error_curves(steps: int = 10_000, block: int = 500, seed: int = 0,
                 names: tuple[str, ...] = tuple(CURVES)) -> dict[str, list[float]]:
    """Relative L2 output error vs float64 per block of ``block`` steps, per curve.

    Returns
    -------
    dict
        ``{name: [err_block_0, err_block_1, ...]}`` (``steps // block`` values each).
    """
    inp = _inputs(steps, seed)
    y64, _ = mamba2_conventional_f64(inp["state0"], inp["x"], inp["dt"], inp["A"], inp["B"],
                                     inp["C"], D=inp["D"])
    y64 = y64.reshape(steps // block, -1)
    out = {}
    for name in names:
        y = _run(inp, *CURVES[name]).double().reshape(steps // block, -1)
        err = torch.linalg.vector_norm(y - y64, dim=1) / torch.linalg.vector_norm(y64, dim=1)
        out[name] = err.tolist()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--block", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="PNG path (a .json is written beside)")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"matplotlib is needed for the PNG ({e}); pip install matplotlib") from e

    curves = error_curves(args.steps, args.block, args.seed)
    x = [(i + 1) * args.block for i in range(args.steps // args.block)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, err in curves.items():
        ax.plot(x, err, marker="o", ms=3, label=name)
    ax.set_yscale("log")
    ax.set_xlabel(f"decode step (end of each {args.block}-step block)")
    ax.set_ylabel("‖y − y_f64‖ / ‖y_f64‖ over the block")
    ax.set_title(f"Mamba-2 decode output error vs float64 (H={H}, P={P}, N={N}, "
                 "A·Δ 1e-4..1e-1, fp32 activations)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    args.out.with_suffix(".json").write_text(json.dumps(
        dict(steps=args.steps, block=args.block, seed=args.seed, curves=curves), indent=1))
    for name, err in curves.items():
        print(f"{name:>18}: first block {err[0]:.2e}, last block {err[-1]:.2e}, "
              f"max {max(err):.2e}")


if __name__ == "__main__":
    main()
