"""A list-scheduling model of one decode launch's makespan (a model, not a measurement).

The GPU starts a grid's programs in launch order as slots free up; with programs of two lengths
(a flush row's fold, a non-flush row's output) a long program that starts late stretches the
launch's tail. The model fills ``slots`` resident-program slots in launch order (tiles of a head,
then heads, then rows), each program a constant time, and reports the makespan of a mixed batch
(one row in ``L`` flushing, at random positions or first), of an all-non-flush step and of an
all-flush step. Used in benchmarks/notes/gdn_decode.md for the ``tiles`` launch.

    python -m benchmarks.tail_model --nonflush-us 6.37 --flush-us 19.89 --tiles 1,2,4 \\
        --scale 1.0,0.8,0.7
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Sequence


def makespan(durations: Sequence[float], slots: int) -> float:
    """Finish time of programs started in order on ``slots`` slots, each when one frees up.

    Parameters
    ----------
    durations : sequence of float
        Each program's run time, in launch order.
    slots : int
        Programs resident at once.

    Returns
    -------
    float
        The last program's finish time.
    """
    free = [0.0] * slots
    end = 0.0
    for d in durations:
        t = heapq.heappop(free) + d
        heapq.heappush(free, t)
        end = max(end, t)
    return end


def launch(batch: int, heads: int, programs_per_head: int, flush_rows: set[int],
           nonflush_us: float, flush_us: float) -> list[float]:
    """Program durations in launch order: the fastest grid dimension is the head's programs, then
    the heads, then the rows (``flush_rows`` take ``flush_us``)."""
    return [flush_us if b in flush_rows else nonflush_us
            for b in range(batch) for _ in range(heads * programs_per_head)]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-tiles", type=int, default=4, help="value tiles per head")
    p.add_argument("--slots", type=int, default=132 * 8, help="resident programs (SMs x per SM)")
    p.add_argument("--window", type=int, default=16, help="L: one row in L flushes")
    p.add_argument("--nonflush-us", type=float, required=True, help="one non-flush tile")
    p.add_argument("--flush-us", type=float, required=True, help="one flush tile")
    p.add_argument("--tiles", default="1,2,4", help="tiles per program")
    p.add_argument("--scale", default="1.0,0.8,0.7",
                   help="non-flush time per tile relative to one tile, per --tiles entry")
    p.add_argument("--draws", type=int, default=20)
    a = p.parse_args(argv)
    tiles, scales = [int(x) for x in a.tiles.split(",")], [float(x) for x in a.scale.split(",")]
    if len(tiles) != len(scales):
        p.error(f"--scale: expected {len(tiles)} values (one per --tiles entry), got {len(scales)}")
    n_flush = a.batch // a.window
    for t, r in zip(tiles, scales):
        nf, fl, per_head = a.nonflush_us * r * t, a.flush_us * t, a.head_tiles // t
        mixed = [makespan(launch(a.batch, a.heads, per_head,
                                 set(random.Random(s).sample(range(a.batch), n_flush)), nf, fl),
                          a.slots) for s in range(a.draws)]
        first = makespan(launch(a.batch, a.heads, per_head, set(range(n_flush)), nf, fl), a.slots)
        all_nf = makespan(launch(a.batch, a.heads, per_head, set(), nf, fl), a.slots)
        all_f = makespan(launch(a.batch, a.heads, per_head, set(range(a.batch)), nf, fl), a.slots)
        work = ((a.batch - n_flush) * nf + n_flush * fl) * a.heads * per_head / a.slots
        print(f"tiles={t} scale={r}: mixed median {statistics.median(mixed):.1f} us (max "
              f"{max(mixed):.1f}), flush rows first {first:.1f}, work bound {work:.1f}; cycle "
              f"mean {((a.window - 1) * all_nf + all_f) / a.window:.1f} (non-flush {all_nf:.1f}, "
              f"flush {all_f:.1f})")


if __name__ == "__main__":
    main()
