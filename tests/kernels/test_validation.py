"""Input validation that no single kernel's test file owns: the launch device of the GDN kernels, the
cursor helpers' integer arguments and ``reset_cursors``, the read-copy rounding helpers and the row
order's limits. Each bad input must raise ``ValueError`` naming expected and actual, before any launch.
(Found by an audit that passed each bad input to the public functions; thirty-first session.)"""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels import commit, cursors
from replayssm_kernels.gdn_decode import gdn_replay_decode
from replayssm_kernels.gdn_verify import gdn_replay_verify
from replayssm_kernels.mamba2_decode.read_copy import dequantize_rows, quantize_rows
from replayssm_kernels.row_order import MAX_BATCH, flush_first_order
from tests.kernels.test_gdn_decode import _args as decode_args
from tests.kernels.test_gdn_verify import _args as verify_args

F8 = torch.float8_e4m3fn


@pytest.mark.parametrize("op", ["decode", "verify"])
def test_gdn_kernels_refuse_cpu_tensors_without_the_interpreter(monkeypatch, op):
    """As the Mamba-2 kernels do: a ValueError, not Triton's 'no active driver' RuntimeError."""
    if torch.cuda.is_available():
        pytest.skip("checks CPU tensors on a machine without CUDA")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fn, args = (gdn_replay_decode, decode_args()) if op == "decode" else (gdn_replay_verify, verify_args())
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        fn(**{k: v.cpu() for k, v in args.items()}, scale=0.25)


def test_gdn_decode_refuses_a_strided_row_order():
    args = decode_args()
    order = torch.zeros(2 * args["slot_idx"].shape[0], dtype=torch.int32, device=args["state"].device)[::2]
    with pytest.raises(ValueError, match="row_order: expected stride 1"):
        gdn_replay_decode(**args, scale=0.25, row_order=order)


def _step_tensors(batch: int = 2):
    return dict(cursors=torch.zeros(4, 2, dtype=torch.int32), slot_idx=torch.arange(batch, dtype=torch.int32),
                force_flush=None, out_start=torch.zeros(batch, dtype=torch.int32),
                out_len=torch.zeros(batch, dtype=torch.int32), out_flush=torch.zeros(batch, dtype=torch.bool))


@pytest.mark.parametrize("fn", [cursors.decode_cursor_step, cursors.decode_cursor_step_ref])
@pytest.mark.parametrize("window, ring_size, match", [
    (float("nan"), 8, "window: expected an int"), (4.5, 8, "window: expected an int"), (True, 8, "window"),
    (4, float("nan"), "ring_size: expected an int"), (4, 3, "ring_size: expected >= window"), (0, 8, "window"),
])
def test_decode_cursor_step_wants_int_window_and_ring(fn, window, ring_size, match):
    t = _step_tensors()
    with pytest.raises(ValueError, match=match):
        fn(t["cursors"], t["slot_idx"], None, window, ring_size, t["out_start"], t["out_len"], t["out_flush"])


@pytest.mark.parametrize("fn", [commit.verify_cursor_step, commit.verify_cursor_step_ref])
def test_verify_cursor_step_wants_ints(fn):
    t = _step_tensors()
    for window, ring_size, num_tokens, match in ((float("nan"), 12, 4, "window"), (4, 12.0, 4, "ring_size"),
                                                 (4, 12, 4.0, "num_tokens")):
        with pytest.raises(ValueError, match=match + ": expected an int"):
            fn(t["cursors"], t["slot_idx"], None, window, ring_size, num_tokens, t["out_start"], t["out_len"],
               t["out_flush"])
    with pytest.raises(ValueError, match="cursors: expected a torch.Tensor, got NoneType"):
        fn(None, t["slot_idx"], None, 4, 12, 4, t["out_start"], t["out_len"], t["out_flush"])


def test_min_ring_size_wants_ints():
    assert commit.min_ring_size(16, 4) == 20 and commit.min_ring_size(16, 0) == 16  # 0: no speculation
    for window, num_tokens in ((float("nan"), 2), (0, 0), (4, 2.5), (4, -1)):
        with pytest.raises(ValueError, match="expected an int >= [01]|expected >= [01]"):
            commit.min_ring_size(window, num_tokens)


def test_reset_cursors_validates():
    cur = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    cursors.reset_cursors(cur, torch.tensor([1, 3]))
    assert cur.tolist() == [[0, 1], [0, 0], [4, 5], [0, 0]]
    for bad_cursors, slots, match in (
        (cur.long(), torch.tensor([1]), "cursors"), (cur[:, :1], torch.tensor([1]), "cursors"),
        (cur, torch.tensor([1.7]), "slots"), (cur, torch.tensor([[1]]), "slots"),
        (cur, torch.tensor([1], device="meta"), "slots: expected device"),
    ):
        with pytest.raises(ValueError, match=match):
            cursors.reset_cursors(bad_cursors, slots)


def test_read_copy_rounding_helpers_validate():
    S = torch.randn(3, 8)
    q, scale = quantize_rows(S, F8)
    assert torch.allclose(dequantize_rows(q, scale), S, rtol=0.07)
    for dtype in (torch.float8_e5m2, torch.int8, torch.float32):
        with pytest.raises(ValueError, match="dtype: expected one of"):
            quantize_rows(S, dtype)
    with pytest.raises(ValueError, match="scale: expected a fp32 tensor of shape \\(3,\\)"):
        dequantize_rows(q, None)
    with pytest.raises(ValueError, match="scale"):
        dequantize_rows(q, scale[:, None])
    with pytest.raises(ValueError, match="scale: expected None"):
        dequantize_rows(S.bfloat16(), scale)
    with pytest.raises(ValueError, match="q: expected dtype"):
        dequantize_rows(S, None)


def test_flush_first_order_refuses_more_rows_than_one_program_holds():
    flush = torch.zeros(MAX_BATCH + 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=f"at most {MAX_BATCH} rows"):
        flush_first_order(flush, torch.empty(MAX_BATCH + 1, dtype=torch.int32))
