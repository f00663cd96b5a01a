"""Model-checked harness for the ring protocol on a real CPU ``ReplayMambaPool`` (Mamba-2 and GDN).

Used by ``test_fuzz_ring.py`` (hypothesis state machine, seeded random driver, regression cases).

The **system** is SGLang's ``HybridReqToTokenPool`` with our ``ReplayMambaPool`` inside (slot
allocation is SGLang's own code; it leaves a reused slot's cursors stale, since the pool does not
expose them as ``replayssm_write_pos``, and marks the slot ``mamba_needs_clear``: the deferred
``pool.clear_slots`` resets them, as in the server), driven through the public
pieces the integration uses: ``decode_cursor_step_ref`` (what ``metadata`` runs for CPU cursors;
the Triton ``decode_cursor_step`` is checked equal to it in ``tests/kernels``) +
``mamba2_replay_decode_ref`` (GDN: ``gdn_replay_decode_ref``), ``verify_cursor_step`` +
``mamba2_replay_verify_ref`` (GDN: ``gdn_replay_verify_ref``) + ``verify_commit_ref``,
``metadata.build_eager`` for one extend row with its prefix length on the device and the host, as
the backends call it (prefill / extend / radix-hit suffix, after the harness's own
``radix.check_extend_rows`` on every extend row, prefix or not),
``pool.clear_slots``, ``pool.copy_from`` (a fork with ``carry_ring=True`` carries the ring; SGLang's
copies, of empty rings, copy cursors only), ``pool.get_cpu_copy`` /
``pool.load_cpu_copy`` (offload / reload, with SGLang's 0-d ``req.mamba_pool_idx`` as the index),
SGLang's ``free_mamba_cache``, and the radix cache's slot traffic: SGLang's own
``MambaComponent.prepare_for_caching_req`` under our hook (``hooks/radix.py``) donates a finished
request's slot or a copy of an unfinished one's to a tree node, a prefix match allocates a slot
with SGLang's allocator and copies the node into it (``copy_from``, SGLang's deferred COW), and
eviction (LRU or ``--mamba-max-states-per-path``) frees a node's slot.

The **model** keeps per live request, independently of the pool:

- ``S64``: the float64 conventional state after exactly the accepted tokens;
- ``tokens``: the accepted tokens' inputs since the checkpoint was last written from outside
  (prefill / extend / COW), and ``shadow``: the fp32 state after each of them, folded with the
  conventional fp32 update (what ``selective_state_update`` stores), ``shadow[0]`` = that checkpoint;
- ``cur``: the cursor pair ``(start, len)`` that kernels/README.md's rules predict;
- ``ntok``: tokens the request's state covers (the key length SGLang would cache).

and per tree node the fp32 state it must hold and the key length it claims: the donor's fp32
state after all its ``ntok`` tokens (its ring is materialised first; invariant T of
``sglang_replayssm/radix.py``).

``check_all`` (after every operation) asserts for every live slot: the pool's cursors equal the
model's; ring rows ``[0, len)`` hold exactly the last ``len`` accepted tokens (Mamba-2: x, B, Δ;
GDN: raw k, raw v, g, β; all bitwise against the inputs / the kernel's fp32 gate math); the
checkpoint is bit-identical to the fp32 shadow state ``len`` tokens ago; the float64 fold of the
committed records onto the checkpoint equals ``S64``
(relative tolerance ``STATE_RTOL``); and for every tree node: an empty ring and a checkpoint
bit-identical to the node's fp32 state. Each step also checks its outputs (every window token of a
verify, accepted or not, against the float64 recurrence from ``S64``), that padding rows' outputs are
untouched, and that every slot the operation must not write (null slot 0, other live slots, free
slots, offloaded requests' former slots) is bit-identical before and after. Ring rows outside
``[0, len)`` and free slots' checkpoints are NaN-poisoned after every operation, so any read of a
rejected draft, a stale row or a stale checkpoint shows up as NaN.

With a read copy (``read_dtype``, split precision) the references read it on non-flush rows and
refresh it on flush rows, the harness refreshes it after each checkpoint it writes as SGLang's extend
(as the backends do), free slots' copies are NaN-poisoned too, the untouched-slot check covers the
copy and its scales, and ``check_all`` holds every live slot's and tree node's copy to
``quantize_rows`` of its checkpoint bit for bit (``read_copy_check.mismatched_rows``); outputs are
bounded by ``COPY_OUT_TOL`` instead of ``OUT_TOL``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from types import SimpleNamespace

import torch

from replayssm_kernels import (
    decode_cursor_step_ref,
    gdn_conventional_f64,
    gdn_replay_decode_ref,
    gdn_replay_verify_ref,
    mamba2_conventional_f64,
    mamba2_replay_decode_ref,
    mamba2_replay_verify_ref,
    min_ring_size,
    verify_commit_ref,
    verify_cursor_step,
)
from sglang_replayssm.hooks.radix import around_prepare_for_caching_req
from sglang_replayssm.metadata import build_eager
from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
from sglang_replayssm.radix import check_extend_rows
from sglang_replayssm.read_copy_check import mismatched_rows
from sglang_replayssm.sizing import ring_rows

F32, F64 = torch.float32, torch.float64
STATS: collections.Counter = collections.Counter()  # operations run, by kind (for reports)
STATE_RTOL = 2e-5  # ‖materialised − S64‖ / max(‖S64‖, 1)
OUT_TOL = 2e-5  # |y − y64| <= OUT_TOL · (1 + |y64|)
#: With a read copy non-flush outputs come from the rounded checkpoint: the output bound per copy
#: dtype (the copy's bits are checked exactly, ``check_all``; these only bound what it is read for,
#: against gross errors).  Measured maxima of |y − y64| / (1 + |y64|) over 400 sequences of 30
#: operations (thirty-fourth session): bf16 0.013 (Mamba-2), fp8 0.48 (Mamba-2: its outputs sum N
#: products of C with the copy's rows, and with cancellation the copy's 2^-4 relative error is large
#: against |y|; a bound of 0.25 failed 23 of the first ~12,700 Mamba-2 sequences) and 0.037 (GDN).
COPY_OUT_TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float8_e4m3fn: 1.0}


class ProtocolViolation(AssertionError):
    """A check of the harness failed (the message names the operation, slot and quantity)."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its element size (NaN == NaN where the bits agree)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _softplus_f32(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u <= 20.0, torch.log(torch.exp(u) + 1), u)


