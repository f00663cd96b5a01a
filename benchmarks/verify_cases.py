"""Verify-benchmark set-up: one layer's pools, inputs and the timed launches of each family.

Used by ``bench_verify.py``. Per family one layer is allocated once (``[layers=1, slots, ...]``
views, random non-zero data, rings in their real value ranges, random ring starts so rings wrap)
and every kernel is called on it as its caller in SGLang 0.5.17 calls it:

- ours: ``mamba2_replay_verify`` / ``gdn_replay_verify`` with the cursor snapshot of each row;
- ``snapshot``: SGLang's snapshot verify, exactly as ``MambaMixer2.forward`` (TARGET_VERIFY branch)
  calls ``selective_state_update`` and as ``TritonGDNKernel.target_verify`` calls
  ``fused_sigmoid_gating_delta_rule_update`` (``disable_state_update=True``, an intermediate-state
  buffer ``[batch, T, ...]`` in the state dtype, ``cache_steps=T``, linear chains);
- ``commit``: the per-layer commit that SGLang's snapshot path runs after sampling
  (``fused_mamba_state_scatter_with_mask``: the accepted intermediate state into the pool);
- ``builtin``: SGLang's built-in GDN circular-ring verify (``gdn_replayssm_spec_decode``: exact
  fold of flush rows, chunked non-flush outputs, flush-row outputs; three launches);
- ``fold``: SGLang's active built-in GDN spec path, fold-every-commit: the recurrent verify with
  ``cache_ring=True`` (raw window into a ``T``-row ring) plus the per-layer exact-fold commit of the
  ``a`` accepted tokens (``commit_gdn_replayssm_fold_all_layers`` on this one layer);
- ``decode``: one conventional decode step of the family (``selective_state_update`` / packed
  decode), the yardstick for "verifying T tokens costs x decode steps".

Phased kernels (ours, ``builtin``) run at every step of the steady verify cycle for accepted count
``a`` (``bytes_model.verify_cycle``: history ``a, 2a, ...``, the last step flushing) with the same
``(len, flush)`` in every row, plus (ours) one mixed launch with rows spread over the cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.bench_decode import _Rand, _ReadCopy, _row_slots, _softplus, _tdtype


@dataclass
class VCase:
    """One kernel at one (T, batch), ready to launch on static tensors."""

    family: str
    key: str
    fn: Callable[[], None]
    out: Callable[[], object] | None  # the tensor a launch writes (None: nothing to check)
    phases: list[tuple[int, bool]] = field(default_factory=list)  # empty: unphased
    set_phase: Callable[[int], None] | None = None  # index into phases, every row alike
    set_mixed: Callable[[], None] | None = None
    mixed_rows: list[tuple[int, bool]] | None = None
    note: str = ""
    skip: str | None = None  # why this kernel is not launched at this point (reported, not timed)

    @property
    def phased(self) -> bool:
        return bool(self.phases)


INT32_MAX = 2**31 - 1


def scatter_offset_overflow(batch: int, T: int, entry_elems: int) -> str | None:
    """Why SGLang 0.5.17's ``fused_mamba_state_scatter_with_mask`` cannot run at this point, or None.

    Its kernel forms the source offset ``pid_req * src_req_stride`` in 32 bits (``pid_req`` is the
    int32 program id; a stride below 2^31 is passed as i32; sm_90a PTX ``mul.lo.s32``) and only
    then widens it, so when ``(batch - 1) · T · entry_elems`` passes 2^31 - 1 the offset wraps
    and the launch reads outside the source buffer (CUDA illegal memory access): at the
    Nano-4B shape (``entry_elems`` = 96·80·128) from batch 275 at T = 8, 548 at T = 4.
    ``src`` is the snapshot buffer ``[1, batch, T, *state]``, so ``src_req_stride = T·entry``.
    """
    stride = T * entry_elems
    if stride <= INT32_MAX and (batch - 1) * stride > INT32_MAX:
        return (f"not launched: SGLang's fused_mamba_state_scatter_with_mask computes "
                f"pid_req * src_req_stride in int32; (batch-1)·T·H·P·N = "
                f"{(batch - 1) * stride:,} > 2^31-1 would fault (illegal memory access)")
    return None


class _VerifyCursors:
    """Per-row cursor snapshot of our kernels: a random static start, ``len`` and ``flush`` set per
    phase (every row alike) or spread over the cycle (mixed)."""

    def __init__(self, rng: _Rand, batch: int, R: int, cycle: list[tuple[int, bool]]):
        import torch

        dev = rng.device
        self.cycle = cycle
        self.ring_start = rng.ints((batch,), R, torch.int32)
        self.ring_len = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.flush = torch.zeros(batch, dtype=torch.bool, device=dev)
        order = rng.perm(batch).tolist()
        self.mixed = [cycle[order[i] % len(cycle)] for i in range(batch)]
        self._mixed_len = torch.tensor([h for h, _ in self.mixed], dtype=torch.int32, device=dev)
        self._mixed_fl = torch.tensor([f for _, f in self.mixed], dtype=torch.bool, device=dev)

    def set_phase(self, i: int) -> None:
        h, f = self.cycle[i]
        self.ring_len.fill_(h)
        self.flush.fill_(f)

    def set_mixed(self) -> None:
        self.ring_len.copy_(self._mixed_len)
        self.flush.copy_(self._mixed_fl)


def ring_pool(fam, T: int) -> dict:
    """``fam``'s checkpoint, its read copy if any (``read_state`` / ``read_scale``) and the
    first ``cfg.ring_rows(T)`` rows of each of its rings (dim 2): the ring a server with ``T``
    speculative tokens has (views, pool strides)."""
    rows = fam.cfg.ring_rows(T, fam.name)
    return {"state": fam.state, **fam._read_kwargs(),
            **{k: getattr(fam, k).narrow(2, 0, rows) for k in fam.ring_names}}


def _read_args(fam, args: dict) -> None:
    """Add a read copy of ``args["state"]`` (``read_state``, fp8 ``read_scale``) to a refcheck
    pool under ``--read-dtype``."""
    read, scale = fam._read_copy(args["state"])
    if read is not None:
        args["read_state"] = read
    if scale is not None:
        args["read_scale"] = scale


def _pool_of(fam, args: dict) -> dict:
    """The pool tensors of refcheck ``args`` (checkpoint, read copy if any, rings)."""
    return {k: args[k] for k in ("state", "read_state", "read_scale") + fam.ring_names
            if k in args}


def refcheck_rows(rows: int, slots: int, L: int, T: int) -> list[tuple[int, int, bool]]:
    """``(slot, len, flush)`` per row: empty ring, middle and longest non-flush history, the
    cycle's flush (``len + T > L``), a forced flush of a short ring, a forced flush of an empty
    ring; the last row is padding (slot -1)."""
    import torch

    perm = (torch.randperm(slots - 1, generator=torch.Generator().manual_seed(rows)) + 1).tolist()
    top = max(L - T, 0)  # longest non-flush history
    plan = [(0, T > L), (top // 2, T > L), (top, T > L), (min(top + 1, max(L, T)), True),
            (min(2, max(L, T)), True), (0, True)]
    out = []
    for i in range(rows - 1):
        h, f = plan[i % len(plan)]
        out.append((perm[i], h, f))
    out.append((-1, 0, False))
    return out


class Mamba2Verify(_ReadCopy):
    """One Nemotron-H Mamba-2 layer for verify: state, read copy (``--read-dtype``), our rings,
    parameters."""

    name = "mamba2"
    ring_names = ("ring_x", "ring_dt", "ring_B")

    def __init__(self, cfg, kernels: dict, peers: dict):
        import torch

        self.cfg, self.kernels, self.peers = cfg, kernels, peers
        sh = self.sh = cfg.mamba2_shape
        adt, sdt = _tdtype(cfg.act_dtype), _tdtype(cfg.state_dtype)
        self.adt, self.sdt = adt, sdt
        rng = self.rng = _Rand(cfg.device, cfg.seed + 11)
        H, P, N, G, R, S = sh.H, sh.P, sh.N, sh.G, cfg.R, cfg.slots
        self.A = -rng.uniform((H,), torch.float32, 1.0, 16.0)
        dt_init = rng.uniform((H,), torch.float32, math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = (dt_init + torch.log(-torch.expm1(-dt_init))).to(adt)
        self.D = rng.normal((H,), torch.float32, 0.1, 1.0).to(adt)
        self.state = rng.normal((1, S, H, P, N), sdt, 0.1)[0]
        self.ring_x = rng.normal((1, S, H, R, P), adt)[0]
        self.ring_dt = _softplus(rng.normal((1, S, H, R), torch.float32, 0.5)
                                 + self.dt_bias.float()[None, None, :, None])[0]
        self.ring_B = rng.normal((1, S, G, R, N), adt)[0]
        self.read, self.read_scale = self._read_copy(self.state)

    # the tied broadcasts MambaMixer2 hands to selective_state_update
    def _tied(self):
        P, N = self.sh.P, self.sh.N
        return (self.A[:, None, None].expand(-1, P, N), self.dt_bias[:, None].expand(-1, P),
                self.D[:, None].expand(-1, P))

    def inputs(self, batch: int, T: int) -> dict:
        """x, B, C: views of the conv output ``[batch, T, H·P + 2·G·N]``; dt: a strided slice of
        the projection; out ``[batch, T, H, P]``."""
        import torch

        sh, rng = self.sh, self.rng
        H, P, N, G = sh.H, sh.P, sh.N, sh.G
        xbc = rng.normal((batch, T, H * P + 2 * G * N), self.adt)
        dt = rng.normal((batch, T, 2 * H), self.adt, 0.5)[..., H:]
        return {
            "x": xbc[..., : H * P].unflatten(-1, (H, P)),
            "B": xbc[..., H * P: H * P + G * N].unflatten(-1, (G, N)),
            "C": xbc[..., H * P + G * N:].unflatten(-1, (G, N)),
            "dt": dt, "dt_full": dt[..., None].expand(-1, -1, -1, P),
            "out": torch.empty(batch, T, H, P, dtype=self.adt, device=self.cfg.device),
            "slot_idx": _row_slots(rng, self.cfg.slots, batch),
        }

    def call_ours(self, fn, a: dict, p: dict) -> None:
        """Our verify ``fn`` (kernel or reference) on pool ``p`` (``ring_pool`` / ``pool_of``)."""
        A, dt_bias, D = self._tied()
        fn(p["state"], p["ring_x"], p["ring_dt"], p["ring_B"], a["x"], a["dt_full"], A, a["B"],
           a["C"], a["out"], a["slot_idx"], a["ring_start"], a["ring_len"], a["flush"], D=D,
           z=None, dt_bias=dt_bias, dt_softplus=True,
           **self._read_kwargs(p.get("read_state"), p.get("read_scale")))

    def call_snapshot(self, state, a: dict, out, buf) -> None:
        """SGLang's snapshot verify, as MambaMixer2.forward calls it in TARGET_VERIFY."""
        A, dt_bias, D = self._tied()
        batch, T = a["x"].shape[:2]
        self.peers["ssu"](state, a["x"], a["dt_full"], A, a["B"], a["C"], D, z=None,
                          dt_bias=dt_bias, dt_softplus=True, state_batch_indices=a["slot_idx"],
                          out=out, disable_state_update=True, intermediate_states_buffer=buf,
                          cache_steps=T, intermediate_state_indices=a["interm_idx"])

    def cases(self, batch: int, T: int, cycle: list[tuple[int, bool]], a: int) -> list[VCase]:
        import torch

        cfg = self.cfg
        inp = self.inputs(batch, T)
        cur = _VerifyCursors(self.rng, batch, cfg.ring_rows(T, self.name), cycle)
        inp.update(ring_start=cur.ring_start, ring_len=cur.ring_len, flush=cur.flush)
        pool = ring_pool(self, T)
        out: list[VCase] = []
        if self.kernels.get("mamba2") is not None:
            out.append(VCase("mamba2", "ours",
                             lambda: self.call_ours(self.kernels["mamba2"], inp, pool),
                             lambda: inp["out"], cycle, cur.set_phase, cur.set_mixed, cur.mixed))
        ssu = self.peers.get("ssu")
        if ssu is None:
            return out
        inp["interm_idx"] = torch.arange(batch, dtype=torch.int32, device=cfg.device)
        buf = torch.empty(batch, T, self.sh.H, self.sh.P, self.sh.N, dtype=self.sdt,
                          device=cfg.device)
        out_s = torch.empty_like(inp["out"])
        out.append(VCase("mamba2", "snapshot", lambda: self.call_snapshot(self.state, inp, out_s,
                                                                          buf), lambda: out_s))
        scatter = self.peers.get("scatter")
        if scatter is not None:
            steps = torch.full((batch,), a - 1, dtype=torch.int32, device=cfg.device)
            dst, src = self.state[None], buf[None]
            out.append(VCase("mamba2", "commit",
                             lambda: scatter(dst, src, inp["slot_idx"], steps), None,
                             skip=scatter_offset_overflow(batch, T, buf[0, 0].numel())))
        d_out = torch.empty(batch, self.sh.H, self.sh.P, dtype=self.adt, device=cfg.device)
        A, dt_bias, D = self._tied()

        def decode():  # MambaMixer2.forward's decode call
            ssu(self.state, inp["x"][:, 0], inp["dt_full"][:, 0], A, inp["B"][:, 0],
                inp["C"][:, 0], D, z=None, dt_bias=dt_bias, dt_softplus=True,
                state_batch_indices=inp["slot_idx"], out=d_out)

        out.append(VCase("mamba2", "decode", decode, lambda: d_out))
        return out

    def refcheck_args(self, T: int, rows: int = 8, slots: int = 16) -> tuple[dict, list]:
        """A fresh small pool at the real head shapes and one verify step's arguments."""
        import torch

        cfg, sh, rng = self.cfg, self.sh, self.rng
        H, P, N, G, R = sh.H, sh.P, sh.N, sh.G, cfg.ring_rows(T, self.name)
        plan = refcheck_rows(rows, slots, cfg.flush_limit(T), T)
        dev = cfg.device
        args = {
            "state": rng.normal((slots, H, P, N), self.sdt, 0.1),
            "ring_x": rng.normal((slots, H, R, P), self.adt),
            "ring_dt": _softplus(rng.normal((slots, H, R), torch.float32, 0.5)
                                 + self.dt_bias.float()[None, :, None]),
            "ring_B": rng.normal((slots, G, R, N), self.adt),
        }
        inp = self.inputs(rows, T)
        inp["out"].fill_(float("nan"))
        args.update(inp)
        args["slot_idx"] = torch.tensor([s for s, _, _ in plan], dtype=torch.int32, device=dev)
        args["ring_start"] = rng.ints((rows,), R, torch.int32)
        args["ring_len"] = torch.tensor([h for _, h, _ in plan], dtype=torch.int32, device=dev)
        args["flush"] = torch.tensor([f for _, _, f in plan], dtype=torch.bool, device=dev)
        args["interm_idx"] = torch.arange(rows, dtype=torch.int32, device=dev)
        _read_args(self, args)
        return args, plan

    def pool_of(self, args: dict) -> dict:
        return _pool_of(self, args)


