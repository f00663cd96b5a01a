"""``bench_decode --read-dtype`` for Gated DeltaNet (split precision): the byte model of
``benchmarks/bytes_read_copy.py`` against a hand computation, the arguments, the refcheck's copy
checks (a kernel that writes or forgets the copy is refused), and the CLI on CPU (our GDN kernel
under the Triton interpreter with a bf16 / fp8 copy: refcheck PASS, results written)."""

from __future__ import annotations

import json

import pytest
from test_bench_cli import _require, _run_cli

from benchmarks import bench_decode as bd
from benchmarks import bytes_model as bm
from benchmarks.bytes_read_copy import (
    ReadCopyKernelBytes,
    gdn_read_copy_bytes,
    read_copy_bytes,
)
from benchmarks.shapes import GDN_TINY, QWEN35_4B

# ---------------------------------------------------------------------------------- byte model


def test_gdn_read_copy_bytes_by_hand():
    """Qwen3.5-4B (HV 32, Hk 16, K = V = 128), L = 16, fp32 checkpoint, bf16 activations."""
    # copy per slot: HV·V·K values (+ HV·V fp32 scales, one per value row, for fp8)
    assert read_copy_bytes(QWEN35_4B, "bf16") == 32 * 128 * 128 * 2 == 1_048_576
    assert read_copy_bytes(QWEN35_4B, "fp16") == 1_048_576
    assert read_copy_bytes(QWEN35_4B, "fp8") == 32 * 128 * 128 + 4 * 32 * 128 == 540_672
    S, S_r, I = 2_097_152, 540_672, 24_704  # noqa: E741 (I: q,k,v,out bf16 + a,b bf16)
    # records with u fp32 (the server's layout, the benchmark's default): u 16,384, k 4,096,
    # v 8,192, g 128, beta 128
    rd_nf, rd_f, wr = 16_384 + 4_096 + 128, 4_096 + 8_192 + 128 + 128, 28_928
    m = gdn_read_copy_bytes(QWEN35_4B, 16, "fp8", 4, 2, u_bytes=4)
    assert isinstance(m, ReadCopyKernelBytes)
    for w in (0, 1, 7, 14):  # non-flush: the copy, w records (u, k, g), one record appended
        p = m.phase(w)
        assert (p.state_read, p.state_write, p.ring_read, p.ring_write, p.io) == (
            S_r, 0, w * rd_nf, wr, I)
        assert p.total == S_r + w * 20_608 + 28_928 + 24_704
    p = m.phase(15)  # flush: checkpoint read + write, the copy written, (k, v, g, beta) replayed
    assert (p.state_read, p.state_write, p.ring_read, p.ring_write, p.io) == (
        S, S + S_r, 15 * rd_f, 0, I)
    assert p.total == 4_947_840
    assert m.phase(3, flush=True).total == 2 * S + S_r + 3 * rd_f + I  # a forced flush
    # cycle: (15·594,304 + 20,608·105 + 4,947,840) / 16
    assert m.cycle_mean() == 16_026_240 / 16 == 1_001_640
    assert m.batch_bytes([0, 15]) == S_r + wr + I + 4_947_840


def test_gdn_read_copy_bytes_match_math_md():
    """math.md §9: S_lo + σ + 2·S_hi/L + ring + I (Qwen3.5-4B, L=16, fp8 reads) = 932,280 B with
    an fp32 anchor, 801,208 B with fp16; ours (u in bf16, as math.md) differs only by the ring's
    v, beta fields, as without a copy."""
    extra = bm.gdn_replay_bytes(QWEN35_4B, 16, 4, 2).cycle_mean() - 2_357_688  # v, beta: 7,920 B
    assert extra == 7_920
    assert gdn_read_copy_bytes(QWEN35_4B, 16, "fp8", 4, 2).cycle_mean() == 932_280 + extra
    assert gdn_read_copy_bytes(QWEN35_4B, 16, "fp8", 2, 2).cycle_mean() == 801_208 + extra
    # against the no-copy model: per cycle, (L-1) checkpoint reads become copy reads, one copy write
    for rd in ("bf16", "fp16", "fp8"):
        for L in (1, 4, 16):
            base = bm.gdn_replay_bytes(QWEN35_4B, L, 4, 2, u_bytes=4)
            m = gdn_read_copy_bytes(QWEN35_4B, L, rd, 4, 2, u_bytes=4)
            S_r = read_copy_bytes(QWEN35_4B, rd)
            want = base.cycle_mean() + ((L - 1) * (S_r - base.S) + S_r) / L
            assert m.cycle_mean() == pytest.approx(want, rel=1e-12)