class Token(dict):
    """One token's mixer inputs for every layer, ``name -> [Ly, ...]`` (attribute access).

    Mamba-2: ``x [Ly,H,P]``, ``dt [Ly,H]``, ``B, C [Ly,G,N]``; GDN: ``q, k [Ly,Hk,K]``,
    ``v [Ly,HV,V]``, ``a, b [Ly,HV]``.
    """

    __getattr__ = dict.__getitem__


@dataclasses.dataclass
class Request:
    rid: int
    sg: SimpleNamespace  # what SGLang's allocator reads and writes
    S64: torch.Tensor  # [Ly, H, P, N] float64
    tokens: list[Token]
    shadow: list[torch.Tensor]  # fp32 [Ly, H, P, N], len(tokens) + 1 entries
    cur: list[int]  # model cursor [start, len]
    offloaded: object | None = None  # get_cpu_copy result while offloaded
    lineage: tuple[int, ...] = ()
    ntok: int = 0  # tokens the state covers


    @property
    def slot(self) -> int | None:
        return None if self.sg.mamba_pool_idx is None else int(self.sg.mamba_pool_idx)


@dataclasses.dataclass
class Node:
    """A radix-tree node's mamba value: the slot, the fp32 state it must hold, its key length."""

    nid: int
    slot: int
    state: torch.Tensor  # fp32 [Ly, H, P, N]
    key_len: int


