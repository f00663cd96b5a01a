"""Speculative verify on the ReplaySSM rings: the per-forward snapshot, the commit, the conv rollback.

A TARGET_VERIFY forward of ``T`` tokens per request (last accepted token + ``T-1`` drafts, linear
chains only) uses the same slots, records and cursor pair ``(start, len)`` as decode
(``kernels/README.md``, "Speculative verify: cursors and commit"):

1. the metadata build snapshots the cursors of the verify rows once, before any layer runs, and
   decides the flush rows (``replayssm_kernels.verify_cursor_step``; the cursors do not move): a row
   flushes when ``len + T > max(L, T) + T`` (the late rule; Mamba-2's rings hold ``T`` rows more
   for it, ``sizing.ring_rows``);
2. every SSM layer runs its family's verify kernel on that snapshot: outputs of all ``T`` window
   tokens, the window's records appended at logical rows ``len .. len+T-1``, flush rows fold their
   committed history into the checkpoint first;
3. after sampling, SGLang's post-verify commit (``update_mamba_state_after_mtp_verify``, hooked in
   ``hooks/spec.py``) advances the cursors by the accepted counts (``verify_commit``: one launch, no
   host sync) and rolls the conv state back to the last accepted token from SGLang's own
   ``intermediate_conv_window`` (SGLang's rollback, kept as it is).

**Snapshot fallback** (batch buckets the verify plan sends to SGLang's own verify: tree drafts,
``--replayssm-verify snapshot``, or ``auto`` where replay does not pay; CUDA only).  SGLang's verify
reads the checkpoint alone, so each layer first **materialises** the forward's rows: the family's
verify kernel runs with every row whose ring holds records flushing and a one-token window (outputs
discarded), which folds the committed ring into the checkpoint exactly as any flush does (rows with
an empty ring are not flushed: nothing to fold, no checkpoint write); then SGLang's verify runs
unchanged (per-draft states into ``intermediate_ssm``).  SGLang's commit then writes the accepted
state into the checkpoint, after which the rows' rings are emptied (cursors ``(0, 0)``).

Rejected drafts are never folded: they lie past ``len`` and are overwritten by the next step.
Under CUDA graphs the snapshot runs inside the captured graph into per-batch-size static buffers
(``VerifyGraphBuffers``), as the decode snapshot does; the commit runs outside the graph and reads
the buffers of the batch size last replayed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import torch
from replayssm_kernels.commit import verify_commit_ref, verify_cursor_step, verify_cursor_step_ref
from replayssm_kernels.commit._validate import validate_commit
from replayssm_kernels.commit.kernel import verify_commit_fwd

from sglang_replayssm.read_copy_check import check_forward
from sglang_replayssm.spec_plan import FORCED_SOURCES

__all__ = [
    "VerifyGraphBuffers",
    "VerifyMetadataMixin",
    "VerifyStep",
    "build_verify_eager",
    "commit_verify",
    "pin_batch_invariant",
    "rollback_conv",
    "verify_kernel",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyStep:
    """The ring snapshot of the verify rows of one forward (read by every layer and by the commit).

    Attributes
    ----------
    slot_idx : torch.Tensor
        ``[batch]`` int32/int64 physical slot per request, ``-1`` for padding.
    ring_start, ring_len : torch.Tensor
        ``[batch]`` int32 cursor snapshot (padding rows 0).
    flush : torch.Tensor
        ``[batch]`` bool, rows that fold their committed history into the checkpoint this step.
    num_tokens : int
        ``T``, tokens verified per request (1 for a snapshot-path forward: the materialising fold).
    snapshot : bool
        The forward takes SGLang's snapshot verify: every valid row with records flushes (materialise), then the
        stock verify and commit run, then the rows' rings are emptied.
    """

    slot_idx: torch.Tensor
    ring_start: torch.Tensor
    ring_len: torch.Tensor
    flush: torch.Tensor
    num_tokens: int
    snapshot: bool = False


def verify_kernel(family: str, device: torch.device) -> Callable[..., None]:
    """The verify kernel of ``family`` (``"mamba2"`` / ``"gdn"``) for ``device``.

    CUDA: the Triton kernel; CPU: the plain-torch reference with the same signature.
    """
    import replayssm_kernels as rk

    table = {
        ("mamba2", "cuda"): rk.mamba2_replay_verify,
        ("mamba2", "cpu"): rk.mamba2_replay_verify_ref,
        ("gdn", "cuda"): rk.gdn_replay_verify,
        ("gdn", "cpu"): rk.gdn_replay_verify_ref,
    }
    try:
        return table[(family, device.type)]
    except KeyError:
        raise ValueError(
            f"ReplaySSM verify: expected family in (mamba2, gdn) and device cuda or cpu, got {family!r} on {device}"
        ) from None


def pin_batch_invariant(server_args, *kernels: Callable[..., None]) -> tuple[Callable[..., None], ...]:
    """The backend's decode / verify kernels as it should call them: with SGLang's
    ``--enable-deterministic-inference`` (batch-invariant outputs), each with ``batch_invariant=True``, so
    every launch takes one configuration at every batch size (the Mamba-2 kernels no small-batch P-split,
    the GDN decode one value tile per program, the GDN verify window one value tile; kernels/README.md,
    "Batch invariance"); otherwise unchanged (the batch-dependent launches, the measured defaults)."""
    if not server_args.enable_deterministic_inference:
        return kernels
    return tuple(functools.partial(k, batch_invariant=True) for k in kernels)


def _cursor_step(cursors: torch.Tensor):
    """The cursor step for ``cursors``' device: CUDA the one-launch Triton kernel, CPU the torch
    reference (same signature and effects)."""
    return verify_cursor_step if cursors.device.type == "cuda" else verify_cursor_step_ref


def build_verify_eager(
    *, cursors: torch.Tensor, slot_idx: torch.Tensor, window: int, rows: int, num_tokens: int,
    snapshot: bool = False,
) -> VerifyStep:
    """Snapshot the cursors of an eager verify forward (cursors unchanged).

    Parameters
    ----------
    cursors : torch.Tensor
        The pool's ``[slots, 2]`` int32 cursors (read only).
    slot_idx : torch.Tensor
        ``[batch]`` slot per request (``-1`` padding).
    window, rows, num_tokens : int
        ``L``, ``R`` and ``T``; ``R >= max(L, T) + T`` (``ValueError`` otherwise).
    snapshot : bool
        A snapshot-path forward: every valid row with a non-empty ring flushes, one-token window
        (``num_tokens`` ignored).

    Rows flush by the late rule (``len + T > max(L, T) + T``; ``sizing.ring_rows`` sizes the rings
    for it).
    """
    n = slot_idx.shape[0]
    dev = slot_idx.device
    out_start = torch.empty(n, dtype=torch.int32, device=dev)
    out_len = torch.empty(n, dtype=torch.int32, device=dev)
    out_flush = torch.empty(n, dtype=torch.bool, device=dev)
    t = 1 if snapshot else num_tokens
    # Snapshot path: valid rows whose ring holds records fold first (``flush_nonempty``). An empty
    # ring already has its whole state in the checkpoint; not flushing it spares the checkpoint
    # write (in steady snapshot operation every ring is empty: the commit empties it).
    _cursor_step(cursors)(cursors, slot_idx, None, window, rows, t, out_start, out_len, out_flush,
                          flush_nonempty=snapshot, late_flush=True)
    return VerifyStep(slot_idx=slot_idx, ring_start=out_start, ring_len=out_len, flush=out_flush,
                      num_tokens=t, snapshot=snapshot)


class VerifyGraphBuffers:
    """Static per-batch-size snapshot buffers for CUDA-graph TARGET_VERIFY forwards.

    ``view(bs, slots)`` returns the ``VerifyStep`` whose tensors are the buffers of batch size
    ``bs`` (what the captured kernels read by address); ``fill(bs, cursors, slots)`` runs the
    snapshot into them (recorded inside the graph, so every replay refreshes them on the device).
    """

    def __init__(self, max_bs: int, num_tokens: int, device: torch.device | str) -> None:
        self.max_bs = max_bs
        self.num_tokens = num_tokens
        self.ring_start = [torch.zeros(i + 1, dtype=torch.int32, device=device) for i in range(max_bs)]
        self.ring_len = [torch.zeros(i + 1, dtype=torch.int32, device=device) for i in range(max_bs)]
        self.flush = [torch.zeros(i + 1, dtype=torch.bool, device=device) for i in range(max_bs)]

    def _check(self, bs: int, slots: torch.Tensor) -> int:
        if not 1 <= bs <= self.max_bs:
            raise ValueError(f"bs: expected 1..{self.max_bs}, got {bs}")
        if slots.shape[0] != bs:
            raise ValueError(f"slots: expected [{bs}], got {tuple(slots.shape)}")
        return bs - 1

    def view(self, bs: int, slots: torch.Tensor, snapshot: bool = False) -> VerifyStep:
        i = self._check(bs, slots)
        return VerifyStep(slot_idx=slots, ring_start=self.ring_start[i], ring_len=self.ring_len[i],
                          flush=self.flush[i], num_tokens=1 if snapshot else self.num_tokens, snapshot=snapshot)

    def fill(self, bs: int, *, cursors: torch.Tensor, slots: torch.Tensor, window: int, rows: int,
             snapshot: bool = False) -> None:
        i = self._check(bs, slots)
        # One launch on CUDA (recorded in the graph), the rule and flush_nonempty as in build_verify_eager.
        _cursor_step(cursors)(cursors, slots, None, window, rows, 1 if snapshot else self.num_tokens,
                              self.ring_start[i], self.ring_len[i], self.flush[i],
                              flush_nonempty=snapshot, late_flush=True)


def commit_verify(
    cursors: torch.Tensor, step: VerifyStep, accepted: torch.Tensor, *, window: int, rows: int,
    accepted_offset: int = 0,
) -> None:
    """Advance the cursors of ``step``'s rows by ``accepted + accepted_offset`` (bonus token
    included, ``1..T``): ``accepted_offset=1`` takes SGLang's ``last_correct_step_indices`` as it
    is (the ``+ 1`` and the int32 cast happen in the kernel).

    ``accepted`` may be shorter than the batch (SGLang passes per-request counts of the real rows
    first); rows beyond ``accepted`` are padding and must carry slot ``-1``.  CUDA: one Triton
    launch on the current device (the server's), no slicing; CPU: the reference.  Arguments are
    validated on every call (metadata only: no device sync).
    """
    n = step.slot_idx.shape[0]
    m = accepted.shape[0]
    if m > n:
        raise ValueError(f"accepted: expected at most {n} rows (the verify batch), got {m}")
    if cursors.device.type != "cuda":
        verify_commit_ref(cursors, step.slot_idx[:m], step.ring_start[:m], step.ring_len[:m],
                          step.flush[:m], accepted, window=window, ring_size=rows,
                          num_tokens=step.num_tokens, accepted_offset=accepted_offset)
        return
    _commit_launch(cursors, step, accepted, window=window, rows=rows, accepted_offset=accepted_offset)


def _commit_launch(cursors: torch.Tensor, step: VerifyStep, accepted: torch.Tensor, *, window: int,
                   rows: int, accepted_offset: int) -> None:
    """``commit_verify``'s CUDA path (also runs under ``TRITON_INTERPRET`` on CPU tensors: tests):
    validate, then the launcher on the current device."""
    m = accepted.shape[0]
    validate_commit(cursors, step.slot_idx[:m], step.ring_start[:m], step.ring_len[:m], step.flush[:m],
                    accepted, window, rows, step.num_tokens, None, accepted_offset)
    if cursors.device.type == "cuda" and cursors.device.index not in (None, torch.cuda.current_device()):
        raise ValueError(f"cursors: expected the current CUDA device "
                         f"({torch.cuda.current_device()}), got {cursors.device}")
    verify_commit_fwd(cursors, step.slot_idx, step.ring_start, step.ring_len, step.flush,
                      accepted, window=window, ring_size=rows, num_tokens=step.num_tokens,
                      accepted_offset=accepted_offset)


def rollback_conv(
    conv: torch.Tensor, windows: torch.Tensor, slots: torch.Tensor, last_step: torch.Tensor
) -> None:
    """Set each request's conv state to its window after the last accepted token (all layers).

    Parameters
    ----------
    conv : torch.Tensor
        ``[layers, slots, dim, K-1]`` SGLang's conv state pool (in place).
    windows : torch.Tensor
        ``[layers, batch, T, dim, K-1]`` SGLang's ``intermediate_conv_window`` (any strides: an
        overlapping view), indexed by the request's row in the verify batch.
    slots : torch.Tensor
        ``[requests]`` slot per request (``-1``: skipped).
    last_step : torch.Tensor
        ``[requests]`` window step of the last accepted token (``accepted - 1``; ``< 0``: skipped).

    CUDA tensors go to SGLang's ``fused_conv_window_scatter_with_mask`` (its own rollback); CPU
    tensors to the same gather/scatter in torch.
    """
    if slots.shape != last_step.shape:
        raise ValueError(
            f"slots / last_step: expected equal shapes, got {tuple(slots.shape)} / {tuple(last_step.shape)}"
        )
    if conv.is_cuda:
        from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_conv_window_scatter_with_mask

        fused_conv_window_scatter_with_mask(conv, windows, slots, last_step)
        return
    rows = torch.arange(slots.shape[0], device=slots.device)
    ok = (slots >= 0) & (last_step >= 0)
    rows, s, t = rows[ok], slots[ok].long(), last_step[ok].long()
    conv[:, s] = windows[:, rows, t].to(conv.dtype)


def _capture_buckets(model_runner, device: torch.device) -> list[int] | None:
    """The verify batch sizes SGLang will capture as CUDA graphs (its own ``get_batch_sizes_to_capture``
    at the verify's tokens per request: the configured list clamped to the request pool); ``None``
    without CUDA graphs (``spec_plan.verify_buckets`` then decides ``max_batch`` alone)."""
    if device.type != "cuda" or model_runner.server_args.disable_cuda_graph:
        return None
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

    capture_bs, _ = get_batch_sizes_to_capture(model_runner, model_runner.decode_num_tokens_per_req())
    return list(capture_bs)


class VerifyMetadataMixin:
    """TARGET_VERIFY metadata and commit of both ReplaySSM backends (first in the bases).

    The host sets ``pool``, ``window``, ``rows``, ``device``, ``num_tokens`` (``T``; 0 without
    speculative decoding) and ``_verify_graph = None``, ``_last_verify = None``, and inherits
    ``GraphMetadataMixin`` and SGLang's backend after this class.  Decode forwards pass through to
    ``GraphMetadataMixin`` untouched.
    """

    def _init_spec(self, model_runner) -> None:
        """Target backends with speculative decoding: decide and log each bucket's verify path
        (``spec_plan.plan_for_server``; refuses what is not built).  Draft workers: nothing."""
        self.verify_plan = None
        if self.num_tokens and not self.is_draft_worker:
            from sglang_replayssm.spec_plan import plan_for_server, pool_snapshot_batch_limit

            device = torch.device(self.device)
            self.verify_plan = plan_for_server(self.pool, model_runner.server_args, device,
                                               max_batch=model_runner.max_running_requests,
                                               capture_bs=_capture_buckets(model_runner, device))
            self._snapshot_limit = pool_snapshot_batch_limit(self.pool)

    def _snapshot_path(self, bs: int) -> bool:
        """Whether a verify forward of ``bs`` rows takes SGLang's snapshot verify: the decision of the
        smallest planned bucket ``>= bs``; no plan (tests, drafts): replay.

        The plan's buckets include the model runner's maximum of running requests
        (``spec_plan.verify_buckets``), so eager forwards past the largest CUDA graph have a decision
        of their own; above every bucket (not expected; a plan built without that maximum) the largest
        bucket's decision holds, except that a heuristic (``auto``) snapshot decision moves to replay above
        ``spec_plan.snapshot_batch_limit`` (its commit scatter would overflow), logged once; a forced
        snapshot (``spec_plan.FORCED_SOURCES``: an override, tree drafts, a GDN draft length past the
        replay kernel's) keeps the snapshot path there (startup refused it where the server's maximum of
        running requests passes that limit)."""
        plan = getattr(self, "verify_plan", None)
        if not plan:
            return False
        fits = [b for b in plan if b >= bs]
        if fits:
            return plan[min(fits)].path == "snapshot"
        decision = plan[max(plan)]
        if decision.path != "snapshot":
            return False
        if decision.source not in FORCED_SOURCES and bs > self._snapshot_limit:
            if not getattr(self, "_logged_eager_overflow", False):
                logger.info(
                    "ReplaySSM verify: eager batches above %d rows (the largest CUDA-graph bucket is %d) take the "
                    "replay verify: SGLang 0.5.17's snapshot commit overflows int32 offsets there",
                    self._snapshot_limit, max(plan),
                )
                self._logged_eager_overflow = True
            return False
        return True

    def _snapshot_verify(self, slots: torch.Tensor) -> VerifyStep:
        """Eager verify forward: snapshot the cursors of ``slots`` (the forward's requests)."""
        if not self.num_tokens:
            raise RuntimeError("ReplaySSM: TARGET_VERIFY forward on a server without speculative decoding")
        step = build_verify_eager(cursors=self.pool.cursors, slot_idx=slots, window=self.window,
                                  rows=self.rows, num_tokens=self.num_tokens,
                                  snapshot=self._snapshot_path(slots.shape[0]))
        self._last_verify = step
        return step

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        if self.num_tokens:
            self._verify_graph = VerifyGraphBuffers(max_bs, self.num_tokens, self.device)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if not forward_batch.forward_mode.is_target_verify():
            self._graph_verify_bs = None
            return super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        if self._verify_graph is None:
            raise RuntimeError("ReplaySSM: graph TARGET_VERIFY forward without verify buffers")
        # SGLang's own metadata (static slot buffer refreshed in place); skip the decode-only mixin.
        from sglang_replayssm.metadata import GraphMetadataMixin

        super(GraphMetadataMixin, self).init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        bs = forward_batch.batch_size
        self._graph_bs = None
        self._graph_verify_bs = bs
        self._step = self._verify_graph.view(bs, self.forward_metadata.mamba_cache_indices[:bs],
                                             snapshot=self._snapshot_path(bs))
        self._last_verify = self._step
        if not in_capture:  # debug only ($SGLANG_REPLAYSSM_CHECK_READ_COPY)
            check_forward(self, self.forward_metadata.mamba_cache_indices[:bs], "verify graph")

    def init_forward_metadata_in_graph(self, forward_batch):
        bs = getattr(self, "_graph_verify_bs", None)
        if bs is None:
            return super().init_forward_metadata_in_graph(forward_batch)
        self.pool.advance_rounding()  # recorded in the graph: new rounding bits per replay
        self._verify_graph.fill(bs, cursors=self.pool.cursors,
                                slots=self.forward_metadata.mamba_cache_indices[:bs],
                                window=self.window, rows=self.rows, snapshot=self._snapshot_path(bs))

    def commit_after_verify(self, last_correct_step_indices: torch.Tensor,
                            stock_commit: Callable[[], None]) -> None:
        """SGLang's post-verify commit.

        Replay path: cursors advanced by the accepted counts, conv rolled back; ``temporal`` untouched.
        Snapshot path: ``stock_commit()`` (SGLang writes the accepted per-draft state into the
        checkpoint and rolls the conv back), then the rows' rings are emptied and their read copies
        (split precision) refreshed from the new checkpoints.
        ``last_correct_step_indices [requests]`` is SGLang's window step of each request's last
        accepted token (``accepted - 1`` for a linear chain).
        """
        step = self._last_verify
        if step is None:
            raise RuntimeError("ReplaySSM: post-verify commit without a preceding verify forward")
        self._last_verify = None
        m = last_correct_step_indices.shape[0]
        if step.snapshot:
            stock_commit()
            self.pool.reset_slots(step.slot_idx[:m])
            self.pool.refresh_read(step.slot_idx[:m])  # split precision: the copy follows the commit
            return
        # a = last_correct_step_indices + 1, in the commit kernel (no host-side launches for it).
        commit_verify(self.pool.cursors, step, last_correct_step_indices, window=self.window,
                      rows=self.rows, accepted_offset=1)
        spec_state = self.req_to_token_pool.get_speculative_mamba2_params_all_layers()
        for conv, windows in zip(spec_state.conv, spec_state.intermediate_conv_window):
            rollback_conv(conv, windows, step.slot_idx[:m], last_correct_step_indices)
