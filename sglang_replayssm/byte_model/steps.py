"""Where one request's bytes go in one layer and step, and the per-phase models built on that.

A decode kernel's step depends on its phase ``w`` (records already in the ring: ``KernelBytes``); a
verify kernel's step on the committed history ``h`` and whether the row flushes (``VerifyBytes``).
Unphased kernels (conventional updates, SGLang's snapshot verify and commit) move the same bytes
every step. All counts are bytes, per layer and request, unique (each byte read or written once per
launch; see the package docstring for what is left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["KernelBytes", "StepBytes", "VerifyBytes", "verify_cycle"]


@dataclass(frozen=True)
class StepBytes:
    """Bytes one request moves in one layer at one step, by where they go.

    Attributes
    ----------
    state_read, state_write : int
        Checkpoint (or read copy) bytes read and written.
    ring_read, ring_write : int
        Ring record bytes read (history) and written (appended records; for unphased kernels any
        other bytes the model adds, e.g. SGLang's raw window).
    io : int
        Activations in and outputs out.
    """

    state_read: int
    state_write: int
    ring_read: int
    ring_write: int
    io: int

    @property
    def total(self) -> int:
        """All bytes of the step."""
        return self.state_read + self.state_write + self.ring_read + self.ring_write + self.io


@dataclass(frozen=True)
class KernelBytes:
    """Per-phase byte model of one decode kernel.

    ``L == 0`` marks a kernel without phases (a conventional update): every step is ``2S + I``.
    Non-flush phase ``w``: ``S`` + ``w·ring_read_nonflush`` + ``ring_write`` + ``I``.
    Flush phase ``w``: ``2S`` + ``w·ring_read_flush`` + ``I``.

    Attributes
    ----------
    name : str
        Label of the kernel.
    L : int
        Decode window (phases ``w = 0 .. L-1``, the last one flushing); 0 for an unphased kernel.
    S, I : int
        State bytes and one token's I/O bytes (``sizes.Sizes``).
    ring_read_nonflush, ring_read_flush : int
        Bytes read per history record by a non-flush / flush step.
    ring_write : int
        Bytes of the record a non-flush step appends.
    note : str
        What the fields are (for reports).
    """

    name: str
    L: int
    S: int
    I: int  # noqa: E741
    ring_read_nonflush: int = 0
    ring_read_flush: int = 0
    ring_write: int = 0
    note: str = ""

    @property
    def phased(self) -> bool:
        """Whether the kernel has ring phases (``L > 0``)."""
        return self.L > 0

    def phase(self, w: int, flush: bool | None = None) -> StepBytes:
        """Bytes at ring length ``w``; ``flush`` defaults to ``w == L-1`` (the ring is full).

        Raises
        ------
        ValueError
            ``w`` outside ``0 .. L-1`` (phased kernels).
        """
        if not self.phased:
            return StepBytes(self.S, self.S, 0, 0, self.I)
        if not 0 <= w <= self.L - 1:
            raise ValueError(f"{self.name}: expected 0 <= w <= {self.L - 1}, got {w}")
        if flush is None:
            flush = w == self.L - 1
        if flush:
            return StepBytes(self.S, self.S, w * self.ring_read_flush, 0, self.I)
        return StepBytes(self.S, 0, w * self.ring_read_nonflush, self.ring_write, self.I)

    def phases(self) -> list[StepBytes]:
        """One entry per phase ``w = 0 .. L-1`` (a single entry for an unphased kernel)."""
        if not self.phased:
            return [self.phase(0)]
        return [self.phase(w) for w in range(self.L)]

    def cycle_mean(self) -> float:
        """Mean bytes per step over the L-phase cycle (flush step included)."""
        ph = self.phases()
        return sum(p.total for p in ph) / len(ph)

    def batch_bytes(self, phases: Iterable[int] | None = None, batch: int | None = None) -> int:
        """Bytes of one launch: ``phases`` lists each row's ``w`` (flush iff ``w == L-1``).

        For an unphased kernel give ``batch`` instead.

        Raises
        ------
        ValueError
            Neither ``phases`` nor ``batch`` given (unphased), or no ``phases`` (phased).
        """
        if not self.phased:
            if batch is None:
                if phases is None:
                    raise ValueError(f"{self.name}: expected phases or batch")
                batch = len(list(phases))
            return batch * self.phase(0).total
        if phases is None:
            raise ValueError(f"{self.name}: expected per-row phases")
        return sum(self.phase(int(w)).total for w in phases)


@dataclass(frozen=True)
class VerifyBytes:
    """Per-step byte model of one verify kernel (or step) of ``T`` tokens per request.

    Phased kernels (ring-based: ours, SGLang's built-in circular ring) at history length ``h``
    (committed records in the ring): ``S`` read (``flush_state_reads·S`` on a flush row), ``S``
    written on flush rows, ``h`` history records read (``ring_read_nonflush`` or
    ``ring_read_flush`` bytes each), ``T`` window records written (``ring_write`` each), ``T·I``
    activations in and outputs out. Unphased kernels (``phased=False``: SGLang's snapshot verify
    and commit) move ``state_reads·S + state_writes·S + T·I + extra`` whatever the history.

    Attributes
    ----------
    name : str
        Label of the kernel.
    T : int
        Tokens verified per request (the last accepted token and ``T-1`` drafts).
    S, I : int
        State bytes and one token's I/O bytes (``sizes.Sizes``).
    phased : bool
        Whether the bytes depend on ``(h, flush)``.
    ring_read_nonflush, ring_read_flush : int
        Bytes read per history record by a non-flush / flush row.
    ring_write : int
        Bytes of one window record.
    state_reads, state_writes : int
        Multiples of ``S`` read and written (unphased kernels).
    flush_state_reads : int
        Multiples of ``S`` a flush row reads: 2 where a second launch reads the folded state again.
    io_tokens : int or None
        Tokens of activations moved (default ``T``; 0 for a commit).
    extra : int
        Further bytes of an unphased kernel (counted as ``ring_write``).
    note : str
        What the fields are (for reports).
    """

    name: str
    T: int
    S: int
    I: int  # noqa: E741 (per token, math.md's symbol)
    phased: bool = True
    ring_read_nonflush: int = 0
    ring_read_flush: int = 0
    ring_write: int = 0
    state_reads: int = 1
    state_writes: int = 0
    flush_state_reads: int = 1
    io_tokens: int | None = None
    extra: int = 0
    note: str = ""

    def step(self, h: int = 0, flush: bool = False) -> StepBytes:
        """Bytes of one request at history length ``h`` (ignored when unphased).

        Raises
        ------
        ValueError
            ``h < 0`` (phased kernels).
        """
        io = (self.T if self.io_tokens is None else self.io_tokens) * self.I
        if not self.phased:
            return StepBytes(self.state_reads * self.S, self.state_writes * self.S, 0, self.extra,
                             io)
        if h < 0:
            raise ValueError(f"{self.name}: expected h >= 0, got {h}")
        per = self.ring_read_flush if flush else self.ring_read_nonflush
        reads = self.flush_state_reads if flush else 1
        return StepBytes(reads * self.S, self.S if flush else 0, h * per, self.T * self.ring_write, io)

    def batch_bytes(self, rows: Iterable[tuple[int, bool]]) -> int:
        """Bytes of one launch whose rows are at ``(h, flush)``."""
        return sum(self.step(h, f).total for h, f in rows)

    def cycle_mean(self, cycle: Sequence[tuple[int, bool]]) -> float:
        """Mean bytes per step of one request over ``cycle`` (``verify_cycle``'s ``(h, flush)``)."""
        return self.batch_bytes(cycle) / len(cycle)


def verify_cycle(L: int, T: int, a: int) -> list[tuple[int, bool]]:
    """Steady-state verify cycle of one slot with a constant accepted count ``a`` (kernels/README.md's
    rule, ``verify_cursor_step``).

    After a flush step the history is ``a``; each non-flush step adds ``a``; a step flushes when
    ``len + T > L``. Returns the ``(len, flush)`` of each step of one cycle, the flush step last
    (e.g. ``L=16, T=4, a=2``: lens 2, 4, ..., 12, then 14 flushing). ``len <= max(L, T)`` always,
    and the cycle is ``F = floor(max(L - T, 0)/a) + 1`` steps long, with mean history ``a·(F+1)/2``.

    Parameters
    ----------
    L : int
        Decode window, ``>= 1`` (for ``verify_cursor_step``'s late rule, the served one, pass
        ``max(L, T) + T``, ``sizing.verify_flush_limit``: the rule is the same with it in place of
        ``L``).
    T : int
        Tokens verified per request, ``>= 1``.
    a : int
        Tokens accepted per step (bonus token included), ``1 <= a <= T``.

    Raises
    ------
    ValueError
        ``L`` or ``T`` below 1, or ``a`` outside ``1 .. T``.
    """
    if L < 1 or T < 1:
        raise ValueError(f"L, T: expected >= 1, got {L}, {T}")
    if not 1 <= a <= T:
        raise ValueError(f"expected 1 <= a <= T = {T}, got a = {a}")
    out, h = [], a
    while h + T <= L:
        out.append((h, False))
        h += a
    out.append((h, True))
    return out
