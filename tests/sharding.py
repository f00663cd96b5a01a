"""``pytest --shard I/N``: run the I-th of N disjoint parts of the selected tests, whole files per part.

For the GPU suite on the lent device, whose calls end after 10 minutes: ``pytest -m gpu --shard 1/2``
in one call, ``--shard 2/2`` in the next. A file's tests stay together (module fixtures, cached
builds); files go to the part with the fewest tests so far, largest file first, ties by path, so
the split is the same on every machine for the same selection.
"""

from __future__ import annotations

from collections import Counter

import pytest


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (``1 <= I <= N``) -> ``(I, N)``; ``ValueError`` naming the expected form otherwise."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard: expected I/N with integers, e.g. 1/2; got {text!r}") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard: expected 1 <= I <= N; got {text!r}")
    return i, n


def shard_files(files: list[str], n: int) -> dict[str, int]:
    """Part (1-based) of every file in ``files`` (one entry per selected test) among ``n`` parts."""
    counts = Counter(files)
    load = [0] * n
    part: dict[str, int] = {}
    for path in sorted(counts, key=lambda p: (-counts[p], p)):
        k = min(range(n), key=lambda j: (load[j], j))
        part[path] = k + 1
        load[k] += counts[path]
    return part


class ShardPlugin:
    """Registered by ``tests/conftest.py`` for ``--shard I/N``: keeps part ``I`` of ``N``, after ``-m`` /
    ``-k`` deselection (``trylast``), and reports the rest as deselected."""

    def __init__(self, index: int, count: int) -> None:
        self.index, self.count = index, count

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        part = shard_files([str(item.path) for item in items], self.count)
        config.hook.pytest_deselected(items=[item for item in items if part[str(item.path)] != self.index])
        items[:] = [item for item in items if part[str(item.path)] == self.index]
