"""``bench_verify --read-dtype`` (split precision in the verify benchmark): the verify byte model
with a read copy against a hand computation, the argument checks, the refcheck's copy gates (a
kernel that writes the copy of a slot that did not flush, or forgets to refresh it, is refused),
and the CLI on CPU (our GDN verify under the Triton interpreter with an fp8 copy)."""

from __future__ import annotations

import json

import pytest
from test_bench_cli import _require, _run_cli

from benchmarks import bench_verify as bv
from benchmarks import bytes_model as bm
from benchmarks.bytes_read_copy import ReadCopyVerifyBytes, read_copy_bytes, verify_read_copy_bytes
from benchmarks.shapes import GDN_TINY, QWEN35_4B
from benchmarks.verify_cases import ring_pool


def test_gdn_verify_read_copy_bytes_by_hand():
    """Qwen3.5-4B, T = 4, fp32 checkpoint, bf16 activations, u fp32, fp8 copy."""
    S, S_r = 2_097_152, 540_672  # checkpoint; fp8 copy + HV·V fp32 scales
    I = bm.gdn_sizes(QWEN35_4B).I  # noqa: E741 (math.md's symbol)
    rd_nf, rd_f, wr = 16_384 + 4_096 + 128, 4_096 + 8_192 + 128 + 128, 28_928
    m = verify_read_copy_bytes(bm.gdn_replay_verify_bytes(QWEN35_4B, 4, 4, 2, 4), S_r, "fp8")
    assert isinstance(m, ReadCopyVerifyBytes) and m.S == S and m.T == 4
    p = m.step(6)  # non-flush: the copy, 6 history records (u, k, g), 4 window records appended
    assert (p.state_read, p.state_write, p.ring_read, p.ring_write, p.io) == (
        S_r, 0, 6 * rd_nf, 4 * wr, 4 * I)
    p = m.step(14, flush=True)  # flush: checkpoint read + written, the copy written, then read
    assert (p.state_read, p.state_write, p.ring_read, p.ring_write, p.io) == (  # by the window launch
        S + S_r, S + S_r, 14 * rd_f, 4 * wr, 4 * I)
    assert m.batch_bytes([(6, False), (14, True)]) == m.step(6).total + m.step(14, True).total


def _cfg(tmp_path, family: str, rd: str, *extra: str) -> bv.Config:
    return bv.parse_args(["--device", "cpu", "--family", family, "--T", "4", "--batch", "2",
                          "--read-dtype", rd, "--skip-peers", "--out", str(tmp_path), *extra])


def test_byte_model_follows_read_dtype(tmp_path):
    """``ours`` gets the copy's model, SGLang's peers keep theirs (they read the checkpoint)."""
    same = bv.byte_models(_cfg(tmp_path, "gdn", "same"), "gdn", 4)
    bf16 = bv.byte_models(_cfg(tmp_path, "gdn", "bf16"), "gdn", 4)
    assert not isinstance(same["ours"], ReadCopyVerifyBytes)
    assert bf16["ours"].S_read == read_copy_bytes(GDN_TINY, "bf16")
    assert bf16["snapshot"] == same["snapshot"] and bf16["decode"] == same["decode"]
    m2 = bv.byte_models(_cfg(tmp_path, "mamba2", "fp8"), "mamba2", 4)["ours"]
    assert m2.step(3).state_read == m2.S_read < m2.S


def test_read_dtype_same_as_state_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _cfg(tmp_path, "gdn", "bf16", "--state-dtype", "bf16")
    assert "must differ from --state-dtype" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
@pytest.mark.parametrize("rd", ["bf16", "fp8"])
def test_refcheck_gates_the_read_copy(tmp_path, family, rd):
    """Our torch reference against itself passes, with the copies compared; a 'kernel' that
    writes the copy of a slot that did not flush, or does not refresh it on a flush, is refused.
    The timed pool hands the copy to the kernel."""
    _, refs, _ = bv.load_ours(_cfg(tmp_path, family, rd))
    ref = refs[family]
    fam = (bv.GDNVerify if family == "gdn" else bv.Mamba2Verify)(_cfg(tmp_path, family, rd),
                                                                 {}, {})
    assert fam.read.shape == fam.state.shape and (fam.read_scale is not None) == (rd == "fp8")
    pool = ring_pool(fam, 4)
    assert pool["read_state"] is fam.read

    rc = bv.refcheck(fam, ref, ref, 4)
    assert rc["ok"], rc
    assert rc["errors"]["read_state"] == 0.0 and rc["read_copy_bits"] is True

    def scribble(*a, **kw):  # slot 0 (never used) gets its copy written
        ref(*a, **kw)
        kw["read_state"][0] = kw["read_state"][1]

    rc = bv.refcheck(fam, scribble, ref, 4)
    assert "read_state: the copy of a slot that did not flush was written" in rc["problems"]

    def stale(*a, **kw):  # the flush does not refresh the copy
        old = kw["read_state"].clone()
        ref(*a, **kw)
        kw["read_state"].copy_(old)

    rc = bv.refcheck(fam, stale, ref, 4)
    assert not rc["ok"] and rc["read_copy_bits"] is False
    assert any(p.startswith("read_state: rel err") for p in rc["problems"]), rc["problems"]


def test_cpu_cli_gdn_verify_read_copy(tmp_path):
    """Our GDN verify with an fp8 copy under the Triton interpreter: refcheck PASS against our
    reference with the same copy (the refreshed copy bit-identical to ``quantize_rows`` of the
    stored checkpoint), our rows' bytes from the copy's model."""
    _require("gdn_replay_verify", "gdn_replay_verify_ref")
    r = _run_cli(["--device", "cpu", "--family", "gdn", "--read-dtype", "fp8", "--T", "2",
                  "--batch", "1", "--window", "2", "--repeats", "1", "--warmup", "0",
                  "--passes", "1", "--refcheck", "--skip-peers", "--flush-rule", "early",
                  "--out", str(tmp_path)],
                 extra_env={"TRITON_INTERPRET": "1"}, module="benchmarks.bench_verify")
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    rc = res["refcheck"]["gdn/T2"]
    assert rc["ok"] and rc["read_copy_bits"] is True, rc
    assert set(rc["errors"]) >= {"out", "state", "read_state", "ring_u"}
    assert res["meta"]["read_dtype"] == "fp8"
    assert "read copy fp8 (ours)" in (tmp_path / "results.md").read_text()
    model = verify_read_copy_bytes(bm.gdn_replay_verify_bytes(GDN_TINY, 2, 4, 2, 4),
                                   read_copy_bytes(GDN_TINY, "fp8"), "fp8")
    mixed = next(x for x in res["rows"] if x["kernel"] == "ours" and x["mode"] == "mixed")
    cycle = bm.verify_cycle(2, 2, 1)
    assert mixed["bytes"] > 0 and cycle == [(1, True)]
    step = next(x for x in res["rows"] if x["kernel"] == "ours" and x["mode"] == "cycle")
    assert step["bytes"] == model.step(1, True).total  # batch 1, every step flushes (early, L = 2)
