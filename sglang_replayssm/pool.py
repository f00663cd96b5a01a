"""``ReplayMambaPool``: SGLang's ``MambaPool`` plus the ReplaySSM rings and cursors.

The checkpoint is SGLang's own ``temporal`` tensor.  This pool adds, per linear-attention layer, the
ring tensors of ``sizing.ring_spec`` (``[layers, slots, heads, R, ...]``) and, per slot, one int32
cursor pair ``(start, len)`` shared by all layers (``kernels/README.md``).  Slot 0 is SGLang's null
slot (never allocated; CUDA-graph warmup and padding rows write there).

Cursor rules (``anchors.md`` section 4, "stale cursors"): a slot's ring is emptied whenever its
checkpoint is written from outside the ring protocol:

- allocation: ``HybridReqToTokenPool.alloc`` marks a fresh slot ``mamba_needs_clear``, and SGLang runs
  the deferred ``clear_slots`` on the forward stream before the request's first (extend) forward
  reads the pool; ``clear_slots`` resets the cursors here, and the extend metadata resets them again
  (``metadata.reset_extend_rows``).  A request refused after the allocation frees the slot unused.
  ``start`` needs no reset: with ``len == 0`` no row is read.
- ``clear_slots``: reset here.
- ``copy_from`` (copy-on-write destination, chunked-prefill donation): the destination takes the
  source's cursors with its checkpoint; SGLang's sources have empty rings (``radix.py``), checked on
  the device, and ``carry_ring=True`` forks a source with records whole.
- prefill / extend: the metadata build resets the rows it extends (``metadata.py``).
- radix donation (``hooks/radix.py``): a tree slot's cursors are zeroed after its ring was folded
  into its checkpoint (``no_buffer``) or its checkpoint was copied from a flush row (``extra_buffer``).
- offload / reload (``get_cpu_copy`` / ``load_cpu_copy``, PD decode retraction): the rings and
  cursors travel with the checkpoint, so a reloaded slot continues exactly.

The pool does **not** expose its cursors as SGLang's ``replayssm_write_pos`` (it stays ``None``, as
``MambaPool`` sets it without the built-in ring).  SGLang's uses of that name are all gated on it
being set, and each is covered above or refused: the alloc reset (indexing with the request's 0-d
device slot: a host sync per admitted request), the finished-request cap in ``MambaComponent``
(three syncs per finish, and a no-op after our hook has folded the ring), ``MambaPool.copy_from``'s
reset (overridden), the CPU offload cursors (overridden; PD is refused), the legacy
``MambaRadixCache`` (only reached through HiCache, refused) and the built-in ring's metadata and
kernels (gated on ``enable_linear_replayssm``, which the pool refuses).

Stochastic rounding (``--enable-mamba-cache-stochastic-rounding``, fp16 ``temporal``): one int64
counter ``sr_seed`` on the device, advanced once per forward by the backends' metadata build (in the
captured graph too, so every replay draws new bits; no host sync) and by radix materialisation;
the kernels that write a checkpoint take it with the pool layer index (``layer_rounding``).

Split precision (``--replayssm-read-dtype``): per layer a read copy ``read_state`` of the checkpoint
(``[layers, slots, ...]`` as ``temporal``, bf16 / fp16 / fp8 e4m3) and for fp8 its per-row scales
``read_scale`` (``[layers, slots, ...]`` as ``temporal`` without the last dim).  Invariant: for every
slot the copy is ``quantize_rows`` of the checkpoint as stored.  The decode kernels keep it on flush
rows; everything else that writes a checkpoint refreshes it with ``refresh_read`` (on CUDA one fused
launch, ``replayssm_kernels.read_copy_refresh``; padding entries write nothing): extend forwards
(the backends, per layer), ``clear_slots``, ``copy_from`` (the destination is refreshed from its new
checkpoint, so a source written by SGLang's radix track-copy is never carried stale), reload and
radix materialisation.

Speculative decoding (``T`` draft tokens): with ``--replayssm-verify replay`` on linear drafts (any
device) and on a CPU pool, the parent is built without speculation and ``_install_speculative_state``
adds SGLang's speculative state in SGLang's own layout for the device; with replay verify only it has
no ``intermediate_ssm`` (``T`` full states per row, read only by SGLang's snapshot verify), which is
then never allocated, not even for a moment at start-up.  Otherwise (``auto`` / ``snapshot``, tree
drafts, on a GPU) SGLang's ``MambaPool.__init__`` builds it unchanged.

The rings are attributes of the pool, not fields of ``MambaPool.State``: PD transfer iterates the
state's fields, and the rings must not be sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache import memory_pool as _mp
from sglang.srt.mem_cache.memory_pool import MambaPool

from replayssm_kernels.read_copy_refresh import refresh_read_copy, refresh_read_copy_ref

from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.radix import assert_all
from sglang_replayssm.sizing import RingSpec, ring_spec
from sglang_replayssm.tp import TPLayout

__all__ = ["ReplayPoolSpec", "ReplayMambaPool", "read_copy_bytes_per_slot"]

logger = logging.getLogger(__name__)
_GB = 1 << 30


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayPoolSpec:
    """What the pool cannot learn from SGLang's constructor arguments.

    Attributes
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"``.
    window : int
        Decode window ``L``.
    act_dtype : torch.dtype
        Model activation dtype (ring records are stored in it).
    layout : TPLayout or None
        This rank's shard of SSM heads and groups (``sglang_replayssm.tp``); when given, SGLang's
        per-rank cache shape must match it (``sizing.ring_spec``).
    read_dtype : torch.dtype or None
        Split precision: the read copy's dtype (bf16, fp16, fp8 e4m3), or None for no copy.
    stochastic_rounding : bool
        Store the fp16 checkpoint with stochastic rounding at every flush (SGLang's
        ``--enable-mamba-cache-stochastic-rounding``); needs an fp16 ``temporal``.
    """

    family: str
    window: int
    act_dtype: torch.dtype
    layout: TPLayout | None = None
    read_dtype: torch.dtype | None = None
    stochastic_rounding: bool = False


def read_copy_bytes_per_slot(
    temporal_shape: tuple[int, ...], num_layers: int, read_dtype: torch.dtype | None
) -> int:
    """Bytes of one slot's read copy over ``num_layers`` layers (fp8: plus its fp32 row scales).

    Parameters
    ----------
    temporal_shape : tuple of int
        One slot's checkpoint shape in one layer (SGLang's ``cache_params.shape.temporal``).
    num_layers : int
        SSM layers on this rank.
    read_dtype : torch.dtype or None
        The copy's dtype; None gives 0.
    """
    if read_dtype is None:
        return 0
    elems = 1
    for d in temporal_shape:
        elems *= int(d)
    per_layer = elems * torch.empty((), dtype=read_dtype).element_size()
    if read_dtype == torch.float8_e4m3fn:
        per_layer += elems // int(temporal_shape[-1]) * 4
    return num_layers * per_layer


class ReplayMambaPool(MambaPool):
    """``MambaPool`` with ReplaySSM rings and per-slot cursors.

    Parameters
    ----------
    replay : ReplayPoolSpec
        Family, window and activation dtype.
    **kwargs
        ``MambaPool``'s keyword-only arguments, as ``HybridReqToTokenPool._init_mamba_pool`` passes
        them.

    Attributes
    ----------
    ring_spec : RingSpec
        Shapes and bytes.
    rings : dict[str, torch.Tensor]
        ``name -> [layers, slots, heads, R, ...]`` (see ``sizing``).
    cursors : torch.Tensor
        ``[slots, 2]`` int32 ``(start, len)``.
    replayssm_write_pos : None
        Always None: SGLang's built-in ring cursor, not ours (see the module docstring).
    fold_A : list[torch.Tensor] or None
        Mamba-2: each layer's ``A`` (``[H]``), set by ``hooks/pool.py``; read by
        ``radix_materialise.materialise_slot``.  None for GDN (its records carry their gates).
    fold_inputs : dict[str, torch.Tensor] or None
        The neutral token's inputs of ``radix_materialise`` (built there on first use).
    read_state : torch.Tensor or None
        Split precision: ``[layers, slots, ...]`` read copy of ``temporal`` in ``replay.read_dtype``.
    read_scale : torch.Tensor or None
        fp8 copies: ``[layers, slots, ...]`` fp32 row scales (``temporal``'s shape without the last dim).
    sr_seed : torch.Tensor or None
        Stochastic rounding: ``[1]`` int64 counter on the pool's device (``advance_rounding``).
    """

    def __init__(self, *, replay: ReplayPoolSpec, **kwargs):
        if kwargs.get("enable_linear_replayssm") or kwargs.get("enable_linear_replayssm_spec"):
            raise ValueError(
                "ReplaySSM (--ssm-backend replay) cannot run together with SGLang's built-in "
                "--enable-linear-replayssm / --enable-linear-replayssm-spec; pick one."
            )
        # Speculative verify of T tokens writes T window rows past len: R = max(L, T) + T.
        self.spec_tokens = int(kwargs.get("speculative_num_draft_tokens") or 0)
        # SGLang's snapshot verify (tree drafts, --replayssm-verify auto/snapshot buckets) needs it.
        self._replay_verify_only = not ReplaySSMConfig.from_env().needs_draft_states(
            kwargs.get("speculative_eagle_topk")
        )
        if self.spec_tokens and (torch.device(kwargs["device"]).type == "cpu" or self._replay_verify_only):
            # A CPU pool: SGLang allocates the speculative buffers with device="cuda" hard-coded.  Replay verify
            # only: SGLang would allocate intermediate_ssm (T states per row, several times the pool) that
            # nothing reads.  Either way the parent is built without speculation and the state added here.
            super().__init__(**{**kwargs, "speculative_num_draft_tokens": None})
            self._install_speculative_state(
                spec_state_size=kwargs["spec_state_size"], eagle_topk=kwargs.get("speculative_eagle_topk"),
                cache_params=kwargs["cache_params"],
            )
        else:
            super().__init__(**kwargs)
        cache_params = kwargs["cache_params"]
        num_layers = len(kwargs["mamba_layer_ids"])
        size = kwargs["size"]
        device = kwargs["device"]
        shape = cache_params.shape
        self.replay = replay
        self.ring_spec: RingSpec = ring_spec(
            family=replay.family,
            temporal_shape=tuple(shape.temporal),
            conv_dim=shape.conv[0][0],
            num_k_heads=shape.num_k_heads_per_tp,
            num_layers=num_layers,
            window=replay.window,
            act_dtype=replay.act_dtype,
            spec_tokens=self.spec_tokens,
            layout=replay.layout,
        )
        num_slots = size + 1
        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            self.rings = {
                name: torch.zeros((num_layers, num_slots, *s), dtype=dt, device=device)
                for name, (s, dt) in self.ring_spec.tensors.items()
            }
            self.cursors = torch.zeros((num_slots, 2), dtype=torch.int32, device=device)
        # Not our cursors: SGLang's gated resets and reads of this name would sync (module docstring).
        self.replayssm_write_pos = None
        self.fold_A: list[torch.Tensor] | None = None
        self.fold_inputs: dict[str, torch.Tensor] | None = None
        self.read_state, self.read_scale = self._alloc_read_copy(replay.read_dtype)
        self.sr_seed = self._alloc_rounding(replay.stochastic_rounding)
        ring_bytes = sum(t.numel() * t.element_size() for t in self.rings.values())
        ring_bytes += self.cursors.numel() * self.cursors.element_size()
        self.replay_ring_bytes = ring_bytes
        self.mem_usage += ring_bytes / _GB
        if self.read_state is not None:
            read_bytes = sum(
                t.numel() * t.element_size() for t in (self.read_state, self.read_scale) if t is not None
            )
            self.replay_read_bytes = read_bytes
            self.mem_usage += read_bytes / _GB
            logger.info(
                "ReplaySSM read copy is allocated. read_state=%s %s%s, size: %.3fGB (%d B per slot) beside the "
                "%s checkpoint",
                tuple(self.read_state.shape), self.read_state.dtype,
                "" if self.read_scale is None else f", read_scale={tuple(self.read_scale.shape)} {self.read_scale.dtype}",
                read_bytes / _GB, read_bytes // num_slots, self.mamba_cache.temporal.dtype,
            )
        else:
            self.replay_read_bytes = 0
        logger.info(
            "ReplaySSM rings are allocated. family=%s, window L=%d, rows R=%d, slots=%d, "
            "layers=%d, %s, ring size: %.3fGB (%d B per slot), mamba cache total: %.3fGB",
            replay.family,
            replay.window,
            self.ring_spec.rows,
            num_slots,
            num_layers,
            ", ".join(f"{n}={tuple(t.shape)} {t.dtype}" for n, t in self.rings.items()),
            ring_bytes / _GB,
            self.ring_spec.bytes_per_slot,
            self.mem_usage,
        )

    def _install_speculative_state(self, *, spec_state_size: int, eagle_topk: int | None, cache_params) -> None:
        """Add SGLang's speculative state to a pool built without speculation (a CPU pool, or replay verify only).

        Reproduces what SGLang 0.5.17's ``MambaPool.__init__`` sets up when
        ``speculative_num_draft_tokens`` (``T``) is given, which SGLang's verify and commit read (the conv
        rollback, ``scatter_mamba_states_after_mtp_verify``: ``fused_conv_window_scatter_with_mask``; the conv
        kernels' ``intermediate_conv_window``), with ``rows = spec_state_size + 1``:

        - ``mamba_cache``: a ``SpeculativeState`` (the pool's ``State`` fields plus the two below);
        - ``intermediate_ssm``: ``[layers, rows, T, *temporal]`` in the state dtype, zeroed; allocated only
          where SGLang's snapshot verify may read it (not with ``--replayssm-verify replay`` on linear
          drafts: ``None``, as SGLang itself leaves it under its own ``--enable-linear-replayssm-spec``);
        - ``intermediate_conv_window``: one tensor per conv shape, logical shape
          ``[layers, rows, T, *conv_shape]`` in the conv dtype, zeroed.  Its layout follows SGLang's rule
          (``conv_window_dedup_enabled`` and the shape's ``disable_conv_window_dedup``), which gives
          **different layouts on CUDA and on a CPU**:

          - CUDA, linear drafts (``topk <= 1``), not KDA: deduplicated.  ``conv_window_axis`` is set by
            ``_detect_conv_window_axis`` (the axis of length ``K - 1``); per conv shape one physical buffer
            ``[layers, rows, *conv_shape]`` with that axis ``T + K - 2`` long, and the window an overlapping
            ``as_strided`` view of it (strides ``(phys.stride(0), phys.stride(1), window axis stride,
            *phys.stride()[2:])``: step ``t`` is columns ``t .. t + K - 2``);
          - a CPU pool (SGLang's CPU rule), tree drafts, KDA, or dedup disabled: dense, one contiguous
            ``[layers, rows, T, *conv_shape]`` per conv shape; view and physical buffer coincide;
        - ``_intermediate_conv_window_phys``: the physical conv-window buffers;
        - ``mem_usage``: SGLang's accounting, the state's bytes with the windows charged at their physical
          size (``mem_usage_bytes() - views + physical``).

        Allocated in SGLang's regions (the memory saver's KV-cache region; the custom memory pool when
        ``SGLANG_MOONCAKE_CUSTOM_MEM_POOL`` set one), on the pool's own device: SGLang hard-codes
        ``device="cuda"``, the current GPU, which is the pool's (``"cuda"``) on a GPU server and does not
        exist on a CPU one.  NPU's transposed layout is not reproduced (the plug-in runs on CUDA and CPUs).
        SGLang's ``Mamba Cache is allocated`` line (logged by the parent without speculation) is followed
        by the plug-in's ``ReplaySSM speculative state is allocated`` line with the same size fields.
        """
        state = self.mamba_cache
        temporal = state.temporal
        device = temporal.device
        shape = cache_params.shape
        T = self.spec_tokens
        rows = spec_state_size + 1
        # The module flags SGLang's own __init__ reads; a CPU pool takes SGLang's CPU layout.
        on_cpu = device.type == "cpu" or _mp._is_cpu
        dedup = not shape.disable_conv_window_dedup and _mp.conv_window_dedup_enabled(
            _mp._is_npu, on_cpu, eagle_topk, cache_params.is_kda)
        with (
            self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE),
            torch.cuda.use_mem_pool(self.custom_mem_pool) if self.enable_custom_mem_pool else contextlib.nullcontext(),
        ):
            ssm = None if self._replay_verify_only else torch.zeros(
                (temporal.shape[0], rows, T, *temporal.shape[2:]), dtype=temporal.dtype, device=device)
            phys, windows = [], []
            if dedup:
                self.conv_window_axis = self._detect_conv_window_axis(shape.conv, shape.conv_kernel - 1)
            for conv, conv_shape in zip(state.conv, shape.conv, strict=True):
                conv_shape = tuple(conv_shape)
                if dedup:
                    axis = self.conv_window_axis % len(conv_shape)
                    physical = list(conv_shape)
                    physical[axis] = T + conv_shape[axis] - 1
                    buf = torch.zeros((conv.shape[0], rows, *physical), dtype=conv.dtype, device=device)
                    inner = buf.stride()[2:]
                    view = buf.as_strided((buf.shape[0], rows, T, *conv_shape),
                                          (buf.stride(0), buf.stride(1), inner[axis], *inner))
                else:
                    buf = view = torch.zeros((conv.shape[0], rows, T, *conv_shape), dtype=conv.dtype, device=device)
                phys.append(buf)
                windows.append(view)
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        self.mamba_cache = self.SpeculativeState(**fields, intermediate_ssm=ssm, intermediate_conv_window=windows)
        self._intermediate_conv_window_phys = phys
        mem = self.mamba_cache.mem_usage_bytes() - _mp.get_tensor_size_bytes(windows) + _mp.get_tensor_size_bytes(phys)
        self.mem_usage = mem / _GB
        logger.info(
            "ReplaySSM speculative state is allocated. device=%s, draft tokens T=%d, rows=%d, conv windows %s, "
            "%s intermediate_conv_window_cache size: %.2fGB",
            device, T, rows, "deduplicated" if dedup else "dense",
            "intermediate_ssm not allocated (--replayssm-verify replay, linear drafts: no per-draft SSM state)"
            if ssm is None else f"intermediate_ssm_state_cache size: {_mp.get_tensor_size_bytes(ssm) / _GB:.2f}GB",
            _mp.get_tensor_size_bytes(phys) / _GB,
        )

    def _alloc_read_copy(self, dtype: torch.dtype | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Allocate the split-precision read copy (and fp8 scales), filled from the checkpoint."""
        if dtype is None:
            return None, None
        temporal = self.mamba_cache.temporal
        if dtype == temporal.dtype:
            raise ValueError(
                f"ReplaySSM: --replayssm-read-dtype gives the checkpoint's own dtype {dtype} (--mamba-ssm-dtype); "
                "use --replayssm-read-dtype same, or a narrower read dtype"
            )
        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            read_state = torch.empty(temporal.shape, dtype=dtype, device=temporal.device)
            read_scale = (
                torch.empty(temporal.shape[:-1], dtype=torch.float32, device=temporal.device)
                if dtype == torch.float8_e4m3fn else None
            )
        # Every slot of every layer, in place (CUDA: the fused kernel, no checkpoint-sized temporaries).
        refresh = refresh_read_copy if temporal.device.type == "cuda" else refresh_read_copy_ref
        refresh(temporal, read_state, read_scale, torch.arange(temporal.shape[1], device=temporal.device))
        return read_state, read_scale

    def _alloc_rounding(self, enabled: bool) -> torch.Tensor | None:
        """Stochastic rounding: the per-forward counter (``None`` when off); the checkpoint must be fp16."""
        if not enabled:
            return None
        dtype = self.mamba_cache.temporal.dtype
        if dtype != torch.float16:
            raise ValueError(
                f"ReplaySSM: stochastic rounding stores an fp16 checkpoint, got --mamba-ssm-dtype {dtype}; "
                "use --mamba-ssm-dtype float16 or drop --enable-mamba-cache-stochastic-rounding"
            )
        logger.info("ReplaySSM: fp16 checkpoints are stored with stochastic rounding at every flush")
        return torch.zeros(1, dtype=torch.int64, device=self.mamba_cache.temporal.device)

    # ------------------------------------------------------------------ views for the kernels

    def layer_rounding(self, layer_idx: int) -> dict[str, torch.Tensor | int]:
        """Kernel keywords for one layer's checkpoint stores: ``{}`` (round to nearest), or with stochastic
        rounding ``sr_seed`` (the counter) and ``sr_layer`` (the pool layer index)."""
        if self.sr_seed is None:
            return {}
        return {"sr_seed": self.sr_seed, "sr_layer": int(layer_idx)}

    def advance_rounding(self) -> None:
        """Draw new rounding bits for the next forward (no-op without stochastic rounding).  One in-place
        add on the device: no host sync, recorded by CUDA-graph capture."""
        if self.sr_seed is not None:
            self.sr_seed.add_(1)

    def layer_read_copy(self, layer_idx: int) -> dict[str, torch.Tensor | None]:
        """Decode-kernel keywords for one layer: ``{}`` without a copy, else ``read_state`` / ``read_scale``
        views ``[slots, ...]`` (pool layer index)."""
        if self.read_state is None:
            return {}
        return {
            "read_state": self.read_state[layer_idx],
            "read_scale": None if self.read_scale is None else self.read_scale[layer_idx],
        }

    def refresh_read(self, indices: torch.Tensor, layer_idx: int | None = None) -> None:
        """Rewrite the read copy of ``indices`` from their checkpoints (no-op without a copy).

        On CUDA one fused launch (``replayssm_kernels.refresh_read_copy``: each touched checkpoint
        row read once, the copy and fp8 scales written once, no temporaries, no host sync); on a CPU
        pool the torch reference ``refresh_read_copy_ref`` (same bits).  Padding entries (``-1``)
        write nothing (the null slot 0's copy included).

        Parameters
        ----------
        indices : torch.Tensor
            ``[k]`` (or any shape, flattened) integer slots; ``-1`` is padding.
        layer_idx : int, optional
            One pool layer (after that layer's extend), or every layer when None.
        """
        if self.read_state is None:
            return
        idx = indices.reshape(-1)
        if idx.dtype not in (torch.int32, torch.int64):
            idx = idx.to(torch.int64)
        idx = idx.to(device=self.read_state.device)
        if idx.numel() == 0:
            return
        temporal = self.mamba_cache.temporal
        refresh = refresh_read_copy if temporal.device.type == "cuda" else refresh_read_copy_ref
        refresh(temporal, self.read_state, self.read_scale, idx,
                layer_idx=None if layer_idx is None else int(layer_idx))

    def layer_rings(self, layer_idx: int) -> dict[str, torch.Tensor]:
        """Per-layer ring views ``name -> [slots, heads, R, ...]`` (pool layer index)."""
        return {name: t[layer_idx] for name, t in self.rings.items()}

    def reset_slots(self, indices: torch.Tensor) -> None:
        """Empty the rings of ``indices`` (negative entries, i.e. padding, are ignored)."""
        idx = indices.to(device=self.cursors.device, dtype=torch.long).reshape(-1)
        # Padding rows (-1) are sent to the null slot 0, whose cursor is never meaningful.
        idx = idx.clamp(min=0)
        self.cursors.index_fill_(0, idx, 0)

    # ------------------------------------------------------------------ SGLang pool API

    def clear_slots(self, indices: torch.Tensor):
        super().clear_slots(indices)
        self.reset_slots(indices)
        self.refresh_read(indices)

    def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor, *, carry_ring: bool = False):
        """Fork: copy checkpoint, conv state and cursors of ``src`` into ``dst`` (and ring rows on request).

        The destination is the source's logical state (checkpoint + ``len`` records).  SGLang copies
        only sources whose ring is empty: a copy-on-write reads a radix-tree slot (``len == 0``,
        ``radix.py`` invariant T), and the ``no_buffer`` chunked-prefill insert copies the live slot
        right after ``hooks/radix.py`` folded its ring.  With ``len == 0`` the ring rows are never
        read before they are written again, so by default only the cursors are copied (SGLang's own
        ``copy_from`` copies ``temporal`` only and assumes a flushed source, too), and a source with
        records fails a device-side assert (no host sync; on a CPU at once) instead of being
        dropped.  ``carry_ring=True`` also copies the ring rows: a fork of a slot with records
        (tests).  A read copy is refreshed from the destination's new checkpoint.  In place.

        Parameters
        ----------
        src_indices, dst_indices : torch.Tensor
            ``[n]`` integer slot indices, pairwise, disjoint.
        carry_ring : bool
            Copy the ring rows as well, so that a source with records is forked whole.

        Raises
        ------
        RuntimeError
            Without ``carry_ring``, a source with records (on a GPU asynchronously).
        """
        src = src_indices.to(device=self.cursors.device, dtype=torch.long).reshape(-1)
        dst = dst_indices.to(device=self.cursors.device, dtype=torch.long).reshape(-1)
        if src.shape != dst.shape:
            raise ValueError(
                f"copy_from: expected as many destination as source slots, got {tuple(dst.shape)} "
                f"and {tuple(src.shape)}"
            )
        super().copy_from(src_indices, dst_indices)
        cursors = self.cursors[src]
        if carry_ring:
            for t in self.rings.values():
                t[:, dst] = t[:, src]
        else:
            assert_all(
                cursors[:, 1] == 0,
                "ReplaySSM: copy_from of a slot with ring records (fold it first, or carry_ring=True)",
            )
        self.cursors[dst] = cursors
        self.refresh_read(dst)

    def get_cpu_copy(self, indices):
        conv_cpu, temporal_cpu = super().get_cpu_copy(indices)[:2]
        # SGLang passes the request's 0-d slot tensor, and indexing with it gives a view: on a CPU
        # pool `.to("cpu")` is then no copy, and a slot reused before the reload would overwrite the
        # backup (found by tests/integration/test_fuzz_ring.py). Copy explicitly.
        if self.cursors.device.type == "cpu":
            conv_cpu = [c.clone() for c in conv_cpu]
            temporal_cpu = temporal_cpu.clone()
        rings_cpu = {name: t[:, indices].to("cpu", copy=True) for name, t in self.rings.items()}
        cursors_cpu = self.cursors[indices].to("cpu", copy=True)
        return conv_cpu, temporal_cpu, _RingCopy(rings=rings_cpu, cursors=cursors_cpu)

    def load_cpu_copy(self, mamba_cache_cpu, indices):
        conv_cpu, temporal_cpu, ring_copy = mamba_cache_cpu
        if not isinstance(ring_copy, _RingCopy):
            raise TypeError(
                f"ReplayMambaPool.load_cpu_copy: expected a copy made by ReplayMambaPool.get_cpu_copy, "
                f"got a third element of type {type(ring_copy).__name__}"
            )
        super().load_cpu_copy((conv_cpu, temporal_cpu), indices)
        for name, t in self.rings.items():
            t[:, indices] = ring_copy.rings[name].to(t.device)
        self.cursors[indices] = ring_copy.cursors.to(self.cursors.device)
        # The copy is a function of the checkpoint: recomputed on reload, not carried.
        self.refresh_read(torch.as_tensor(indices, device=self.cursors.device))


@dataclasses.dataclass(frozen=True)
class _RingCopy:
    """Host copy of some slots' rings and cursors (offload / reload)."""

    rings: dict[str, torch.Tensor]
    cursors: torch.Tensor
