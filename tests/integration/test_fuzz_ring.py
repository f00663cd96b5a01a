"""Model-checked fuzz of the ring protocol and the radix-cache slot lifecycle on a real CPU
``ReplayMambaPool`` (issue 7, both families).

A hypothesis ``RuleBasedStateMachine`` drives allocate + prefill, chunked extend, decode steps,
speculative verify of ``T <= 3`` tokens with a random accepted count and its commit, forced flushes,
forks (``copy_from`` of a live slot, ring carried, source flushed first or not), radix donation of a
finished request (the slot enters the tree) and of an unfinished one (a copy enters it), prefix
matches (SGLang's slot allocation + copy-on-write from a node, then a suffix extend of 0-2 tokens),
eviction of tree nodes, offload / reload through ``get_cpu_copy`` / ``load_cpu_copy``, and free
(finish / abort) + slot reuse, against the float64 model of ``fuzz_ring_harness.py``; every
operation ends with ``RingHarness.check_all`` (see that module for what is checked). Tiny shapes
(H=2, P=4, N=4, G=1, L=4, R=7, 4 slots), torch references only, one intra-op thread.

CI: ``test_fuzz_ring_machine`` runs ``FUZZ_RING_EXAMPLES`` (default 2,000) derandomised Mamba-2
sequences of up to 12 operations and a quarter as many GDN ones (hypothesis database off, so every
run draws the same cases), and ``test_fuzz_ring_seeded`` 200 more per family from a plain seeded
driver. ``pytest -s`` prints sequences (hypothesis also runs a few hundred it discards),
operations by kind and sequences/s. Measured on a 2-core VM with both pytest-xdist workers busy
(2026-11-30, ``304e96b``): machine 153 s (Mamba-2) + 51 s (GDN), seeded 10-12 s per family.

``test_fuzz_ring_read_copy`` runs the default shape with a bf16 and an fp8 read copy (split precision;
the copy checked bit for bit against its checkpoint after every operation): 100 hypothesis and 60
seeded sequences per family and dtype in CI (~2 min for the four, both cores busy).

``test_fuzz_ring_shapes`` runs 30-operation sequences on three more shapes per family (2 layers with
L=5, T<=4, 5 slots; T > L (L=2, T=3); L=1): 50 hypothesis and 40 seeded ones each in CI
(19-81 s per shape and family on that VM).

More: ``FUZZ_RING_EXAMPLES=20000``, ``FUZZ_RING_SEED=<n>`` (a different, non-derandomised
hypothesis run, and the driver's base seed), or ``-m slow`` (the three shapes at 400 + 300
sequences each; ``slow`` tests are deselected unless ``-m`` names them, see ``pyproject.toml``).
"""

from __future__ import annotations

import os
import random
import time

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    precondition,
    rule,
)

from fuzz_ring_harness import STATS, GdnRingHarness, Mamba2RingHarness, ProtocolViolation

EXAMPLES = int(os.environ.get("FUZZ_RING_EXAMPLES", "2000"))
SEED = os.environ.get("FUZZ_RING_SEED")
SEEDS = st.integers(0, 2**31 - 1)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only cost (2-core CI: ~1.4x slower with 2 threads)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


FAMILIES = {"mamba2": Mamba2RingHarness, "gdn": GdnRingHarness}


