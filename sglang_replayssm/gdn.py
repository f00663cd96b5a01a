"""``ReplayGDNAttnBackend``: SGLang's ``GDNAttnBackend`` with ReplaySSM decode (Qwen3-Next, Qwen3.5).

Installed by class REPLACE (``hooks/backends.py``).  What changes:

- **Metadata**: as in ``mamba2.py`` (``metadata.build_eager`` for eager forwards; per-bs static
  cursor / flush buffers filled by ``init_forward_metadata_in_graph`` inside the captured graph).
  Extend forwards empty the rings of all their rows: ``forward_extend`` (stock) runs the chunked
  delta rule from ``temporal`` and writes the final state as the new checkpoint.
- **Decode**: ``forward_decode`` runs SGLang's ``causal_conv1d_update`` (stock), splits the packed
  ``mixed_qkv`` into q, k, v and calls ``replayssm_kernels.gdn_replay_decode`` with this layer's
  rings, then the stock decode radix track-copy (its rows were force-flushed).
- **Speculative verify**: ``forward_extend`` of a TARGET_VERIFY forward runs SGLang's verify conv
  (it fills ``intermediate_conv_window`` for the commit's conv rollback), then
  ``gdn_replay_verify`` on the forward's cursor snapshot (``spec.VerifyMetadataMixin``); the commit
  hook (``hooks/spec.py``) moves the cursors.  Snapshot-path buckets fold the ring first, then run
  SGLang's verify unchanged (``spec.py``).
- **Mixed chunks** (``--enable-mixed-chunk``) are refused: SGLang runs the decode rows of a MIXED
  forward through ``chunk_gated_delta_rule`` on ``temporal``, which would ignore a non-empty ring.
- **Stochastic rounding** (``--enable-mamba-cache-stochastic-rounding``): as in ``mamba2.py``
  (SGLang 0.5.17 itself rounds GDN checkpoints to nearest whatever the flag; here the flag covers
  both families).
- **Split precision** (``--replayssm-read-dtype``): as in ``mamba2.py``: decode and verify pass the
  layer's read copy to ``gdn_replay_decode`` / ``gdn_replay_verify``; after each layer's extend its
  rows' copies are refreshed, and after a snapshot-path commit the committed rows' (``spec.py``).
- **CPU**: ``forward_extend`` / ``forward_decode`` run ``cpu.gdn`` for CPU tensors (torch conv with
  the conv state, fp32 delta rule for extend, ring decode through ``gdn_replay_decode_ref``); the
  model-layer Triton pieces SGLang runs outside the backend are routed to torch by ``hooks/cpu.py``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

from replayssm_kernels.gdn_decode.kernel import FLUSH_FIRST_MIN_BATCH

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

__all__ = ["ReplayGDNAttnBackend"]

PERF_NOTE = (
    "measured on the H200 (benchmarks/RESULTS.md, 40f2ff4; fp32 state, L=16, full cycle): SGLang's "
    "packed GDN decode kernel is FASTER than the ReplaySSM GDN decode at batch 1 (ours 0.94x of it); "
    "ours is faster at batch 64 and above (batches 8-32 not timed at that commit; 1.21x at 64, 1.35x at 256, 1.39x at 512), and SGLang's built-in "
    "ReplaySSM decode kernel (not used here) is faster than ours at those batches (ours 0.92-0.96x; "
    "0.99x in a mixed launch at 256); its flush (424 us vs our exact fold's 669 at batch 256) does not "
    "reproduce the packed decode's bits. This build runs the ReplaySSM decode at every batch "
    "size (no per-batch-size decode switch); speculative verify buckets are chosen by the startup probe"
)

logger = logging.getLogger(__name__)


def decode_kernel(device: torch.device) -> Callable[..., None]:
    """The GDN ring decode for ``device``: the Triton kernel on CUDA, the torch reference on CPU."""
    import replayssm_kernels

    if device.type == "cuda":
        return replayssm_kernels.gdn_replay_decode
    if device.type == "cpu":
        return replayssm_kernels.gdn_replay_decode_ref
    raise ValueError(f"ReplaySSM GDN decode: unsupported device {device}")


class ReplayGDNAttnBackend(VerifyMetadataMixin, GraphMetadataMixin, GDNAttnBackend):
    """``GDNAttnBackend`` that decodes through the ReplaySSM rings (see the module docstring)."""

    order_rows_from = FLUSH_FIRST_MIN_BATCH  # decode rows launched flush rows first from here

    def __init__(self, model_runner):
        super().__init__(model_runner)
        pool = self.req_to_token_pool.mamba_pool
        if not isinstance(pool, ReplayMambaPool) or pool.replay.family != "gdn":
            raise RuntimeError(
                "ReplaySSM: the GDN backend needs the ReplaySSM mamba pool with GDN rings, got "
                f"{type(pool).__name__}"
            )
        args = model_runner.server_args
        if getattr(args, "enable_mixed_chunk", False):
            raise ValueError(
                "ReplaySSM: --enable-mixed-chunk is not supported for Gated DeltaNet models (SGLang runs the "
                "decode rows of a mixed forward through the chunked prefill kernel, which ignores the ring)"
            )
        self.pool = pool
        self.window = pool.replay.window
        self.rows = pool.ring_spec.rows
        self.num_tokens = pool.spec_tokens
        self._decode = decode_kernel(torch.device(self.device))
        self._verify = verify_kernel("gdn", torch.device(self.device))
        self._decode, self._verify = pin_batch_invariant(model_runner.server_args, self._decode, self._verify)
        self._step: ReplayStep | VerifyStep | None = None
        self._verify_graph: VerifyGraphBuffers | None = None
        self._last_verify: VerifyStep | None = None
        self._init_spec(model_runner)
        self._graph: GraphBuffers | None = None
        self._graph_bs: int | None = None
        if not self.is_draft_worker:
            logger.info(
                "ReplaySSM GDN backend: window L=%d, ring rows R=%d, device %s; decode and verify run the "
                "ReplaySSM kernels in place of the linear-attention decode backend %s's (prefill/extend keep "
                "--linear-attn-backend %s). Note: %s.",
                self.window, self.rows, self.device,
                getattr(args, "linear_attn_decode_backend", None) or getattr(args, "linear_attn_backend", None),
                getattr(args, "linear_attn_backend", None), PERF_NOTE,
            )

    # ------------------------------------------------------------------ metadata

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self.pool.advance_rounding()
        mode = forward_batch.forward_mode
        md = self.forward_metadata
        self._graph_bs = None
        self._graph_verify_bs = None
        check_forward(self, md.mamba_cache_indices, "GDN eager")  # debug only ($SGLANG_REPLAYSSM_CHECK_READ_COPY)
        if mode.is_target_verify():
            self._step = self._snapshot_verify(md.mamba_cache_indices[: forward_batch.batch_size])
        elif mode.is_decode_or_idle():
            n = md.mamba_cache_indices.shape[0]
            self._step = build_eager(
                cursors=self.pool.cursors,
                slot_idx=md.mamba_cache_indices,
                num_prefills=0,
                num_decodes=n,
                track_mask=forward_batch.mamba_track_mask,
                window=self.window,
                rows=self.rows,
                order_rows_from=self.order_rows_from,
            )
        else:
            if mode.is_mixed():
                raise NotImplementedError("ReplaySSM: MIXED forwards are not supported for GDN")
            self._step = build_eager(
                cursors=self.pool.cursors,
                slot_idx=md.mamba_cache_indices,
                num_prefills=md.mamba_cache_indices.shape[0],
                num_decodes=0,
                track_mask=None,
                window=self.window,
                rows=self.rows,
                extend_prefix_lens=forward_batch.extend_prefix_lens,
                extend_prefix_lens_cpu=getattr(forward_batch, "extend_prefix_lens_cpu", None),
            )

    # ------------------------------------------------------------------ forward

    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return self._forward_verify(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        if not (isinstance(mixed_qkv, torch.Tensor) and mixed_qkv.device.type == "cpu"):
            result = super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
            self._refresh_extend_rows(layer.layer_id)
            return result
        from sglang_replayssm.cpu.gdn import gdn_extend_cpu

        if self.forward_metadata.has_mamba_track_mask:
            raise NotImplementedError("ReplaySSM CPU GDN: mamba radix tracking (extra_buffer)")
        layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        result = gdn_extend_cpu(
            layer,
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            conv_state=layer_cache.conv[0],
            ssm_state=layer_cache.temporal,
            slots=self.forward_metadata.mamba_cache_indices,
            query_start_loc=self.forward_metadata.query_start_loc,
            has_initial_state=forward_batch.extend_prefix_lens > 0,
        )
        self._refresh_extend_rows(layer.layer_id)
        return result

    def _refresh_extend_rows(self, layer_id: int) -> None:
        """Split precision: the extend wrote every row's checkpoint in this layer; refresh their read copy."""
        if self.pool.read_state is not None:
            pool_layer = self.req_to_token_pool.mamba_map[layer_id]
            self.pool.refresh_read(self.forward_metadata.mamba_cache_indices, pool_layer)

    def _forward_verify(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        """TARGET_VERIFY of ``T`` tokens per request: SGLang's verify conv (which fills
        ``intermediate_conv_window`` for the commit's rollback), then ``gdn_replay_verify`` on the
        forward's ``VerifyStep``.  Returns ``[1, bs*T, HV, V]`` as SGLang's verify does.

        Snapshot-path forward (``spec.py``, "Snapshot fallback"): the kernel with every row that has
        records flushing and a one-token window folds the committed ring into the checkpoint (outputs discarded; the
        appended record is dropped when the commit empties the ring), then SGLang's own verify runs.
        The conv runs only there: SGLang's conv update shifts the conv state in place, so a second
        conv would read a state already advanced by ``T`` tokens.  The one-token window takes the
        pre-conv inputs: the fold reads committed records only."""
        from sglang.srt.layers.attention.linear.gdn_backend import causal_conv1d_update

        step = self._step
        if not isinstance(step, VerifyStep):
            raise RuntimeError("ReplaySSM: GDN verify without a verify cursor snapshot")
        if not isinstance(mixed_qkv, torch.Tensor):
            raise NotImplementedError("ReplaySSM GDN verify: split (tuple) mixed_qkv is not supported")
        bs = step.slot_idx.shape[0]
        T = mixed_qkv.shape[0] // bs
        if bs * T != mixed_qkv.shape[0] or (T != step.num_tokens and not step.snapshot):
            raise RuntimeError(
                f"ReplaySSM GDN verify: expected {bs} rows x {step.num_tokens} tokens, got {mixed_qkv.shape[0]} "
                "tokens"
            )
        layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_states = layer_cache.conv[0]
        windows = layer_cache.intermediate_conv_window[0]
        pool_layer = self.req_to_token_pool.mamba_map[layer.layer_id]
        rings = self.pool.layer_rings(pool_layer)
        # split precision and stochastic rounding: as in decode
        extra = {**self.pool.layer_read_copy(pool_layer), **self.pool.layer_rounding(pool_layer)}
        x = mixed_qkv.view(bs, T, -1)
        if step.snapshot:
            if mixed_qkv.device.type == "cpu":
                raise NotImplementedError("ReplaySSM CPU GDN: SGLang's snapshot verify has no CPU path")
            xc = x
        elif mixed_qkv.device.type == "cpu":
            from sglang_replayssm.cpu.gdn import gdn_verify_conv_cpu

            xc = gdn_verify_conv_cpu(layer, x, conv_states, step.slot_idx, windows[:bs])
        else:
            md = self.forward_metadata
            xc = causal_conv1d_update(
                x.transpose(1, 2),
                conv_states,
                layer.conv_weights,
                layer.bias,
                layer.activation,
                conv_state_indices=step.slot_idx,
                intermediate_conv_window=windows,
                intermediate_state_indices=self.verify_intermediate_state_indices[:bs],
                retrieve_next_token=md.retrieve_next_token,
                retrieve_next_sibling=md.retrieve_next_sibling,
                retrieve_parent_token=md.retrieve_parent_token,
            ).transpose(1, 2)
        a_w, b_w = a.reshape(bs, T, -1), b.reshape(bs, T, -1)
        if step.snapshot:  # materialise: a one-token window, outputs discarded
            xc, a_w, b_w = xc[:, :1], a_w[:, :1], b_w[:, :1]
            T = 1
        q, k, v = torch.split(xc, [layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        q = q.view(bs, T, layer.num_q_heads, layer.head_q_dim)
        k = k.view(bs, T, layer.num_k_heads, layer.head_k_dim)
        v = v.view(bs, T, layer.num_v_heads, layer.head_v_dim)
        out = xc.new_empty(bs, T, layer.num_v_heads, layer.head_v_dim)
        self._verify(
            layer_cache.temporal,
            rings["u"],
            rings["k"],
            rings["v"],
            rings["g"],
            rings["beta"],
            q,
            k,
            v,
            a_w,
            b_w,
            layer.A_log,
            layer.dt_bias,
            out,
            step.slot_idx,
            step.ring_start,
            step.ring_len,
            step.flush,
            scale=layer.head_k_dim**-0.5,
            use_qk_l2norm=True,
            **extra,
        )
        if step.snapshot:
            return super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        return out.view(1, bs * T, layer.num_v_heads, layer.head_v_dim)

    def forward_decode(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        from sglang.srt.layers.attention.linear.gdn_backend import causal_conv1d_update

        if not isinstance(mixed_qkv, torch.Tensor):
            raise NotImplementedError("ReplaySSM GDN decode: split (tuple) mixed_qkv is not supported")
        step = self._step
        if step is None:
            raise RuntimeError("ReplaySSM: GDN decode without a cursor snapshot")
        layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_states = layer_cache.conv[0]
        ssm_states = layer_cache.temporal
        cache_indices = self.forward_metadata.mamba_cache_indices
        pool_layer = self.req_to_token_pool.mamba_map[layer.layer_id]
        rings = self.pool.layer_rings(pool_layer)
        decode = self._decode
        # Split precision (non-flush rows read the copy, flush rows refresh it) and stochastic
        # rounding of the flush store.
        extra = {**self.pool.layer_read_copy(pool_layer), **self.pool.layer_rounding(pool_layer)}
        if extra:
            decode = functools.partial(self._decode, **extra)
        if mixed_qkv.device.type == "cpu":
            from sglang_replayssm.cpu.gdn import gdn_decode_cpu

            if forward_batch.mamba_track_mask is not None:
                raise NotImplementedError("ReplaySSM CPU GDN: mamba radix tracking (extra_buffer)")
            return gdn_decode_cpu(
                layer,
                mixed_qkv=mixed_qkv,
                a=a,
                b=b,
                conv_state=conv_states,
                ssm_state=ssm_states,
                rings=rings,
                step=step,
                decode_fn=decode,
            )

        mixed_qkv = causal_conv1d_update(
            mixed_qkv,
            conv_states,
            layer.conv_weights,
            layer.bias,
            layer.activation,
            conv_state_indices=cache_indices,
        )
        q, k, v = torch.split(mixed_qkv, [layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        bs = mixed_qkv.shape[0]
        q = q.view(bs, layer.num_q_heads, layer.head_q_dim)
        k = k.view(bs, layer.num_k_heads, layer.head_k_dim)
        v = v.view(bs, layer.num_v_heads, layer.head_v_dim)
        out = mixed_qkv.new_empty(bs, layer.num_v_heads, layer.head_v_dim)
        decode(
            ssm_states,
            rings["u"],
            rings["k"],
            rings["v"],
            rings["g"],
            rings["beta"],
            q,
            k,
            v,
            a,
            b,
            layer.A_log,
            layer.dt_bias,
            out,
            step.slot_idx,
            step.ring_start,
            step.ring_len,
            step.flush,
            scale=layer.head_k_dim**-0.5,
            use_qk_l2norm=True,
            row_order=step.row_order,
        )
        self._track_mamba_state_decode(forward_batch, conv_states, ssm_states, cache_indices, layer.layer_id)
        # SGLang's decode output layout: [1, B, HV, V].
        return out.unsqueeze(0)
