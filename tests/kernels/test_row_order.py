"""``flush_first_order`` (Triton, the interpreter on CPU) against its torch reference: a
permutation of the batch with the flush rows first, each group in batch order."""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels.row_order import flush_first_order, flush_first_order_ref

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
OPS = {"kernel": flush_first_order, "ref": flush_first_order_ref}


@pytest.mark.parametrize("op", ["kernel", "ref"])
@pytest.mark.parametrize("batch,p", [(1, 0.5), (5, 0.0), (16, 1.0), (17, 0.3), (300, 0.07)])
def test_order_is_flush_first_and_stable(op, batch, p):
    g = torch.Generator().manual_seed(batch)
    flush = (torch.rand(batch, generator=g) < p).to(DEVICE)
    order = torch.full((batch,), -7, dtype=torch.int32, device=DEVICE)
    OPS[op](flush, order)
    got = order.cpu().tolist()
    f = flush.cpu().tolist()
    want = [i for i in range(batch) if f[i]] + [i for i in range(batch) if not f[i]]
    assert got == want


@pytest.mark.parametrize("op", ["kernel", "ref"])
def test_value_errors(op):
    flush = torch.zeros(4, dtype=torch.bool, device=DEVICE)
    for fl, order, msg in (
        (flush.int(), torch.zeros(4, dtype=torch.int32, device=DEVICE),
         r"flush: expected \[batch\] bool, got \(4,\) torch.int32"),
        (flush, torch.zeros(4, dtype=torch.int64, device=DEVICE),
         r"row_order: expected \[4\] int32, got \(4,\) torch.int64"),
        (flush, torch.zeros(5, dtype=torch.int32, device=DEVICE),
         r"row_order: expected \[4\] int32, got \(5,\) torch.int32"),
    ):
        with pytest.raises(ValueError, match=msg):
            OPS[op](fl, order)


def test_gdn_decode_checks_row_order():
    """The decode's public function checks a given order's shape and dtype (not its contents)."""
    from test_gdn_decode import Case, Sim

    from replayssm_kernels.gdn_decode import gdn_replay_decode

    sim = Sim(Case(HV=2, Hk=1, K=16, V=16, L=4, R=4, requests=2, pad_rows=0), seed=1)
    inp = sim.make_inputs()
    B = inp["slot_idx"].shape[0]
    z = torch.zeros(B, dtype=torch.int32, device=DEVICE)
    out = torch.empty(B, 2, 16, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=rf"row_order: expected \[{B}\] int32"):
        gdn_replay_decode(*sim.tensors(), inp["q"], inp["k"], inp["v"], inp["a"], inp["b"],
                          sim.A_log, sim.dt_bias, out, inp["slot_idx"], z, z,
                          torch.zeros(B, dtype=torch.bool, device=DEVICE), scale=0.25,
                          row_order=torch.zeros(B + 1, dtype=torch.int32, device=DEVICE))