def _machine(family: str = "mamba2", **shape):
    harness = FAMILIES[family]

    class RingMachine(RuleBasedStateMachine):
        """One example = one pool and one random sequence of pool / protocol operations."""

        @initialize(seed=SEEDS)
        def setup(self, seed):
            self.h = harness(seed=seed % 97, **shape)
            self.h.prefill(seed)

        def _pick(self, data, live=True):
            pool = self.h.live() if live else self.h.offloaded()
            return data.draw(st.sampled_from(sorted(r.rid for r in pool)), label="rid")

        def _rows(self, data):
            rids = sorted(r.rid for r in self.h.live())
            sub = data.draw(st.lists(st.sampled_from(rids), min_size=1, max_size=len(rids),
                                     unique=True), label="rows")
            force = data.draw(st.lists(st.booleans().map(lambda b: b and data.draw(
                st.integers(0, 4), label="f") == 0), min_size=len(sub), max_size=len(sub)),
                label="force")
            pads = data.draw(st.lists(st.integers(0, len(sub)), max_size=2), label="pads")
            return sub, force, pads

        @precondition(lambda self: self.h.free_slots() > 0)
        @rule(seed=SEEDS)
        def prefill(self, seed):
            self.h.prefill(seed)

        @precondition(lambda self: self.h.live())
        @rule(data=st.data(), seed=SEEDS, k=st.integers(1, 3))
        def extend(self, data, seed, k):
            self.h.extend(self._pick(data), seed, k)

        def _decode(self, data, seed):
            sub, force, pads = self._rows(data)
            self.h.decode(sub, seed=seed, force=force, pads=pads)

        def _verify(self, data, seed):
            sub, force, pads = self._rows(data)
            T = data.draw(st.integers(1, self.h.Tmax), label="T")
            acc = data.draw(st.lists(st.integers(1, T), min_size=len(sub), max_size=len(sub)),
                            label="accepted")
            self.h.verify(sub, T=T, accepted=acc, seed=seed, force=force, pads=pads)

        # Rules are drawn uniformly: two copies each give decode and verify twice the weight.
        @precondition(lambda self: self.h.live())
        @rule(data=st.data(), seed=SEEDS)
        def decode(self, data, seed):
            self._decode(data, seed)

        @precondition(lambda self: self.h.live())
        @rule(data=st.data(), seed=SEEDS)
        def decode_again(self, data, seed):
            self._decode(data, seed)

        @precondition(lambda self: self.h.live())
        @rule(data=st.data(), seed=SEEDS)
        def verify(self, data, seed):
            self._verify(data, seed)

        @precondition(lambda self: self.h.live())
        @rule(data=st.data(), seed=SEEDS)
        def verify_again(self, data, seed):
            self._verify(data, seed)

        @precondition(lambda self: self.h.live())
        @rule(data=st.data(), seed=SEEDS)
        def flush(self, data, seed):
            self.h.flush(self._pick(data), seed)

        @precondition(lambda self: self.h.live() and self.h.free_slots() > 0)
        @rule(data=st.data(), seed=SEEDS, flush_first=st.booleans())
        def fork(self, data, seed, flush_first):
            self.h.fork(self._pick(data), seed, flush_first=flush_first)

        @precondition(lambda self: self.h.live())
        @rule(data=st.data())
        def donate_finished(self, data):
            self.h.donate_finished(self._pick(data))

        @precondition(lambda self: self.h.live() and self.h.free_mamba_slots() > 0)
        @rule(data=st.data())
        def donate_unfinished(self, data):
            self.h.donate_unfinished(self._pick(data))

        @precondition(lambda self: self.h.nodes and self.h.free_slots() > 0)
        @rule(data=st.data(), seed=SEEDS, k=st.integers(0, 2))
        def match(self, data, seed, k):
            self.h.match(data.draw(st.sampled_from(sorted(self.h.nodes)), label="node"), seed, k)

        @precondition(lambda self: self.h.nodes and self.h.free_slots() > 0)
        @rule(data=st.data(), seed=SEEDS, k=st.integers(0, 2))
        def match_again(self, data, seed, k):
            self.h.match(data.draw(st.sampled_from(sorted(self.h.nodes)), label="node"), seed, k)

        @precondition(lambda self: self.h.nodes)
        @rule(data=st.data())
        def evict(self, data):
            self.h.evict(data.draw(st.sampled_from(sorted(self.h.nodes)), label="node"))

        @precondition(lambda self: self.h.live())
        @rule(data=st.data())
        def offload(self, data):
            self.h.offload(self._pick(data))

        @precondition(lambda self: self.h.offloaded() and self.h.free_slots() > 0)
        @rule(data=st.data())
        def reload(self, data):
            self.h.reload(self._pick(data, live=False))

        @precondition(lambda self: self.h.reqs)
        @rule(data=st.data())
        def free(self, data):
            self.h.free(data.draw(st.sampled_from(sorted(self.h.reqs)), label="rid"))

    return RingMachine


