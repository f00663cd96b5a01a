"""End to end on a CUDA GPU (run by the lead on the H200): split precision (``--replayssm-read-dtype``).

For each tiny model (Nemotron-H: Mamba-2; Qwen3-Next: GDN), bf16 model with SGLang's default fp32
checkpoint, ``--ssm-backend replay`` at L=16 runs the workload of ``test_serve_gpu.py`` (concurrent and
one at a time, a radix hit, prompts across the ``extra_buffer`` track interval) with no copy
(``same``), with a bf16 copy under CUDA graphs and eagerly, and with an fp8 copy under CUDA graphs.
Checks: each copy server logs its copy; one request at a time, the bf16 copy gives the same tokens
with and without CUDA graphs; every copy run stays close to ``same`` (greedy paths part late, if at
all; logprobs on the common prefix within ``test_serve_gpu.LOGPROB_TOL`` for bf16, ``FP8_TOL`` for fp8:
on CPU the fp8 copy of the random tiny Qwen3-Next moved logprobs by up to 0.26, ``test_read_copy_cpu.py``).
The divergence table is printed (``-s``).  All eight servers start at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402
import server as srv  # noqa: E402
import test_serve_gpu as serve  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

FP8_TOL = 0.5
BASE = ["--ssm-backend", "replay", "--replayssm-window", "16"]
RUNS = {
    "same": BASE,
    "bf16_graph": [*BASE, "--replayssm-read-dtype", "bf16"],
    "bf16_eager": [*BASE, "--replayssm-read-dtype", "bf16", "--disable-cuda-graph"],
    "fp8_graph": [*BASE, "--replayssm-read-dtype", "fp8"],
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("read_copy_gpu")
    procs = {}
    with contextlib.ExitStack() as stack:
        for model_name in serve.MODELS:
            config = json.loads((serve.MODEL_DIR / model_name / "config.json").read_text())
            config.update(serve.CONFIG_OVERRIDES.get(model_name, {}))
            model = make_model.materialize(model_name, root / "models" / model_name, config=config)
            for run, args in RUNS.items():
                port = srv.free_port()
                log = root / f"{model_name}-{run}.log"
                proc = srv.launch(model, args, log, port=port, base_flags=serve.GPU_FLAGS, env=serve.ENV)
                stack.callback(srv.stop, proc)
                procs[model_name, run] = (proc, port, log)
        for proc, port, log in procs.values():
            srv.wait_ready(proc, port, log, timeout=900)
        out = {}
        with cf.ThreadPoolExecutor(len(procs)) as ex:
            for mode, concurrent in (("seq", False), ("conc", True)):
                futures = {(*key, mode): ex.submit(serve._workload, f"http://127.0.0.1:{port}", concurrent)
                           for key, (_, port, _) in procs.items()}
                out.update({key: f.result() for key, f in futures.items()})
    logs = {key: log.read_text() for key, (_, _, log) in procs.items()}
    return out, logs


@pytest.mark.parametrize("model_name", list(serve.MODELS))
def test_read_copy_stays_close_to_the_checkpoint_read(model_name: str, results):
    out, logs = results
    for run in RUNS:
        allocated = "ReplaySSM read copy is allocated" in logs[model_name, run]
        assert allocated == (run != "same"), f"{model_name} {run}: read copy allocated={allocated}"
    assert "torch.float8_e4m3fn" in logs[model_name, "fp8_graph"]
    assert [t for t, _ in out[model_name, "bf16_graph", "seq"]] == [t for t, _ in out[model_name, "bf16_eager", "seq"]]
    for mode in ("seq", "conc"):
        for run in ("bf16_graph", "bf16_eager", "fp8_graph"):
            rows = serve._compare(out[model_name, run, mode], out[model_name, "same", mode])
            firsts = [first for first, _ in rows if first is not None]
            print(f"TABLE {model_name} {mode} {run} vs same: {len(rows) - len(firsts)}/{len(rows)} token-identical, "
                  f"first divergences {firsts}, max |logprob diff| on common prefixes {max(d for _, d in rows):.3g}")
            tol = FP8_TOL if run.startswith("fp8") else serve.LOGPROB_TOL
            for i, (first, diff) in enumerate(rows):
                assert first is None or first >= serve.MIN_COMMON, f"{model_name} {mode} {run} request {i}: {first}"
                assert diff < tol, f"{model_name} {mode} {run} request {i}: logprob diff {diff}"
