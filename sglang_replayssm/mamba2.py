"""``ReplayMamba2AttnBackend``: SGLang's ``Mamba2AttnBackend`` with ReplaySSM decode.

Installed by class REPLACE (``hooks/backends.py``), so NemotronH / Falcon-H1 / Granite's
``isinstance(backend, Mamba2AttnBackend)`` asserts hold.  What changes:

- **Metadata.** ``init_forward_metadata`` (eager: decode, extend, mixed) snapshots and advances the
  cursors of the decode rows once per forward and empties the rings of the extend rows
  (``metadata.build_eager``).  Under CUDA graphs, ``init_cuda_graph_state`` allocates per-bs static
  cursor / flush buffers; ``init_forward_metadata_out_graph`` hands the layers those buffers, and
  ``init_forward_metadata_in_graph`` (recorded inside the captured graph) runs the cursor step into
  them, so every replay advances the cursors on the device with no host sync.  Warmup and capture
  run on SGLang's dummy slot 0 (the null slot), whose cursors and rings are never read for real rows.
- **Decode (GPU).** ``forward`` calls SGLang's ``MambaMixer2.forward`` unchanged inside a ReplaySSM
  context; the mixer's only decode SSU call site, ``selective_state_update`` (AROUND hook), runs
  ``replayssm_kernels.mamba2_replay_decode`` with this layer's rings and the forward's snapshot.  The
  context must be consumed exactly once per layer with decode rows, which catches a silent bypass.
- **Speculative verify (TARGET_VERIFY).** The metadata build snapshots the cursors once
  (``spec.VerifyMetadataMixin``; eager and CUDA graphs); the SSU hook runs
  ``mamba2_replay_verify`` on the mixer's ``[bs, T, ...]`` call, and the commit hook
  (``hooks/spec.py``) moves the cursors by the accepted counts.  Buckets the verify plan sends to
  SGLang's snapshot verify fold the ring first, then run it unchanged (``spec.py``).
- **Extend (GPU).** Stock: the chunked scan writes the final state into ``temporal`` (the new
  checkpoint); the ring of those rows was emptied by the metadata build.
- **CPU.** ``forward`` runs ``cpu.mamba2_mixer`` (pure torch; ring decode through the plain-torch
  reference with the same signature), because stock SGLang cannot run Mamba-2 layers on a CPU.
- **Radix tracking.** Rows in ``forward_batch.mamba_track_mask`` force-flush, so the stock
  track-copy after the layer reads a current checkpoint.
- **Stochastic rounding** (``--enable-mamba-cache-stochastic-rounding``, fp16 checkpoint): the
  metadata build advances the pool's device counter once per forward (eager, and inside the
  captured graph) and the decode / verify kernels get it with the layer index
  (``pool.layer_rounding``), so their flush rows store the checkpoint stochastically rounded.
- **Split precision** (``--replayssm-read-dtype``): decode passes the layer's read copy
  (``pool.layer_read_copy``) to the decode kernel, which reads it on non-flush rows and refreshes it
  on flush rows; after each layer's extend rows the copy of those slots is refreshed from the new
  checkpoint (``pool.refresh_read``).  Verify forwards pass it to the verify kernel the same way
  (non-flush rows read it, flush rows refresh it); after a snapshot-path commit (SGLang writes the
  accepted state into the checkpoint) the committed rows' copies are refreshed (``spec.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

from sglang_replayssm.metadata import GraphBuffers, GraphMetadataMixin, ReplayStep, build_eager
from sglang_replayssm.pool import ReplayMambaPool
from sglang_replayssm.read_copy_check import check_forward
from sglang_replayssm.spec import (
    VerifyGraphBuffers,
    VerifyMetadataMixin,
    VerifyStep,
    pin_batch_invariant,
    verify_kernel,
)

__all__ = ["ReplayMamba2AttnBackend", "replay_selective_state_update", "PERF_NOTE"]

logger = logging.getLogger(__name__)

PERF_NOTE = (
    "measured on the H200 (benchmarks/RESULTS.md, b870ffe; fp32 state, L=16, full cycle): the ReplaySSM "
    "Mamba-2 decode kernel is faster than SGLang's selective_state_update at every batch measured "
    "(1.14x at batch 1, 2.08x at 64, 2.26x at 256), so decode always takes it; speculative verify "
    "buckets are chosen by the startup probe"
)

def decode_kernel(device: torch.device) -> Callable[..., None]:
    """The ring decode for ``device``: the Triton kernel on CUDA, the torch reference on CPU."""
    import replayssm_kernels

    if device.type == "cuda":
        return replayssm_kernels.mamba2_replay_decode
    if device.type == "cpu":
        return replayssm_kernels.mamba2_replay_decode_ref
    raise ValueError(f"ReplaySSM Mamba-2 decode: unsupported device {device}")


@dataclasses.dataclass(kw_only=True)
class _LayerContext:
    rings: dict[str, torch.Tensor]
    step: ReplayStep | VerifyStep
    decode: Callable[..., None]  # mamba2_replay_decode, or mamba2_replay_verify for a VerifyStep
    calls: int = 0


_ACTIVE: _LayerContext | None = None


def replay_selective_state_update(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook for ``mamba.selective_state_update`` (transparent outside a ReplaySSM layer).

    ``MambaMixer2.forward`` calls ``selective_state_update(state, x, dt, A, B, C, D, z=None,
    dt_bias=, dt_softplus=True, state_batch_indices=, out=)`` for its decode rows; inside a ReplaySSM
    layer context this runs the ring decode with the same tensors instead.  For a TARGET_VERIFY
    forward the mixer passes ``x [bs, T, H, P]`` etc. with ``disable_state_update=True`` and
    ``intermediate_states_buffer``; inside a verify context (``VerifyStep``) this runs
    ``mamba2_replay_verify`` on the same tensors (the per-draft buffer is not used, and may be None);
    for a snapshot-path forward it folds the ring into the checkpoint and then calls the original
    (``spec.py``, "Snapshot fallback").  A verify call in a decode context, or a decode call in a
    verify context, raises.
    """
    ctx = _ACTIVE
    if ctx is None:
        return original(*args, **kwargs)
    verify_call = bool(kwargs.get("disable_state_update")) or kwargs.get("intermediate_states_buffer") is not None
    if verify_call != isinstance(ctx.step, VerifyStep):
        raise RuntimeError(
            f"ReplaySSM: selective_state_update called as {'verify' if verify_call else 'decode'} inside a "
            f"{'verify' if isinstance(ctx.step, VerifyStep) else 'decode'} layer context"
        )
    names = ("state", "x", "dt", "A", "B", "C", "D")
    bound = dict(zip(names, args))
    for k in names:
        if k in kwargs:
            bound[k] = kwargs[k]
    slot_idx = kwargs["state_batch_indices"]
    out = kwargs["out"]
    step = ctx.step
    if slot_idx.shape[0] != step.slot_idx.shape[0]:
        raise RuntimeError(
            f"ReplaySSM: rows {slot_idx.shape[0]} != cursor snapshot rows {step.slot_idx.shape[0]}"
        )
    ctx.calls += 1
    if isinstance(step, VerifyStep) and step.snapshot:
        # SGLang's snapshot verify reads the checkpoint alone: fold the committed ring into it first
        # (rows with records flush; a one-token window whose outputs are discarded), then run it unchanged.
        ctx.decode(
            bound["state"], ctx.rings["x"], ctx.rings["dt"], ctx.rings["B"], bound["x"][:, :1],
            bound["dt"][:, :1], bound["A"], bound["B"][:, :1], bound["C"][:, :1], torch.empty_like(out[:, :1]),
            slot_idx, step.ring_start, step.ring_len, step.flush, D=bound.get("D"), z=None,
            dt_bias=kwargs.get("dt_bias"), dt_softplus=kwargs.get("dt_softplus", False),
        )
        return original(*args, **kwargs)
    ctx.decode(
        bound["state"],
        ctx.rings["x"],
        ctx.rings["dt"],
        ctx.rings["B"],
        bound["x"],
        bound["dt"],
        bound["A"],
        bound["B"],
        bound["C"],
        out,
        slot_idx,
        step.ring_start,
        step.ring_len,
        step.flush,
        D=bound.get("D"),
        z=kwargs.get("z"),
        dt_bias=kwargs.get("dt_bias"),
        dt_softplus=kwargs.get("dt_softplus", False),
    )
    return out


