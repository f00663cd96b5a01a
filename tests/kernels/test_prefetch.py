"""``replayssm_kernels.prefetch.wave_ahead_or_off``: when the launchers' one-wave L2 hint is on."""

from __future__ import annotations

import torch

from replayssm_kernels.prefetch import wave_ahead_or_off


def test_wave_ahead_or_off(monkeypatch):
    state = torch.zeros(3, 2, 8, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert wave_ahead_or_off(5, state, None) == 5
    assert wave_ahead_or_off(0, state, None) == 0
    assert wave_ahead_or_off(5, state, state.clone()) == 0  # a read copy: non-flush rows read it
    assert wave_ahead_or_off(5, state.transpose(2, 3), None) == 0  # rows not back to back
    assert wave_ahead_or_off(5, torch.zeros(3, 2, 8, 3), None) == 0  # 12-byte rows: not 16-byte aligned
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert wave_ahead_or_off(5, state, None) == 0  # the interpreter runs no inline PTX