# ----------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("family", ["gdn", "all"])
@pytest.mark.parametrize("rd", ["bf16", "fp16", "fp8"])
def test_cli_read_dtype_gdn_byte_models(tmp_path, family, rd):
    cfg = bd.parse_args(["--family", family, "--read-dtype", rd, "--dry-run", "--out",
                         str(tmp_path)])
    assert cfg.read_dtype == rd
    g = bd.byte_models(cfg, "gdn")
    assert g["ours"] == gdn_read_copy_bytes(QWEN35_4B, 16, rd, 4, 2, u_bytes=4)
    # SGLang's peers have no copy: their models do not change
    plain = bd.byte_models(bd.parse_args(["--family", family, "--dry-run", "--out",
                                          str(tmp_path)]), "gdn")
    assert (g["packed"], g["builtin"]) == (plain["packed"], plain["builtin"])
    if family == "all":
        assert isinstance(bd.byte_models(cfg, "mamba2")["ours"], ReadCopyKernelBytes)


def test_cli_read_dtype_gdn_dry_run(tmp_path):
    rc = bd.main(["--dry-run", "--family", "all", "--read-dtype", "fp8", "--batch", "256",
                  "--out", str(tmp_path), "--commit", "c0ffee"])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["read_dtype"] == "fp8"
    names = {m["kernel"] for ms in res["byte_models"].values() for m in ms}
    assert {"replayssm gdn (read copy fp8)", "replayssm mamba2 (read copy fp8)"} <= names
    assert "read copy fp8" in (tmp_path / "results.md").read_text()


def test_cli_read_dtype_same_as_state_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bd.parse_args(["--family", "gdn", "--state-dtype", "bf16", "--read-dtype", "bf16",
                       "--dry-run", "--out", str(tmp_path)])
    assert "must differ from --state-dtype" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ refcheck


def _family(tmp_path, family: str, rd: str):
    cfg = bd.parse_args(["--device", "cpu", "--family", family, "--read-dtype", rd, "--window",
                         "4", "--out", str(tmp_path)])
    return (bd.GDNFamily if family == "gdn" else bd.Mamba2Family)(cfg, {}, {})