class GDNVerify(_ReadCopy):
    """One Qwen3.5 Gated DeltaNet layer for verify: state, read copy (``--read-dtype``), our
    rings, SGLang's built-in rings."""

    name = "gdn"
    ring_names = ("ring_u", "ring_k", "ring_v", "ring_g", "ring_beta")

    def __init__(self, cfg, kernels: dict, peers: dict):
        import torch

        self.cfg, self.kernels, self.peers = cfg, kernels, peers
        sh = self.sh = cfg.gdn_shape
        adt, sdt = _tdtype(cfg.act_dtype), _tdtype(cfg.state_dtype)
        self.adt, self.sdt = adt, sdt
        self.udt = torch.float32 if cfg.gdn_u_dtype == "fp32" else adt
        rng = self.rng = _Rand(cfg.device, cfg.seed + 12)
        HV, Hk, K, V, R, S = sh.HV, sh.Hk, sh.K, sh.V, cfg.R, cfg.slots
        self.A_log = rng.uniform((HV,), torch.float32, 0.0, math.log(16.0))
        self.dt_bias = rng.normal((HV,), torch.float32, 0.5).to(adt)
        self.scale = K ** -0.5
        self.state = rng.normal((1, S, HV, V, K), sdt, 0.1)[0]
        self.ring_u = rng.normal((1, S, HV, R, V), self.udt, 0.1)[0]
        self.ring_k = rng.normal((1, S, Hk, R, K), adt)[0]
        self.ring_v = rng.normal((1, S, HV, R, V), adt)[0]
        self.ring_g = self._log_gate(rng.normal((1, S, HV, R), torch.float32))[0]
        self.ring_beta = torch.sigmoid(rng.normal((1, S, HV, R), torch.float32))[0]
        self.read, self.read_scale = self._read_copy(self.state)
        self.bi = None
        if peers.get("builtin") is not None:
            # SGLang's pool (memory_pool.py): d, k in the SSM dtype, g fp32 (chunked records);
            # raw v, pre-norm k in the conv dtype, beta fp32 (exact-fold records); C rows, a power
            # of two (its cursor arithmetic masks with C-1) holding every history we time.
            C = cfg.builtin_ring
            k = rng.normal((1, S, Hk, C, K), torch.float32)
            self.bi = {
                "d_cache": rng.normal((1, S, HV, C, V), sdt, 0.1)[0],
                "k_cache": (k / k.norm(dim=-1, keepdim=True)).to(sdt)[0],
                "g_cache": self._log_gate(rng.normal((1, S, HV, C), torch.float32))[0],
                "rawv_cache": rng.normal((1, S, HV, C, V), adt)[0],
                "rawk_cache": rng.normal((1, S, Hk, C, K), adt)[0],
                "beta_cache": torch.sigmoid(rng.normal((1, S, HV, C), torch.float32))[0],
            }
            self.bi_cursors = {
                "write_pos": torch.zeros(S, dtype=torch.int32, device=cfg.device),
                "cache_base": rng.ints((S,), C, torch.int32),
                "is_flush": torch.zeros(S, dtype=torch.int8, device=cfg.device),
            }

    def _log_gate(self, a):
        A = self.A_log.exp()[:, None]
        return -A * _softplus(a + self.dt_bias.float()[:, None])

    def inputs(self, batch: int, T: int) -> dict:
        """q, k, v: views of the packed post-conv ``mixed_qkv [batch·T, 2·Hk·K + HV·V]``; a, b
        ``[batch·T, HV]``; out ``[batch, T, HV, V]``."""
        import torch

        sh, rng = self.sh, self.rng
        HV, Hk, K, V = sh.HV, sh.Hk, sh.K, sh.V
        mixed = rng.normal((batch * T, sh.qkv_dim), self.adt)
        q = mixed[:, : Hk * K].unflatten(1, (Hk, K))
        k = mixed[:, Hk * K: 2 * Hk * K].unflatten(1, (Hk, K))
        v = mixed[:, 2 * Hk * K:].unflatten(1, (HV, V))
        a = rng.normal((batch * T, HV), self.adt)
        b = rng.normal((batch * T, HV), self.adt)
        win = lambda t: t.unflatten(0, (batch, T))  # noqa: E731 ([batch, T, ...] views)
        return {
            "mixed_qkv": mixed, "q_tok": q, "k_tok": k, "v_tok": v, "a_tok": a, "b_tok": b,
            "q": win(q), "k": win(k), "v": win(v), "a": win(a), "b": win(b),
            "out": torch.empty(batch, T, HV, V, dtype=self.adt, device=self.cfg.device),
            "slot_idx": _row_slots(rng, self.cfg.slots, batch),
            "cu_seqlens": torch.arange(0, batch * T + 1, T, dtype=torch.int32,
                                       device=self.cfg.device),
        }

    def call_ours(self, fn, a: dict, p: dict) -> None:
        """Our verify ``fn`` (kernel or reference) on pool ``p`` (``ring_pool`` / ``pool_of``)."""
        fn(p["state"], p["ring_u"], p["ring_k"], p["ring_v"], p["ring_g"], p["ring_beta"],
           a["q"], a["k"], a["v"], a["a"], a["b"], self.A_log, self.dt_bias, a["out"],
           a["slot_idx"], a["ring_start"], a["ring_len"], a["flush"], scale=self.scale,
           use_qk_l2norm=True, **self._read_kwargs(p.get("read_state"), p.get("read_scale")))

    def call_snapshot(self, state, a: dict, buf):
        """SGLang's snapshot verify, as TritonGDNKernel.target_verify calls it; returns out."""
        batch, T = a["q"].shape[:2]
        o = self.peers["sigmoid"](
            A_log=self.A_log, dt_bias=self.dt_bias, q=a["q_tok"][None], k=a["k_tok"][None],
            v=a["v_tok"][None], a=a["a_tok"], b=a["b_tok"], initial_state_source=state,
            initial_state_indices=a["slot_idx"], cu_seqlens=a["cu_seqlens"],
            use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0,
            is_kda=False, disable_state_update=True, intermediate_states_buffer=buf,
            intermediate_state_indices=a["interm_idx"], cache_steps=T,
            retrieve_parent_token=None)
        return o.reshape(batch, T, *o.shape[-2:])

    def cases(self, batch: int, T: int, cycle: list[tuple[int, bool]], acc: int) -> list[VCase]:
        import torch

        cfg, sh = self.cfg, self.sh
        inp = self.inputs(batch, T)
        cur = _VerifyCursors(self.rng, batch, cfg.ring_rows(T, self.name), cycle)
        inp.update(ring_start=cur.ring_start, ring_len=cur.ring_len, flush=cur.flush)
        inp["interm_idx"] = torch.arange(batch, dtype=torch.int32, device=cfg.device)
        pool = ring_pool(self, T)
        out: list[VCase] = []
        if self.kernels.get("gdn") is not None:
            out.append(VCase("gdn", "ours", lambda: self.call_ours(self.kernels["gdn"], inp, pool),
                             lambda: inp["out"], cycle, cur.set_phase, cur.set_mixed, cur.mixed))
        if self.peers.get("sigmoid") is not None:
            buf = torch.empty(batch, T, sh.HV, sh.V, sh.K, dtype=self.sdt, device=cfg.device)
            held: dict = {}

            def snap():
                held["o"] = self.call_snapshot(self.state, inp, buf)

            out.append(VCase("gdn", "snapshot", snap, lambda: held["o"]))
        if self.bi is not None:
            out.append(self._builtin_case(inp, batch, T, cycle))
        if self.peers.get("sigmoid") is not None and self.peers.get("fold") is not None:
            out.append(self._fold_case(inp, batch, T, acc))
        packed = self.peers.get("packed")
        if packed is not None:
            dmix = inp["mixed_qkv"][:batch]
            d_out = torch.empty(batch, 1, sh.HV, sh.V, dtype=self.adt, device=cfg.device)

            def decode():  # TritonGDNKernel.packed_decode
                packed(mixed_qkv=dmix, a=inp["a_tok"][:batch], b=inp["b_tok"][:batch],
                       A_log=self.A_log, dt_bias=self.dt_bias, scale=self.scale,
                       initial_state=self.state, out=d_out, ssm_state_indices=inp["slot_idx"],
                       use_qk_l2norm_in_kernel=True)

            out.append(VCase("gdn", "decode", decode, lambda: d_out))
        return out

    def _builtin_case(self, inp: dict, batch: int, T: int, cycle) -> VCase:
        """gdn_replayssm_spec_decode as GDNAttnBackend._replayssm_target_verify calls it, with its
        block-keyed cursors set to the same (history, flush) as ours at every phase."""
        import torch

        sh, C = self.sh, self.cfg.builtin_ring
        out_b = torch.empty(batch * T, sh.HV, sh.V, dtype=self.adt, device=self.cfg.device)
        cz = self.bi_cursors

        def run():
            self.peers["builtin"](
                q=inp["q_tok"], k=inp["k_tok"], v=inp["v_tok"], a=inp["a_tok"], b=inp["b_tok"],
                A_log=self.A_log, dt_bias=self.dt_bias, checkpoint_state=self.state, **self.bi,
                out=out_b, query_start_loc=inp["cu_seqlens"], ssm_state_indices=inp["slot_idx"],
                write_pos=cz["write_pos"], cache_base=cz["cache_base"], is_flush=cz["is_flush"],
                max_cache_len=C, max_spec_len=T, scale=sh.K ** -0.5,
                use_qk_l2norm_in_kernel=True, null_block_id=-1)

        def set_phase(i: int) -> None:
            h, f = cycle[i]
            cz["write_pos"].fill_(h)
            cz["is_flush"].fill_(int(f))

        return VCase("gdn", "builtin", run, lambda: out_b, cycle, set_phase)

    def _fold_case(self, inp: dict, batch: int, T: int, acc: int) -> VCase:
        """Fold-every-commit (0.5.17's active built-in spec path): the recurrent verify writing its
        raw window ring (GDNAttnBackend._replayssm_fold_target_verify), then the exact-fold commit
        of the accepted prefix (commit_gdn_replayssm_fold_after_verify, this layer only)."""
        import torch

        sh, cfg, rng = self.sh, self.cfg, self.rng
        S = cfg.slots
        rings = {
            "replayssm_rawv": rng.normal((1, S, sh.HV, T, sh.V), self.adt),
            "replayssm_rawk": rng.normal((1, S, sh.Hk, T, sh.K), self.adt),
            "replayssm_g": self._log_gate(rng.normal((1, S, sh.HV, T), torch.float32)),
            "replayssm_beta": torch.sigmoid(rng.normal((1, S, sh.HV, T), torch.float32)),
        }
        accepted = torch.full((batch,), acc, dtype=torch.int32, device=cfg.device)
        held: dict = {}

        def run():
            held["o"] = self.peers["sigmoid"](
                A_log=self.A_log, dt_bias=self.dt_bias, q=inp["q_tok"][None], k=inp["k_tok"][None],
                v=inp["v_tok"][None], a=inp["a_tok"], b=inp["b_tok"],
                initial_state_source=self.state, initial_state_indices=inp["slot_idx"],
                cu_seqlens=inp["cu_seqlens"], use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
                softplus_threshold=20.0, is_kda=False, disable_state_update=True, cache_ring=True,
                **{k: v[0] for k, v in rings.items()})
            self.peers["fold"](
                checkpoint_state=self.state[None], rawv_cache=rings["replayssm_rawv"],
                rawk_cache=rings["replayssm_rawk"], g_cache=rings["replayssm_g"],
                beta_cache=rings["replayssm_beta"], ssm_state_indices=inp["slot_idx"],
                accept_lens=accepted, max_cache_len=T, num_k_heads=sh.Hk, null_block_id=-1)

        return VCase("gdn", "fold", run, lambda: held["o"])

    def refcheck_args(self, T: int, rows: int = 8, slots: int = 16) -> tuple[dict, list]:
        import torch

        cfg, sh, rng = self.cfg, self.sh, self.rng
        HV, Hk, K, V, R = sh.HV, sh.Hk, sh.K, sh.V, cfg.ring_rows(T, self.name)
        plan = refcheck_rows(rows, slots, cfg.flush_limit(T), T)
        dev = cfg.device
        args = {
            "state": rng.normal((slots, HV, V, K), self.sdt, 0.1),
            "ring_u": rng.normal((slots, HV, R, V), self.udt, 0.1),
            "ring_k": rng.normal((slots, Hk, R, K), self.adt),
            "ring_v": rng.normal((slots, HV, R, V), self.adt),
            "ring_g": self._log_gate(rng.normal((slots, HV, R), torch.float32)),
            "ring_beta": torch.sigmoid(rng.normal((slots, HV, R), torch.float32)),
        }
        inp = self.inputs(rows, T)
        inp["out"].fill_(float("nan"))
        args.update(inp)
        args["slot_idx"] = torch.tensor([s for s, _, _ in plan], dtype=torch.int32, device=dev)
        args["ring_start"] = rng.ints((rows,), R, torch.int32)
        args["ring_len"] = torch.tensor([h for _, h, _ in plan], dtype=torch.int32, device=dev)
        args["flush"] = torch.tensor([f for _, _, f in plan], dtype=torch.bool, device=dev)
        args["interm_idx"] = torch.arange(rows, dtype=torch.int32, device=dev)
        _read_args(self, args)
        return args, plan

    def pool_of(self, args: dict) -> dict:
        return _pool_of(self, args)