class ReplayMamba2AttnBackend(VerifyMetadataMixin, GraphMetadataMixin, Mamba2AttnBackend):
    """``Mamba2AttnBackend`` that decodes through the ReplaySSM rings (see the module docstring)."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        pool = self.req_to_token_pool.mamba_pool
        if not isinstance(pool, ReplayMambaPool):
            raise RuntimeError(
                "ReplaySSM: the Mamba-2 backend needs the ReplaySSM mamba pool, got "
                f"{type(pool).__name__} (unified memory / PD decode pools are not supported)"
            )
        self.pool = pool
        self.window = pool.replay.window
        self.rows = pool.ring_spec.rows
        self.num_tokens = pool.spec_tokens
        self._decode = decode_kernel(torch.device(self.device))
        self._verify = verify_kernel("mamba2", torch.device(self.device))
        self._decode, self._verify = pin_batch_invariant(model_runner.server_args, self._decode, self._verify)
        self._step: ReplayStep | VerifyStep | None = None
        self._verify_graph: VerifyGraphBuffers | None = None
        self._last_verify: VerifyStep | None = None
        self._init_spec(model_runner)
        self._graph: GraphBuffers | None = None
        self._graph_bs: int | None = None
        if not self.is_draft_worker:
            logger.info(
                "ReplaySSM Mamba-2 backend: window L=%d, ring rows R=%d, device %s; decode and verify run the "
                "ReplaySSM kernels in place of --mamba-backend %s's (prefill/extend keep it). Note: %s.",
                self.window,
                self.rows,
                self.device,
                getattr(model_runner.server_args, "mamba_backend", None),
                PERF_NOTE,
            )

    # ------------------------------------------------------------------ metadata

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self.pool.advance_rounding()
        md = self.forward_metadata
        self._graph_bs = None
        self._graph_verify_bs = None
        check_forward(self, md.mamba_cache_indices, "Mamba-2 eager")  # debug only ($SGLANG_REPLAYSSM_CHECK_READ_COPY)
        if md.is_target_verify:
            self._step = self._snapshot_verify(md.mamba_cache_indices[: md.num_decodes])
            return
        self._step = build_eager(
            cursors=self.pool.cursors,
            slot_idx=md.mamba_cache_indices,
            num_prefills=md.num_prefills,
            num_decodes=md.num_decodes,
            track_mask=forward_batch.mamba_track_mask,
            window=self.window,
            rows=self.rows,
            extend_prefix_lens=forward_batch.extend_prefix_lens,
            extend_prefix_lens_cpu=getattr(forward_batch, "extend_prefix_lens_cpu", None),
        )

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        mixer,
        hidden_states: torch.Tensor,
        output: torch.Tensor | None,
        layer_id: int,
        forward_batch,
        mup_vector: torch.Tensor | None = None,
        use_triton_causal_conv: bool = False,
    ):
        global _ACTIVE
        md = self.forward_metadata
        pool_layer = self.req_to_token_pool.mamba_map[layer_id]
        if not md.num_decodes and hidden_states.device.type != "cpu":
            # Extend only (prefill, radix-hit suffix): SGLang's chunked scan, no ring; nothing per
            # layer beyond it (no ring views, no kernel keywords: host time of every eager prefill).
            result = super().forward(
                mixer, hidden_states, output, layer_id, forward_batch, mup_vector, use_triton_causal_conv
            )
            self._refresh_extend_rows(pool_layer)
            return result
        rings = self.pool.layer_rings(pool_layer)
        decode, verify = self._decode, self._verify
        # Split precision (non-flush rows read the copy, flush rows refresh it) and stochastic
        # rounding of the flush store.
        extra = {**self.pool.layer_read_copy(pool_layer), **self.pool.layer_rounding(pool_layer)}
        if extra:
            decode = functools.partial(self._decode, **extra)
            verify = functools.partial(self._verify, **extra)
        if hidden_states.device.type == "cpu":
            from sglang_replayssm.cpu.mamba2_mixer import mamba2_mixer_forward_cpu

            if isinstance(self._step, VerifyStep) and self._step.snapshot:
                raise NotImplementedError("ReplaySSM CPU path: SGLang's snapshot verify has no CPU path")

            if forward_batch.mamba_track_mask is not None:
                raise NotImplementedError("ReplaySSM CPU path: mamba radix tracking (extra_buffer)")
            layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer_id)
            result = mamba2_mixer_forward_cpu(
                mixer,
                hidden_states=hidden_states,
                output=output,
                layer_cache=layer_cache,
                metadata=md,
                rings=rings,
                step=self._step if md.num_decodes else None,
                decode_fn=verify if md.is_target_verify else decode,
                mup_vector=mup_vector,
            )
            self._refresh_extend_rows(pool_layer)
            return result
        if self._step is None:
            raise RuntimeError("ReplaySSM: decode rows without a cursor snapshot")
        kernel = verify if isinstance(self._step, VerifyStep) else decode
        ctx = _LayerContext(rings=rings, step=self._step, decode=kernel)
        _ACTIVE = ctx
        try:
            result = super().forward(
                mixer, hidden_states, output, layer_id, forward_batch, mup_vector, use_triton_causal_conv
            )
        finally:
            _ACTIVE = None
        if ctx.calls != 1:
            raise RuntimeError(
                f"ReplaySSM: the Mamba-2 mixer called selective_state_update {ctx.calls} times for its "
                "decode / verify rows (expected 1); the selective_state_update hook is not in effect"
            )
        self._refresh_extend_rows(pool_layer)
        return result

    def _refresh_extend_rows(self, pool_layer: int) -> None:
        """Split precision: the extend rows' checkpoints were just written by the chunked scan (extend
        rows come first in ``mamba_cache_indices``); refresh their read copy in this layer."""
        md = self.forward_metadata
        if md.num_prefills and self.pool.read_state is not None:
            self.pool.refresh_read(md.mamba_cache_indices[: md.num_prefills], pool_layer)