def _settings(examples: int, steps: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    database=None, derandomize=SEED is None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


def _report(what: str, t0: float) -> None:
    dt = time.perf_counter() - t0
    n = STATS["sequences"]
    ops = sum(v for k, v in STATS.items() if k != "sequences")
    print(f"\n{what}: {n} sequences, {ops} checked operations in {dt:.1f} s "
          f"({n / dt:.0f} sequences/s); {dict(sorted(STATS.items()))}")
    STATS.clear()


def _run(machine, examples: int, steps: int) -> None:
    test = get_state_machine_test(machine, settings=_settings(examples, steps))
    if SEED is not None:
        test = hseed(int(SEED))(test)
    STATS.clear()
    t0 = time.perf_counter()
    test()
    _report("hypothesis machine", t0)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fuzz_ring_machine(family: str):
    """``FUZZ_RING_EXAMPLES`` (default 2,000) derandomised hypothesis sequences for Mamba-2, a
    quarter as many for GDN (same protocol and pool code; the CI budget is ~90 s), T <= 3."""
    n = EXAMPLES if family == "mamba2" else max(EXAMPLES // 4, 1)
    _run(_machine(family, slots=4, window=4, max_tokens=3, layers=1), n, 12)


# ---------------------------------------------------------------------- seeded random driver

OPS = ("prefill", "decode", "decode", "verify", "verify", "verify", "flush", "fork", "offload",
       "reload", "free", "extend", "donate_finished", "donate_unfinished", "match", "evict")


def drive(seed: int, *, family: str = "mamba2", n_ops: int = 12, **shape):
    """One random operation sequence from ``random.Random(seed)``; raises ``ProtocolViolation``."""
    rng = random.Random(seed)
    h = FAMILIES[family](seed=seed % 97, **shape)
    h.prefill(rng.randrange(1 << 31))
    for _ in range(n_ops):
        live, off = h.live(), h.offloaded()
        op = rng.choice(OPS)
        s = rng.randrange(1 << 31)
        if op == "prefill" or (not live and op not in ("reload", "match", "evict")):
            if h.free_slots():
                h.prefill(s)
        elif op in ("decode", "verify"):
            sub = rng.sample(live, rng.randint(1, len(live)))
            rids = [r.rid for r in sub]
            force = [rng.random() < 0.15 for _ in sub]
            pads = [rng.randint(0, len(sub)) for _ in range(rng.randint(0, 2))]
            if op == "decode":
                h.decode(rids, seed=s, force=force, pads=pads)
            else:
                T = rng.randint(1, h.Tmax)
                acc = [rng.choice([1, T, rng.randint(1, T)]) for _ in sub]
                h.verify(rids, T=T, accepted=acc, seed=s, force=force, pads=pads)
        elif op == "flush":
            h.flush(rng.choice(live).rid, s)
        elif op == "fork":
            if h.free_slots():
                h.fork(rng.choice(live).rid, s, flush_first=rng.random() < 0.3)
        elif op == "donate_finished":
            h.donate_finished(rng.choice(live).rid)
        elif op == "donate_unfinished":
            if h.free_mamba_slots():
                h.donate_unfinished(rng.choice(live).rid)
        elif op == "match":
            if h.nodes and h.free_slots():
                h.match(rng.choice(sorted(h.nodes)), s, rng.randint(0, 2))
        elif op == "evict":
            if h.nodes:
                h.evict(rng.choice(sorted(h.nodes)))
        elif op == "offload":
            h.offload(rng.choice(live).rid)
        elif op == "reload":
            if off and h.free_slots():
                h.reload(rng.choice(off).rid)
        elif op == "free":
            h.free(rng.choice(sorted(h.reqs)))
        elif op == "extend":
            h.extend(rng.choice(live).rid, s, rng.randint(1, 3))
    return h


def _drive_many(base: int, count: int, **kw) -> None:
    STATS.clear()
    t0 = time.perf_counter()
    for i in range(count):
        try:
            drive(base + i, **kw)
        except ProtocolViolation as e:
            raise AssertionError(f"drive(seed={base + i}, {kw}) failed: {e}") from e
    _report("seeded driver", t0)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fuzz_ring_seeded(family: str):
    """200 sequences of the plain seeded driver (verify-heavy, accepted counts biased to 1 and T)."""
    _drive_many(int(SEED or 0) * 100_000, 200, family=family, slots=4, window=4, max_tokens=3,
                layers=1)


READ_COPIES = pytest.mark.parametrize("read", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])


@READ_COPIES
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fuzz_ring_read_copy(family: str, read: torch.dtype):
    """Split precision: the default shape with a read copy (the references read it and refresh it on
    flush rows; ``check_all`` holds every live and tree slot's copy to ``quantize_rows`` of its
    checkpoint): ``FUZZ_RING_EXAMPLES / 20`` (at least 50) hypothesis and 60 seeded sequences."""
    shape = dict(slots=4, window=4, max_tokens=3, layers=1, read_dtype=read)
    _run(_machine(family, **shape), max(EXAMPLES // 20, 50), 12)
    _drive_many(int(SEED or 0) * 100_000 + 3_000_000, 60, family=family, n_ops=16, **shape)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fuzz_ring_read_copy_catches_a_missed_refresh(monkeypatch, family: str):
    """The copy check can fail: an extend that writes the checkpoint without the backends' refresh
    is caught at its own step."""
    import fuzz_ring_harness as harness

    def stale(self, slot, S):
        self.temporal[:, slot] = S

    monkeypatch.setattr(harness.RingHarness, "_write_checkpoint", stale)
    with pytest.raises(ProtocolViolation, match=r"step 1: read copy of \(layer, slot\) \[\(0, 1\)\]"):
        drive(0, family=family, slots=4, window=4, max_tokens=3, layers=1, read_dtype=torch.bfloat16)


SHAPES = pytest.mark.parametrize("shape", [
    dict(slots=5, window=5, max_tokens=4, layers=2),
    dict(slots=3, window=2, max_tokens=3, layers=1),  # T > L: R = max(L, T) + T
    dict(slots=3, window=1, max_tokens=2, layers=1),  # L = 1: every decode step flushes
], ids=["L5T4x2", "L2T3", "L1T2"])


@SHAPES
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fuzz_ring_shapes(family, shape):
    """The three other shapes at an eighth of the slow run's sequences (CI)."""
    _run(_machine(family, **shape), max(EXAMPLES // 40, 50), 30)
    _drive_many(int(SEED or 0) * 100_000 + 2_000_000, 40, family=family, n_ops=30, **shape)


@pytest.mark.slow
@SHAPES
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fuzz_ring_slow(family, shape):
    _run(_machine(family, **shape), max(EXAMPLES // 5, 400), 30)
    _drive_many(int(SEED or 0) * 100_000 + 1_000_000, 300, family=family, n_ops=30, **shape)


# ---------------------------------------------------------------------- regression cases


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("flush_first", [False, True])
def test_regression_fork_source_with_pending_verify_window(family: str, flush_first: bool):
    """A fork right after a verify whose accepted window is still in the ring (len = a after a
    flush verify): the copy carries the ring (or the source is flushed first), and the branches
    stay isolated."""
    h = FAMILIES[family](slots=4, window=4, max_tokens=3)
    a = h.prefill(1)
    h.verify([a], T=3, accepted=[3], seed=2)
    h.verify([a], T=3, accepted=[2], seed=3)  # len 3 + 3 > 4: flush verify, len = 2
    b = h.fork(a, 4, flush_first=flush_first)
    h.verify([b, a], T=2, accepted=[1, 2], seed=5, pads=[1])
    h.decode([a, b], seed=6)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_regression_unfinished_donation_with_pending_ring(family: str):
    """The machine's first failure with the hook's donation handling removed (mutation check): a
    copy of a slot with one ring record entered the tree as the state of the full key."""
    h = FAMILIES[family](slots=4, window=4, max_tokens=3)
    a = h.prefill(0)
    h.decode([a], seed=0)  # len 1
    n = h.donate_unfinished(a)  # key = ntok - 1, node ring empty
    b = h.match(n, seed=1, k=0)
    h.decode([b, a], seed=2)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_regression_finished_donation_zeroes_the_cursor_pair(family: str):
    """Found by the machine: SGLang's finished donation zeroes ``len`` only; the node kept
    ``start = 1`` and a copy-on-write carried it. The hook now zeroes the tree slot's pair."""
    h = FAMILIES[family](slots=4, window=4, max_tokens=3)
    a = h.prefill(0)
    h.verify([a], T=1, accepted=[1], seed=0)
    b = h.fork(a, 0, flush_first=True)  # a flushed: start 1, len 0
    h.donate_finished(a)
    n = h.donate_finished(b)
    h.evict(min(h.nodes))
    h.match(n, seed=0, k=0)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_regression_slot_reuse_after_free_and_offload(family: str):
    """Free and offload hand slots back; their stale cursors must not reach the next owner."""
    h = FAMILIES[family](slots=2, window=4, max_tokens=3)
    a = h.prefill(1)
    h.decode([a], seed=2)
    h.verify([a], T=3, accepted=[2], seed=3)  # a: len 3, start 0
    h.offload(a)
    b = h.prefill(4)  # reuses a's slot
    h.decode([b], seed=5)
    c = h.prefill(6)
    h.free(b)
    assert h.reload(a)
    h.verify([a, c], T=3, accepted=[1, 3], seed=7)
    h.decode([c, a], seed=8, force=[False, True])


def test_regression_offload_with_0d_index_aliases_on_cpu():
    """Found by the fuzz (seeds 0, 1, 6 of the seeded driver with SGLang's 0-d index): the CPU
    backup aliased the freed slot; ReplayMambaPool.get_cpu_copy now copies."""
    h = Mamba2RingHarness(slots=2, window=4, max_tokens=3, offload_0d=True)
    a = h.prefill(1)
    h.decode([a], seed=2)
    h.offload(a)  # backup taken with req.mamba_pool_idx (0-d), slot freed
    h.prefill(3)  # the next owner writes the slot
    h.reload(a)  # -> a's checkpoint/rings/cursors are the new owner's (or the harness's NaN poison)
