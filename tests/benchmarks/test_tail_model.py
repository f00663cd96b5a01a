"""The launch-tail model (benchmarks/tail_model.py): list scheduling in launch order."""

from __future__ import annotations

import pytest

from benchmarks.tail_model import launch, main, makespan


def test_makespan_list_scheduling():
    assert makespan([1.0] * 8, 4) == 2.0  # two full waves
    assert makespan([1.0, 1.0, 1.0, 4.0], 2) == 5.0  # the long program starts last
    assert makespan([4.0, 1.0, 1.0, 1.0], 2) == 4.0  # ... or first
    assert makespan([], 3) == 0.0


def test_launch_order_and_long_programs_first(capsys):
    d = launch(batch=3, heads=2, programs_per_head=2, flush_rows={1}, nonflush_us=1.0,
               flush_us=5.0)
    assert d == [1.0] * 4 + [5.0] * 4 + [1.0] * 4
    main(["--batch", "64", "--heads", "4", "--slots", "32", "--nonflush-us", "1",
          "--flush-us", "8", "--tiles", "1,4", "--scale", "1,1", "--draws", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("flush rows first" in x for x in lines)
    # flush rows first never ends later than the median of random placements here
    for x in lines:
        mixed = float(x.split("mixed median ")[1].split(" ")[0])
        first = float(x.split("flush rows first ")[1].split(",")[0])
        assert first <= mixed


def test_scale_per_tiles_entry(capsys):
    with pytest.raises(SystemExit):
        main(["--nonflush-us", "1", "--flush-us", "8", "--tiles", "1,2", "--scale", "1"])
    assert "--scale: expected 2 values" in capsys.readouterr().err