class RingHarness:
    """A small CPU pool plus the float64 model; every public method is one operation.

    Family-specific parts (shapes, inputs, the fp32 and float64 recurrences, the record check and
    the kernel references) are the ``_family_*`` hooks of ``Mamba2RingHarness`` and
    ``GdnRingHarness``. The state is ``[H, P, N]`` per layer (GDN: ``[HV, V, K]``), outputs
    ``[H, P]`` per token (GDN: ``[HV, V]``).

    Parameters
    ----------
    slots : int
        Allocatable state slots (pool size; slot 0 is the null slot on top).
    window : int
        Decode window ``L``.
    max_tokens : int
        Largest verify ``T``; the ring has ``min_ring_size(L, max_tokens)`` rows.
    layers : int
        Linear-attention layers (each with its own A, dt_bias, D and inputs; one cursor pair).
    seed : int
        Seeds the layer parameters.
    read_dtype : torch.dtype, optional
        Split precision: the pool keeps a read copy of this dtype (``ReplayPoolSpec.read_dtype``);
        the kernel references read and refresh it, the harness refreshes it where the server's
        extend does (``pool.refresh_read``), and ``check_all`` holds every live slot's and tree
        node's copy to ``quantize_rows`` of its checkpoint, bit for bit.
    """

    H, P, N, G = 2, 4, 4, 1
    family = "?"

    def __init__(self, *, slots: int = 4, window: int = 4, max_tokens: int = 3, layers: int = 1,
                 seed: int = 0, offload_0d: bool = False, read_dtype: torch.dtype | None = None):
        from sglang.srt.configs.mamba_utils import (
            Mamba2CacheParams,
            Mamba2StateDType,
            Mamba2StateShape,
        )
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        H, P, N, G = self.H, self.P, self.N, self.G
        self.L, self.Tmax, self.layers = window, max_tokens, layers
        self.offload_0d = offload_0d
        # the served verify rule (the late one: flush when len + T > max(L, T) + T) and its rings
        # (Mamba-2 T rows longer: sizing.ring_rows)
        self.R0 = min_ring_size(window, max_tokens)
        self.R = ring_rows(self.family, window, max_tokens)
        # GDN reads (num_heads, head_dim, state_size, n_groups) as (HV, V, K, Hk).
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=H * P, n_groups=G,
                                        num_heads=H, head_dim=P, state_size=N, conv_kernel=4)
        params = Mamba2CacheParams(shape=shape, layers=list(range(layers)),
                                   dtype=Mamba2StateDType(conv=F32, temporal=F32))
        # The pool sizes its ring as R = window rows (no spec sizing in ReplayPoolSpec yet), so ask
        # for the verify ring size directly; the protocol's L is passed to the cursor functions.
        previous = HybridReqToTokenPool.__dict__["mamba_pool_cls"]
        HybridReqToTokenPool.mamba_pool_cls = functools.partial(
            ReplayMambaPool, replay=ReplayPoolSpec(family=self.family, window=self.R, act_dtype=F32,
                                                   read_dtype=read_dtype))
        try:
            self.hpool = HybridReqToTokenPool(
                size=slots, mamba_size=slots, mamba_spec_state_size=slots, max_context_len=8,
                device="cpu", enable_memory_saver=False, cache_params=params,
                mamba_layer_ids=list(range(layers)), enable_mamba_extra_buffer=False)
        finally:
            HybridReqToTokenPool.mamba_pool_cls = previous
        self.pool: ReplayMambaPool = self.hpool.mamba_pool
        assert self.pool.ring_spec.rows == self.R
        self.temporal = self.pool.mamba_cache.temporal  # [Ly, slots+1, H, P, N]
        self._family_params(torch.Generator().manual_seed(seed))
        self.reqs: dict[int, Request] = {}
        self.nodes: dict[int, Node] = {}
        self.next_nid = 1
        STATS["sequences"] += 1
        self.next_rid = 1
        self.steps = 0
        for t in self.pool.rings.values():
            t.fill_(float("nan"))
        self.temporal.fill_(float("nan"))
        self.temporal[:, 0] = 0  # null slot: written by nobody here
        self.out_tol = OUT_TOL if read_dtype is None else COPY_OUT_TOL[read_dtype]
        self.pool.refresh_read(torch.arange(self.temporal.shape[1]))  # the copy follows (NaN where poisoned)

    # ------------------------------------------------------------------ helpers

    def live(self) -> list[Request]:
        return [r for r in self.reqs.values() if r.offloaded is None]

    def offloaded(self) -> list[Request]:
        return [r for r in self.reqs.values() if r.offloaded is not None]

    def free_slots(self) -> int:
        return min(self.hpool.mamba_allocator.available_size(), self.hpool.available_size())

    def free_mamba_slots(self) -> int:
        return self.hpool.mamba_allocator.available_size()

    _op = "?"

    def _fail(self, what: str) -> None:
        raise ProtocolViolation(f"step {self.steps}: {what}")

    def _snapshot(self) -> dict[str, torch.Tensor]:
        snap = {f"ring_{n}": t.clone() for n, t in self.pool.rings.items()}
        snap["temporal"] = self.temporal.clone()
        snap["cursors"] = self.pool.cursors.clone()
        if self.pool.read_state is not None:
            snap["read_state"] = self.pool.read_state.clone()
            if self.pool.read_scale is not None:
                snap["read_scale"] = self.pool.read_scale.clone()
        for i, c in enumerate(self.pool.mamba_cache.conv):
            snap[f"conv{i}"] = c.clone()
        return snap

    def _check_untouched(self, before: dict[str, torch.Tensor], allowed: set[int], op: str) -> None:
        """Every slot outside ``allowed`` is bit-identical (NaN-aware) in every pool tensor."""
        after = self._snapshot()
        n = self.pool.cursors.shape[0]
        keep = torch.ones(n, dtype=torch.bool)
        for s in allowed:
            keep[s] = False
        for name, old in before.items():
            new = after[name]
            if name == "cursors":
                a, b = old[keep], new[keep]
            else:
                a, b = old[:, keep], new[:, keep]
            # Bitwise comparison that treats NaN == NaN (same bits).
            if not torch.equal(_bits(a), _bits(b)):
                bad = [s for s in range(n) if keep[s] and not torch.equal(
                    _bits(old[s] if name == "cursors" else old[:, s]),
                    _bits(new[s] if name == "cursors" else new[:, s]))]
                self._fail(f"{op}: {name} of slots {bad} changed, but the operation may only write "
                           f"slots {sorted(allowed)}")

    def _poison(self) -> None:
        """NaN into ring rows outside [0, len) of live slots, all rows, checkpoints and read copies of
        free slots."""
        owned = {r.slot: r.cur for r in self.live()}
        owned.update({n.slot: [0, 0] for n in self.nodes.values()})
        for s in range(1, self.pool.cursors.shape[0]):
            if s not in owned:
                for t in self.pool.rings.values():
                    t[:, s] = float("nan")
                self.temporal[:, s] = float("nan")
                for t in (self.pool.read_state, self.pool.read_scale):
                    if t is not None:
                        t[:, s] = float("nan")
                continue
            start, length = owned[s]
            dead = [(start + j) % self.R for j in range(length, self.R)]
            if dead:
                idx = torch.tensor(dead)
                for name, t in self.pool.rings.items():
                    # [Ly, slots, heads, R] (dt, g, beta) or [Ly, slots, heads, R, dim]
                    t[:, s].index_fill_(-1 if t.dim() == 4 else -2, idx, float("nan"))

    def _pad(self, rows: list[Request], pads: list[int]) -> list[Request | None]:
        """Insert padding rows (None) at the given positions."""
        out: list[Request | None] = list(rows)
        for p in pads:
            out.insert(min(p, len(out)), None)
        return out

    # ------------------------------------------------------------------ checks

    def check_all(self) -> None:
        cursors = self.pool.cursors
        if self.pool.read_state is not None:
            owned = [r.slot for r in self.live()] + [n.slot for n in self.nodes.values()]
            bad = mismatched_rows(self.temporal, self.pool.read_state, self.pool.read_scale, torch.tensor(owned))
            if bad:
                self._fail(f"read copy of (layer, slot) {bad} is not quantize_rows of its checkpoint")
        if cursors[0].tolist() != [0, 0]:
            self._fail(f"null slot 0 cursor changed: {cursors[0].tolist()}")
        seen: dict[int, int] = {}
        for n in self.nodes.values():
            if n.slot in seen or n.slot in [r.slot for r in self.live()]:
                self._fail(f"slot {n.slot} of tree node {n.nid} is also owned elsewhere")
            seen[n.slot] = -n.nid
            if cursors[n.slot].tolist() != [0, 0]:
                self._fail(f"tree node {n.nid} slot {n.slot}: cursor {cursors[n.slot].tolist()}, expected an "
                           "empty ring (invariant T)")
            if not torch.equal(self.temporal[:, n.slot], n.state):
                self._fail(f"tree node {n.nid} slot {n.slot}: checkpoint is not the state of its "
                           f"{n.key_len}-token key")
        for r in self.live():
            s = r.slot
            if s in seen:
                self._fail(f"slot {s} owned by {seen[s]} (negative: tree node) and request {r.rid}")
            seen[s] = r.rid
            start, length = cursors[s].tolist()
            if [start, length] != r.cur:
                self._fail(f"req {r.rid} slot {s}: pool cursor {[start, length]} != model {r.cur}")
            if not (0 <= start < self.R and 0 <= length <= self.R0):
                self._fail(f"req {r.rid} slot {s}: cursor {[start, length]} out of range")
            n = len(r.tokens)
            if length > n:
                self._fail(f"req {r.rid} slot {s}: len {length} > {n} tokens since the checkpoint")
            ck = self.temporal[:, s]
            if not torch.equal(ck, r.shadow[n - length]):
                err = (ck - r.shadow[n - length]).abs().max().item()
                self._fail(f"req {r.rid} slot {s}: checkpoint is not the fp32 conventional state "
                           f"{length} tokens ago (max |diff| {err:.3g})")
            for l in range(self.layers):
                Sl = self._family_materialise(l, s, r, start, length)
                ref = r.S64[l]
                err = (Sl - ref).norm().item() / max(ref.norm().item(), 1.0)
                if not err <= STATE_RTOL:
                    self._fail(f"req {r.rid} slot {s} layer {l}: materialised state vs float64 model: "
                               f"relative error {err:.3g}")

    def _check_out(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        ok = (got.to(F64) - want).abs() <= self.out_tol * (1 + want.abs())
        if not bool(ok.all()):
            err = (got.to(F64) - want).abs().max().item()
            self._fail(f"{what}: output differs from the float64 recurrence (max |diff| {err:.3g})")

    # ------------------------------------------------------------------ operations

    def _new_request(self, lineage: tuple[int, ...] = ()) -> Request | None:
        if self.free_slots() < 1:
            return None
        sg = SimpleNamespace(mamba_pool_idx=None, req_pool_idx=None, mamba_needs_clear=False,
                             mamba_ping_pong_track_buffer=None, inflight_middle_chunks=0,
                             kv_committed_len=0)
        if self.hpool.alloc([sg]) is None:
            return None
        s = int(sg.mamba_pool_idx)
        if not sg.mamba_needs_clear:
            # The reset of a reused slot's cursors is the deferred clear_slots this flag asks for.
            self._fail(f"alloc: fresh slot {s} not marked mamba_needs_clear")
        rid = self.next_rid
        self.next_rid += 1
        r = Request(rid=rid, sg=sg, S64=None,  # type: ignore[arg-type]
                    tokens=[], shadow=[], cur=[0, 0],
                    lineage=lineage + (rid,))
        return r

    def _release(self, r: Request) -> None:
        self.hpool.free_mamba_cache(r.sg)
        self.hpool.free(r.sg)

    def prefill(self, seed: int) -> int | None:
        """Allocate a slot (SGLang's alloc), clear it if asked, write a fresh checkpoint, reset."""
        self._op = "prefill"
        self.steps += 1
        before = self._snapshot()
        r = self._new_request()
        if r is None:
            return None
        s = r.slot
        if r.sg.mamba_needs_clear:
            self.pool.clear_slots(torch.tensor([s]))
            r.sg.mamba_needs_clear = False
        g = torch.Generator().manual_seed(seed)
        ck = torch.randn(self.layers, self.H, self.P, self.N, generator=g)
        self._check_extend([s])
        self._write_checkpoint(s, ck)
        self._server_extend(s, 0)
        r.S64, r.tokens, r.shadow, r.cur = ck.to(F64), [], [ck.clone()], [0, 0]
        r.ntok = 1 + seed % 7
        self.reqs[r.rid] = r
        self._check_untouched(before, {s}, "prefill")
        self._after()
        return r.rid

    def extend(self, rid: int, seed: int, k: int) -> None:
        """Chunked-prefill continuation of ``k`` tokens: force-flush first (the ring must be empty
        when a slot enters extend), then write the extended checkpoint and reset the cursors."""
        self._op = "extend"
        r = self.reqs[rid]
        if r.cur[1] > 0:
            self.decode([rid], seed=seed ^ 0x5A5A, force=[True])
        self._op = "extend"
        self.steps += 1
        before = self._snapshot()
        s = r.slot
        g = torch.Generator().manual_seed(seed)
        toks = [self._token(g) for _ in range(k)]
        S = self.temporal[:, s].clone()
        for t in toks:
            S = self._fold32(S, t)
        self._check_extend([s])
        self._write_checkpoint(s, S)
        self._server_extend(s, r.ntok)
        r.ntok += k
        _, r.S64 = self._f64(r.S64, toks)
        r.tokens, r.shadow, r.cur = [], [S.clone()], [0, 0]
        self._check_untouched(before, {s}, "extend")
        self._after()

    def decode(self, rids: list[int], *, seed: int, force: list[bool] | None = None,
               pads: list[int] = ()) -> None:
        """One decode forward over ``rids`` (in this order) with padding rows inserted at ``pads``."""
        self._op = "decode"
        self.steps += 1
        before = self._snapshot()
        reqs = [self.reqs[i] for i in rids]
        force = force or [False] * len(reqs)
        rows = self._pad(reqs, list(pads))
        fl_rows = self._pad(force, list(pads))  # type: ignore[arg-type]
        batch = len(rows)
        g = torch.Generator().manual_seed(seed)
        toks = [self._token(g) if r is not None else self._token(g) for r in rows]
        slot_idx = torch.tensor([r.slot if r is not None else -1 for r in rows], dtype=torch.int32)
        ff = torch.tensor([bool(f) if r is not None else False for r, f in zip(rows, fl_rows)])
        start = torch.empty(batch, dtype=torch.int32)
        length = torch.empty(batch, dtype=torch.int32)
        flush = torch.empty(batch, dtype=torch.bool)
        decode_cursor_step_ref(self.pool.cursors, slot_idx, ff, self.L, self.R, start, length, flush)
        outs = torch.full((self.layers, batch, self.H, self.P), -7.5e30)
        sentinel = outs.clone()
        for l in range(self.layers):
            self._family_decode(l, toks, outs[l], slot_idx, start, length, flush)
        for b, r in enumerate(rows):
            if r is None:
                if not torch.equal(outs[:, b], sentinel[:, b]):
                    self._fail("decode: a padding row's output was written")
                continue
            st, ln = r.cur
            want_flush = ln >= self.L - 1 or bool(fl_rows[b])
            if [int(start[b]), int(length[b]), bool(flush[b])] != [st, ln, want_flush]:
                snap = [int(start[b]), int(length[b]), bool(flush[b])]
                self._fail(f"decode req {r.rid}: snapshot {snap}"
                           f" != model {[st, ln, want_flush]}")
            y64, S64 = self._f64(r.S64, [toks[b]])
            self._check_out(outs[:, b], y64[0], f"decode req {r.rid} slot {r.slot}")
            r.S64 = S64
            r.tokens.append(toks[b])
            r.shadow.append(self._fold32(r.shadow[-1], toks[b]))
            r.ntok += 1
            r.cur = [(st + ln) % self.R, 0] if want_flush else [st, ln + 1]
        self._check_untouched(before, {r.slot for r in reqs}, "decode")
        self._after()

    def verify(self, rids: list[int], *, T: int, accepted: list[int], seed: int,
               force: list[bool] | None = None, pads: list[int] = ()) -> None:
        """One verify forward of ``T`` tokens per row, then the commit with ``accepted`` counts."""
        self._op = "verify"
        self.steps += 1
        before = self._snapshot()
        reqs = [self.reqs[i] for i in rids]
        force = force or [False] * len(reqs)
        rows = self._pad(reqs, list(pads))
        fl_rows = self._pad(force, list(pads))  # type: ignore[arg-type]
        acc_rows = self._pad(accepted, list(pads))  # type: ignore[arg-type]
        batch = len(rows)
        g = torch.Generator().manual_seed(seed)
        toks = [[self._token(g) for _ in range(T)] for _ in rows]
        slot_idx = torch.tensor([r.slot if r is not None else -1 for r in rows], dtype=torch.int32)
        ff = torch.tensor([bool(f) if r is not None else False for r, f in zip(rows, fl_rows)])
        start = torch.empty(batch, dtype=torch.int32)
        length = torch.empty(batch, dtype=torch.int32)
        flush = torch.empty(batch, dtype=torch.bool)
        verify_cursor_step(self.pool.cursors, slot_idx, ff, self.L, self.R, T, start, length, flush,
                           late_flush=True)
        outs = torch.full((self.layers, batch, T, self.H, self.P), -7.5e30)
        sentinel = outs.clone()

        for l in range(self.layers):
            self._family_verify(l, toks, outs[l], slot_idx, start, length, flush)
        acc = torch.tensor([int(a) if r is not None else 1 for r, a in zip(rows, acc_rows)],
                           dtype=torch.int32)
        verify_commit_ref(self.pool.cursors, slot_idx, start, length, flush, acc, window=self.L,
                          ring_size=self.R, num_tokens=T)
        for b, r in enumerate(rows):
            if r is None:
                if not torch.equal(outs[:, b], sentinel[:, b]):
                    self._fail("verify: a padding row's output was written")
                continue
            st, ln = r.cur
            a = int(acc[b])
            want_flush = ln + T > min_ring_size(self.L, T) or bool(fl_rows[b])
            if [int(start[b]), int(length[b]), bool(flush[b])] != [st, ln, want_flush]:
                snap = [int(start[b]), int(length[b]), bool(flush[b])]
                self._fail(f"verify req {r.rid}: snapshot {snap}"
                           f" != model {[st, ln, want_flush]}")
            y64, _ = self._f64(r.S64, toks[b])
            for t in range(T):
                self._check_out(outs[:, b, t], y64[t], f"verify req {r.rid} slot {r.slot} token {t} "
                                f"(accepted {a} of {T})")
            _, r.S64 = self._f64(r.S64, toks[b][:a])
            for t in toks[b][:a]:
                r.tokens.append(t)
                r.shadow.append(self._fold32(r.shadow[-1], t))
            r.ntok += a
            r.cur = [(st + ln) % self.R, a] if want_flush else [st, ln + a]
        self._check_untouched(before, {r.slot for r in reqs}, "verify")
        self._after()

    def flush(self, rid: int, seed: int) -> None:
        """Forced flush: a decode step of that request alone with ``force_flush``."""
        self.decode([rid], seed=seed, force=[True])

    def fork(self, rid: int, seed: int, flush_first: bool = False) -> int | None:
        """Fork: ``copy_from`` a live request's slot into a new one.  The copy carries the ring
        (invariant F, ``carry_ring=True``), so the source need not be flushed; ``flush_first``
        force-flushes it anyway, and a source with an empty ring is copied as SGLang copies (cursors
        only)."""
        self._op = "fork"
        if self.free_slots() < 1:
            return None
        src = self.reqs[rid]
        if flush_first and src.cur[1] > 0:
            self.flush(rid, seed)
        self._op = "fork"
        self.steps += 1
        before = self._snapshot()
        dst = self._new_request(lineage=src.lineage)
        assert dst is not None
        dst.sg.mamba_needs_clear = False
        # A flushed source takes SGLang's path (cursors only: its ring rows are never read).
        self.pool.copy_from(torch.tensor([src.slot]), torch.tensor([dst.slot]), carry_ring=src.cur[1] > 0)
        # The destination is the source's logical state: same checkpoint, records and cursors.
        dst.S64 = src.S64.clone()
        dst.tokens, dst.shadow = list(src.tokens), [x.clone() for x in src.shadow]
        dst.cur, dst.ntok = list(src.cur), src.ntok
        self.reqs[dst.rid] = dst
        self._check_untouched(before, {dst.slot}, "fork")
        self._after()
        return dst.rid

    # ------------------------------------------------------------------ radix cache

    def _component(self):
        """What SGLang's ``MambaComponent.prepare_for_caching_req`` reads from ``self`` (no_buffer)."""
        hp = self.hpool
        cache = SimpleNamespace(req_to_token_pool=hp, enable_mamba_extra_buffer=False)
        return SimpleNamespace(cache=cache, int8_ckpt_pool=None,
                               _alloc_mamba_slot=lambda: hp.mamba_allocator.alloc(1))

    def _donate(self, r: Request, finished: bool) -> tuple[int | None, torch.Tensor | None]:
        from sglang.srt.mem_cache.unified_cache.components.mamba_component import MambaComponent

        params = SimpleNamespace(mamba_value=None)
        cl = around_prepare_for_caching_req(MambaComponent.prepare_for_caching_req, self._component(),
                                            r.sg, params, r.ntok, finished)
        return cl, params.mamba_value

    def _materialised(self, r: Request) -> None:
        """Model of ``materialise_slot`` on the donor: its ring folded into the checkpoint."""
        st, ln = r.cur
        r.cur = [(st + ln) % self.R, 0]

    def _add_node(self, r: Request, slot: int, cache_len: int | None, what: str) -> int:
        if cache_len != r.ntok:
            self._fail(f"{what} req {r.rid}: the tree was given a {cache_len}-token key for a state of "
                       f"{r.ntok} tokens")
        nid = self.next_nid
        self.next_nid += 1
        self.nodes[nid] = Node(nid=nid, slot=slot, key_len=cache_len, state=r.shadow[-1].clone())
        return nid

    def donate_finished(self, rid: int) -> int:
        """Finish with radix insert: the live slot is materialised and becomes a node."""
        self._op = "donate_finished"
        self.steps += 1
        before = self._snapshot()
        r = self.reqs.pop(rid)
        s = r.slot
        cl, value = self._donate(r, finished=True)
        self._materialised(r)
        if value is None or int(value.reshape(-1)[0]) != s:
            self._fail(f"donate_finished req {rid}: expected the live slot {s} as the value, got {value}")
        nid = self._add_node(r, s, cl, "donate_finished")
        self.hpool.free(r.sg)  # the request's token slot; the mamba slot now belongs to the tree
        self._check_untouched(before, {s}, "donate_finished")
        self._after()
        return nid

    def donate_unfinished(self, rid: int) -> int | None:
        """Chunked-prefill style insert: the live slot is materialised, SGLang copies it into a new
        slot for the tree; the request decodes on from its materialised checkpoint."""
        self._op = "donate_unfinished"
        if self.free_mamba_slots() < 1:
            return None
        self.steps += 1
        before = self._snapshot()
        r = self.reqs[rid]
        cl, value = self._donate(r, finished=False)
        self._materialised(r)
        d = int(value.reshape(-1)[0])
        nid = self._add_node(r, d, cl, "donate_unfinished")
        self._check_untouched(before, {d, r.slot}, "donate_unfinished")
        self._after()
        return nid

    def match(self, nid: int, seed: int, k: int) -> int | None:
        """Prefix hit: SGLang allocates a slot (no cursor reset), its deferred COW copies the node
        into it, then the suffix of ``k`` tokens is extended (``k = 0``: a full-prompt hit)."""
        self._op = "match"
        if self.free_slots() < 1:
            return None
        self.steps += 1
        before = self._snapshot()
        node = self.nodes[nid]
        sg = SimpleNamespace(mamba_pool_idx=None, req_pool_idx=None, mamba_needs_clear=False,
                             mamba_ping_pong_track_buffer=None, inflight_middle_chunks=0,
                             kv_committed_len=0)
        sg.mamba_pool_idx = self.hpool.mamba_allocator.alloc(1)[0]  # finalize_match_result_in_cache
        if self.hpool.alloc([sg]) is None:
            self._fail("match: token slot allocation failed with free slots")
        d = int(sg.mamba_pool_idx)
        self.pool.copy_from(torch.tensor([node.slot]), torch.tensor([d]))
        rid = self.next_rid
        self.next_rid += 1
        r = Request(rid=rid, sg=sg, S64=node.state.to(F64), tokens=[], shadow=[node.state.clone()],
                    cur=[0, 0], lineage=(-nid, rid), ntok=node.key_len)
        self.reqs[rid] = r
        if k:
            g = torch.Generator().manual_seed(seed)
            toks = [self._token(g) for _ in range(k)]
            S = node.state.clone()
            for t in toks:
                S = self._fold32(S, t)
            self._check_extend([d])
            self._write_checkpoint(d, S)
            self._server_extend(d, node.key_len)
            _, r.S64 = self._f64(r.S64, toks)
            r.shadow, r.ntok = [S.clone()], r.ntok + k
        self._check_untouched(before, {d}, "match")
        self._after()
        return rid

    def evict(self, nid: int) -> None:
        """LRU or ``--mamba-max-states-per-path`` eviction: the node's slot goes back to SGLang."""
        self._op = "evict"
        self.steps += 1
        before = self._snapshot()
        node = self.nodes.pop(nid)
        self.hpool.mamba_allocator.free(torch.tensor([node.slot]))
        self._check_untouched(before, set(), "evict")
        self._after()

    def _write_checkpoint(self, slot: int, S: torch.Tensor) -> None:
        """An extend's checkpoint (SGLang's chunked scan), then the read copy's refresh that the
        backends run after it (``pool.refresh_read``; no-op without a copy)."""
        self.temporal[:, slot] = S
        self.pool.refresh_read(torch.tensor([slot]))

    def _server_extend(self, slot: int, prefix_len: int) -> None:
        """The backends' extend metadata for one row (``metadata.build_eager``): invariant E on a row
        with a prefix, chosen from the host lengths as SGLang passes them, then the cursor reset."""
        try:
            build_eager(cursors=self.pool.cursors, slot_idx=torch.tensor([slot], dtype=torch.int32), num_prefills=1,
                        num_decodes=0, track_mask=None, window=self.L, rows=self.R,
                        extend_prefix_lens=torch.tensor([prefix_len], dtype=torch.int32),
                        extend_prefix_lens_cpu=[prefix_len])
        except RuntimeError as e:
            self._fail(f"{self._op}: {e} (slot {slot}, prefix {prefix_len}, "
                       f"cursors {self.pool.cursors[slot].tolist()})")

    def _check_extend(self, slots: list[int]) -> None:
        try:
            check_extend_rows(self.pool.cursors, torch.tensor(slots, dtype=torch.int32))
        except RuntimeError as e:
            self._fail(f"{self._op}: {e} (slots {slots}, cursors "
                       f"{[self.pool.cursors[s].tolist() for s in slots]})")

    def offload(self, rid: int) -> None:
        """Retraction with CPU backup: ``get_cpu_copy(req.mamba_pool_idx)``, then free the slot."""
        self._op = "offload"
        self.steps += 1
        before = self._snapshot()
        r = self.reqs[rid]
        idx = r.sg.mamba_pool_idx  # a 0-d tensor in SGLang (HybridReqToTokenPool.alloc: mid[0])
        r.offloaded = self.pool.get_cpu_copy(idx if self.offload_0d else idx.reshape(1))
        self._release(r)
        self._check_untouched(before, set(), "offload")
        self._after()

    def reload(self, rid: int) -> bool:
        """Readmission: a fresh slot from SGLang's alloc, then ``load_cpu_copy`` into it."""
        self._op = "reload"
        if self.free_slots() < 1:
            return False
        self.steps += 1
        before = self._snapshot()
        r = self.reqs[rid]
        sg = r.sg
        sg.mamba_needs_clear = False
        if self.hpool.alloc([sg]) is None:
            return False
        sg.mamba_needs_clear = False
        s = int(sg.mamba_pool_idx)
        idx = sg.mamba_pool_idx
        self.pool.load_cpu_copy(r.offloaded, idx if self.offload_0d else idx.reshape(1))
        r.offloaded = None
        self._check_untouched(before, {s}, "reload")
        self._after()
        return True

    def free(self, rid: int) -> None:
        """Finish / abort: free the request's slot (its contents stay for the next owner)."""
        self._op = "free"
        self.steps += 1
        before = self._snapshot()
        r = self.reqs.pop(rid)
        if r.offloaded is None:
            self._release(r)
        self._check_untouched(before, set(), "free")
        self._after()

    def _after(self) -> None:
        STATS[self._op] += 1
        self.check_all()
        self._poison()


class Mamba2RingHarness(RingHarness):
    """Mamba-2: records ``(x, Δ, B)``; ``mamba2_replay_decode_ref`` / ``mamba2_replay_verify_ref``."""

    family = "mamba2"

    def _family_params(self, g: torch.Generator) -> None:
        Ly, H = self.layers, self.H
        self.A = -torch.rand(Ly, H, generator=g) * 1.5 - 0.1
        self.pool.fold_A = list(self.A)  # what hooks/pool.py registers from the model's mixers
        self.dt_bias = torch.randn(Ly, H, generator=g) * 0.5
        self.D = torch.randn(Ly, H, generator=g)

    def _token(self, g: torch.Generator) -> Token:
        Ly, H, P, N, G = self.layers, self.H, self.P, self.N, self.G
        return Token(x=torch.randn(Ly, H, P, generator=g), dt=torch.randn(Ly, H, generator=g) - 1.0,
                     B=torch.randn(Ly, G, N, generator=g), C=torch.randn(Ly, G, N, generator=g))

    def _delta32(self, tok: Token, l: int) -> torch.Tensor:
        return _softplus_f32(tok.dt[l] + self.dt_bias[l])

    def _fold32(self, S: torch.Tensor, tok: Token) -> torch.Tensor:
        """fp32 conventional update of all layers (the expression order of selective_state_update)."""
        out = torch.empty_like(S)
        hpg = self.H // self.G
        for l in range(self.layers):
            d = self._delta32(tok, l)
            Bh = tok.B[l].repeat_interleave(hpg, dim=0)
            dA = torch.exp(self.A[l] * d)
            dB = Bh * d[:, None]
            out[l] = S[l] * dA[:, None, None] + dB[:, None, :] * tok.x[l][:, :, None]
        return out

    def _f64(self, S64: torch.Tensor, toks: list[Token]) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 conventional recurrence over ``toks``: outputs ``[T, Ly, H, P]``, final state."""
        outs, fin = [], []
        for l in range(self.layers):
            y, S = mamba2_conventional_f64(
                S64[l], torch.stack([t.x[l] for t in toks]), torch.stack([t.dt[l] for t in toks]),
                self.A[l], torch.stack([t.B[l] for t in toks]), torch.stack([t.C[l] for t in toks]),
                D=self.D[l], dt_bias=self.dt_bias[l], dt_softplus=True)
            outs.append(y)
            fin.append(S)
        return torch.stack(outs, dim=1), torch.stack(fin)

    def _family_materialise(self, l: int, s: int, r: Request, start: int, length: int) -> torch.Tensor:
        """Check ring rows [0, len) against the accepted tokens; fold them onto the checkpoint (f64)."""
        n = len(r.tokens)
        hpg = self.H // self.G
        Sl = self.temporal[l, s].to(F64)
        for j in range(length):
            tok = r.tokens[n - length + j]
            p = (start + j) % self.R
            rx = self.pool.rings["x"][l, s, :, p, :]
            rdt = self.pool.rings["dt"][l, s, :, p]
            rB = self.pool.rings["B"][l, s, :, p, :]
            if not (torch.equal(rx, tok.x[l]) and torch.equal(rB, tok.B[l])
                    and torch.equal(rdt, self._delta32(tok, l))):
                self._fail(f"req {r.rid} slot {s} layer {l}: committed record {j} (phys row "
                           f"{p}) is not accepted token {n - length + j}")
            d = rdt.to(F64)
            Sl = (Sl * torch.exp(self.A[l].to(F64) * d)[:, None, None]
                  + (d[:, None] * rx.to(F64))[:, :, None]
                  * rB.to(F64).repeat_interleave(hpg, 0)[:, None, :])
        return Sl

    def _family_decode(self, l, toks, out, slot_idx, start, length, flush) -> None:
        lr = self.pool.layer_rings(l)
        mamba2_replay_decode_ref(
            self.temporal[l], lr["x"], lr["dt"], lr["B"],
            torch.stack([t.x[l] for t in toks]), torch.stack([t.dt[l] for t in toks]),
            self.A[l], torch.stack([t.B[l] for t in toks]), torch.stack([t.C[l] for t in toks]),
            out, slot_idx, start, length, flush,
            D=self.D[l], dt_bias=self.dt_bias[l], dt_softplus=True, **self.pool.layer_read_copy(l))

    def _family_verify(self, l, toks, out, slot_idx, start, length, flush) -> None:
        def win(name):
            return torch.stack([torch.stack([t[name][l] for t in tw]) for tw in toks])

        lr = self.pool.layer_rings(l)
        mamba2_replay_verify_ref(
            self.temporal[l], lr["x"], lr["dt"], lr["B"], win("x"), win("dt"), self.A[l],
            win("B"), win("C"), out, slot_idx, start, length, flush,
            D=self.D[l], dt_bias=self.dt_bias[l], dt_softplus=True, **self.pool.layer_read_copy(l))


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GdnRingHarness(RingHarness):
    """Gated DeltaNet: ``(H, P, N, G)`` read as ``(HV, V, K, Hk)``; records ``(u, raw k, raw v, g,
    β)``; ``gdn_replay_decode_ref`` / ``gdn_replay_verify_ref``. The record check covers raw k, raw v,
    g and β (what the fold replays) bitwise; ``u`` feeds non-flush outputs only, which are checked
    against the float64 recurrence."""

    family = "gdn"

    def _family_params(self, g: torch.Generator) -> None:
        Ly, HV = self.layers, self.H
        self.A_log = torch.rand(Ly, HV, generator=g) * 0.5 - 1.0
        self.dt_bias = torch.randn(Ly, HV, generator=g) * 0.5
        self.scale = self.N ** -0.5

    def _token(self, g: torch.Generator) -> Token:
        Ly, HV, V, K, Hk = self.layers, self.H, self.P, self.N, self.G
        return Token(q=torch.randn(Ly, Hk, K, generator=g), k=torch.randn(Ly, Hk, K, generator=g),
                     v=torch.randn(Ly, HV, V, generator=g), a=torch.randn(Ly, HV, generator=g),
                     b=torch.randn(Ly, HV, generator=g))

    def _gate32(self, tok: Token, l: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, β) in fp32 as the decode kernel computes them (β rounded to b's dtype: fp32 here)."""
        x = tok.a[l] + self.dt_bias[l]
        sp = torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x)), x)
        g = -torch.exp(self.A_log[l]) * sp
        beta = torch.sigmoid(tok.b[l]).to(tok.b.dtype).to(F32)
        return g, beta

    def _fold32(self, S: torch.Tensor, tok: Token) -> torch.Tensor:
        """fp32 packed-decode update of all layers (gdn_replay_decode's fold, current-token form)."""
        out = torch.empty_like(S)
        grp = self.H // self.G
        for l in range(self.layers):
            g, beta = self._gate32(tok, l)
            kh = _l2norm(tok.k[l]).repeat_interleave(grp, 0)
            Sl = S[l] * torch.exp(g)[:, None, None]
            u = (tok.v[l] - (Sl * kh[:, None, :]).sum(-1)) * beta[:, None]
            out[l] = Sl + u[:, :, None] * kh[:, None, :]
        return out

    def _f64(self, S64: torch.Tensor, toks: list[Token]) -> tuple[torch.Tensor, torch.Tensor]:
        outs, fin = [], []
        for l in range(self.layers):
            y, S = gdn_conventional_f64(
                S64[l], *(torch.stack([t[n][l] for t in toks]) for n in ("q", "k", "v", "a", "b")),
                self.A_log[l], self.dt_bias[l], scale=self.scale)
            outs.append(y)
            fin.append(S)
        return torch.stack(outs, dim=1), torch.stack(fin)

    def _family_materialise(self, l: int, s: int, r: Request, start: int, length: int) -> torch.Tensor:
        n = len(r.tokens)
        grp = self.H // self.G
        rings = self.pool.rings
        Sl = self.temporal[l, s].to(F64)
        for j in range(length):
            tok = r.tokens[n - length + j]
            p = (start + j) % self.R
            rk, rv = rings["k"][l, s, :, p, :], rings["v"][l, s, :, p, :]
            rg, rb = rings["g"][l, s, :, p], rings["beta"][l, s, :, p]
            g, beta = self._gate32(tok, l)
            if not (torch.equal(rk, tok.k[l]) and torch.equal(rv, tok.v[l])
                    and torch.equal(rg, g) and torch.equal(rb, beta)):
                self._fail(f"req {r.rid} slot {s} layer {l}: committed record {j} (phys row "
                           f"{p}) is not accepted token {n - length + j}")
            kh = _l2norm(rk.to(F64)).repeat_interleave(grp, 0)
            Sl = Sl * torch.exp(rg.to(F64))[:, None, None]
            u = rb.to(F64)[:, None] * (rv.to(F64) - (Sl * kh[:, None, :]).sum(-1))
            Sl = Sl + u[:, :, None] * kh[:, None, :]
        return Sl

    def _family_decode(self, l, toks, out, slot_idx, start, length, flush) -> None:
        lr = self.pool.layer_rings(l)
        gdn_replay_decode_ref(
            self.temporal[l], lr["u"], lr["k"], lr["v"], lr["g"], lr["beta"],
            *(torch.stack([t[n][l] for t in toks]) for n in ("q", "k", "v", "a", "b")),
            self.A_log[l], self.dt_bias[l], out, slot_idx, start, length, flush, scale=self.scale,
            **self.pool.layer_read_copy(l))

    def _family_verify(self, l, toks, out, slot_idx, start, length, flush) -> None:
        def win(name):
            return torch.stack([torch.stack([t[name][l] for t in tw]) for tw in toks])

        lr = self.pool.layer_rings(l)
        gdn_replay_verify_ref(
            self.temporal[l], lr["u"], lr["k"], lr["v"], lr["g"], lr["beta"],
            *(win(n) for n in ("q", "k", "v", "a", "b")),
            self.A_log[l], self.dt_bias[l], out, slot_idx, start, length, flush, scale=self.scale,
            **self.pool.layer_read_copy(l))
