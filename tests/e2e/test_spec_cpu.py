"""End to end on CPU: speculative decoding with ``--ssm-backend replay`` is refused at startup, with what
to change (``spec_plan.startup_refusals``; ~10 s per server, refused before any model loads).

No SGLang 0.5.17 speculative algorithm runs on a CPU (``benchmarks/notes/spec_algorithms.md``), so the
CPU evidence for spec + replay is below the server: ``tests/integration/test_spec_verify.py`` (verify ==
decode for full, partial and near-zero acceptance over > 3 ring cycles, both families).  The GPU server
test is ``test_spec_gpu.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402
import server as srv  # noqa: E402

pytestmark = pytest.mark.e2e


def _spec_args(draft: Path, topk: int) -> list[str]:
    return ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft),
            "--speculative-draft-load-format", "dummy", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", "4"]


def _refused(model: Path, args: list[str], log: Path) -> str:
    proc = srv.launch(model, args, log, port=srv.free_port())
    try:
        rc = proc.wait(timeout=180)
    finally:
        srv.stop(proc)
    text = log.read_text()
    assert rc != 0, text[-3000:]
    return text


def test_spec_on_cpu_and_forced_replay_on_trees_refused(tmp_path: Path):
    root = tmp_path / "models"
    model = make_model.materialize("nemotron_h_tiny", root / "nemotron_h_tiny")
    draft = make_model.materialize("llama_tiny", root / "llama_tiny")
    text = _refused(model, ["--ssm-backend", "replay", *_spec_args(draft, 1)], tmp_path / "linear.log")
    assert "--ssm-backend replay refused: speculative decoding on --device cpu" in text
    text = _refused(model, ["--ssm-backend", "replay", "--replayssm-verify", "replay", *_spec_args(draft, 2)],
                    tmp_path / "tree.log")
    assert "--replayssm-verify replay cannot serve tree drafts (--speculative-eagle-topk 2 > 1)" in text
