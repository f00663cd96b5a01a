"""The opt-in server check of the read copy (``sglang_replayssm.read_copy_check``, CPU): it finds a
copy row that is not ``quantize_rows`` of its checkpoint (one bit of the copy, or of an fp8 scale),
names the layer and slot, skips padding and the null slot 0, and does nothing unless enabled."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm import read_copy_check as rc
from tests.integration.test_read_copy_pool import READ, SIZE, _fill, _pool


@pytest.mark.parametrize("read", READ)
def test_consistent_copy_has_no_mismatch(read):
    pool = _pool(read)
    _fill(pool, 1)
    slots = torch.tensor([-1, 0, 2, 5, 2])
    assert rc.mismatched_rows(pool.mamba_cache.temporal, pool.read_state, pool.read_scale, slots) == []


@pytest.mark.parametrize(("read", "scale"), [(r, False) for r in READ] + [(torch.float8_e4m3fn, True)])
def test_one_flipped_bit_is_found_with_its_layer_and_slot(read, scale):
    pool = _pool(read)
    _fill(pool, 2)
    if scale:
        pool.read_scale[1, 4, 3] *= 2.0
    else:
        pool.read_state.view(torch.uint8)[1, 4].view(-1)[7] ^= 1
    slots = torch.tensor([3, 4, -1])
    assert rc.mismatched_rows(pool.mamba_cache.temporal, pool.read_state, pool.read_scale, slots) == [(1, 4)]
    # a row outside the batch is not checked
    assert rc.mismatched_rows(pool.mamba_cache.temporal, pool.read_state, pool.read_scale,
                              torch.tensor([3, 5])) == []


def test_null_slot_is_skipped():
    pool = _pool(torch.bfloat16)
    _fill(pool, 3)
    pool.mamba_cache.temporal[0, 0] += 1.0  # graph warm-up / padding rows write slot 0's checkpoint
    assert rc.mismatched_rows(pool.mamba_cache.temporal, pool.read_state, None, torch.tensor([0, 1])) == []


def test_check_forward_raises_only_when_enabled(monkeypatch, caplog):
    pool = _pool(torch.bfloat16)
    _fill(pool, 4)
    backend = SimpleNamespace(pool=pool)
    pool.mamba_cache.temporal[2, SIZE] += 1.0
    slots = torch.tensor([1, SIZE])
    monkeypatch.delenv(rc.ENV_VAR, raising=False)
    rc.check_forward(backend, slots, "test")  # off: nothing checked
    assert not hasattr(backend, "_read_copy_checker")
    monkeypatch.setenv(rc.ENV_VAR, "1")
    with pytest.raises(RuntimeError, match=rf"1 \(layer, slot\) rows .*\[\(2, {SIZE}\)\]"):
        rc.check_forward(backend, slots, "test")
    pool.refresh_read(torch.tensor([SIZE]))
    with caplog.at_level("INFO", logger=rc.__name__):
        rc.check_forward(backend, slots, "test")
        rc.check_forward(backend, slots, "test")
    checker = backend._read_copy_checker
    assert (checker.checks, checker.rows) == (2, 4)
    assert sum("read-copy check passed: 1 forwards, 2 rows" in r.message for r in caplog.records) == 1


def test_pool_without_copy_is_not_checked(monkeypatch):
    monkeypatch.setenv(rc.ENV_VAR, "1")
    backend = SimpleNamespace(pool=_pool(None))
    rc.check_forward(backend, torch.tensor([1, 2]), "test")
    assert backend._read_copy_checker.checks == 0