def _ref(family: str):
    if family == "gdn":
        from replayssm_kernels.gdn_decode import gdn_replay_decode_ref

        return gdn_replay_decode_ref
    from replayssm_kernels.mamba2_decode import mamba2_replay_decode_ref

    return mamba2_replay_decode_ref


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
@pytest.mark.parametrize("rd", ["bf16", "fp8"])
def test_refcheck_gates_the_read_copy(tmp_path, family, rd):
    """The reference against itself passes; a 'kernel' that writes the copy (or fp8 scales) of a
    slot that did not flush, or does not refresh the copy on a flush, is refused."""
    ref = _ref(family)
    fam = _family(tmp_path, family, rd)
    args, _, _ = fam.refcheck_args()
    assert args["read_state"].shape == args["state"].shape
    assert ("read_scale" in args) == (rd == "fp8")
    if family == "gdn":
        assert fam.bytes_per_slot() == bd.GDNFamily(
            bd.parse_args(["--device", "cpu", "--family", "gdn", "--window", "4", "--out",
                           str(tmp_path)]), {}, {}).bytes_per_slot() + read_copy_bytes(GDN_TINY, rd)

    rc = bd.refcheck_family(fam, ref, ref)
    assert rc["ok"], rc
    assert rc["errors"]["read_state"] == 0.0 and rc["read_copy_bits"] is True

    def scribble(*a, **kw):  # slot 0 (never used) gets its copy written
        ref(*a, **kw)
        kw["read_state"][0] = kw["read_state"][1]
        if kw["read_scale"] is not None:
            kw["read_scale"][0] = 1.0

    rc = bd.refcheck_family(fam, scribble, ref)
    assert not rc["ok"]
    assert "read_state: the copy of a slot that did not flush was written" in rc["problems"]
    if rd == "fp8":
        assert "read_scale: the copy of a slot that did not flush was written" in rc["problems"]

    def stale(*a, **kw):  # the flush does not refresh the copy
        old = kw["read_state"].clone()
        ref(*a, **kw)
        kw["read_state"].copy_(old)

    rc = bd.refcheck_family(fam, stale, ref)
    assert not rc["ok"] and rc["read_copy_bits"] is False
    assert any(p.startswith("read_state: rel err") for p in rc["problems"]), rc["problems"]


# ------------------------------------------------------------------------------ CLI on the CPU


@pytest.mark.parametrize("rd, peers", [("bf16", False), ("fp8", True)], ids=["bf16", "fp8-peers"])
def test_cpu_cli_gdn_read_copy_interpreter(tmp_path, rd, peers):
    """Our GDN kernel with a read copy under the Triton interpreter: refcheck PASS against our
    reference with the same copy, the refreshed copy bit-identical to ``quantize_rows`` of the
    stored checkpoint, results written. With SGLang's peers (fp8): they are timed as before and
    the all-flush crosscheck still matches the packed decode bitwise (a flush never reads the
    copy)."""
    _require("gdn_replay_decode", "gdn_replay_decode_ref")
    if peers:
        pytest.importorskip("sglang")
    args = ["--device", "cpu", "--family", "gdn", "--read-dtype", rd, "--batch", "2",
            "--window", "2", "--repeats", "1", "--warmup", "0", "--passes", "1", "--refcheck",
            "--out", str(tmp_path)]
    r = _run_cli(args + ([] if peers else ["--skip-peers"]), extra_env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refcheck gdn: PASS" in r.stdout and "read_state" in r.stdout
    res = json.loads((tmp_path / "results.json").read_text())
    rc = res["refcheck"]["gdn"]
    assert rc["ok"], rc
    assert rc["read_copy_bits"] is True
    assert set(rc["errors"]) >= {"out", "state", "read_state", "ring_u"}
    assert res["meta"]["read_dtype"] == rd
    # pool per slot (HV 4, Hk 2, K = V = 32, R 2): state 16,384 + u 1,024 + k 256 + v 512 + g, beta
    # 32 each = 18,240 B, plus the copy (bf16 8,192; fp8 4,096 + 512 of scales)
    assert res["meta"]["gdn_pool_bytes_per_slot"] == 18_240 + read_copy_bytes(GDN_TINY, rd)
    ours = [x for x in res["rows"] if x["kernel"] == "ours"]
    assert {x["mode"] for x in ours} == {"cycle", "mixed"}
    m = gdn_read_copy_bytes(GDN_TINY, 2, rd, 4, 2, u_bytes=4)
    cyc = next(x for x in ours if x["mode"] == "cycle")
    assert cyc["bytes"] == 2 * m.cycle_mean() and cyc["median_us"] > 0
    assert cyc["phase_bytes"] == [2 * p.total for p in m.phases()]
    assert (tmp_path / "results.md").exists() and (tmp_path / "decode_bench.png").exists()
    if peers:
        assert {x["kernel"] for x in res["rows"]} == {"ours", "packed", "builtin"}, res["status"]
        xc = rc["vs_sglang_conventional"]
        assert xc["ok"] and xc["out_bitwise"] and xc["state_bitwise"], xc
