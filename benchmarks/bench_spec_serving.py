"""Speculative serving on two GPUs (or one): stock spec vs replay spec vs stock without spec (issue 6).

One command, bounded in time end to end (``--time-budget``), for one device call on
``nvidia-h200-x2``:

1. the shape-faithful target (``bench_serving_ab``'s model step: ``tests/models/make_model.py``
   preset, bf16 shards under ``--model-dir``) and the draft: ``tests/models/llama_tiny`` with the
   target's vocabulary and context, attention heads of 64 (FlashInfer has no head_dim 16 kernels),
   config and tokenizer only: the servers load it with ``--speculative-draft-load-format dummy``;
2. three servers, all with ``--disable-overlap-schedule`` and CUDA graphs at the same sparse bucket
   list (powers of two up to the largest concurrency, plus every concurrency):

   - ``stock_spec`` (``--ssm-backend default``) alone on the first GPU, and ``replay_spec``
     (``--ssm-backend replay --replayssm-window L --replayssm-verify auto``) alone on the second,
     started at once; both STANDALONE with that draft, ``--speculative-num-steps T-1
     --speculative-eagle-topk 1 --speculative-num-draft-tokens T`` (T = 4, as
     ``tests/e2e/test_spec_gpu.py``), the same ``--mem-fraction-static`` and the radix cache on
     with ``--mamba-radix-cache-strategy no_buffer`` (the replay verify refuses ``extra_buffer``), so
     SGLang derives their running-request limit from memory (below); or, with ``--radix
     off-equal-memory``, the radix cache off and each its own ``--max-running-requests``, computed so
     that both hold the same mamba-state bytes (design decision 5);
   - ``stock_nospec`` (``--ssm-backend default``, no speculation) on the first GPU, started once
     ``stock_spec`` has sized its pools (its log's first ``Memory pool end``), with explicit pools:
     radix cache off (one mamba slot per request), ``--max-running-requests`` = the largest
     concurrency;

3. per server, once it answers ``/health_generate``, a warm-up of ``max(concurrency)`` requests
   (``bench_serving_ab``'s); no run starts before all three are ready (a server still capturing
   CUDA graphs on the first GPU would slow ``stock_spec``'s runs and not ``replay_spec``'s); one
   that fails, or that is not ready while ``NOSPEC_READY_RESERVE_S`` of the budget is left
   (``stock_nospec``), is stopped and the others go on;
4. per concurrency, in the order given (the table is sorted): ``python -m sglang.bench_serving
   --dataset-name random-ids`` against both spec servers **at the same time** (different GPUs; both
   clients share the host, symmetrically); then ``stock_nospec`` alone at every concurrency, c = 1
   first (the c = 1 target needs it).  A run that the time budget cannot fit is skipped, so give the
   concurrencies by importance (default 256, 512, 1, 64).  A bench_serving whose result is out (its
   ``--output-file`` line, or its printed result block) but that has not exited ``ab.BENCH_EXIT_GRACE_S``
   later is killed and its result taken, with a warning (``run_bench_serving``; on the H200 a
   ``stock_nospec`` c = 256 run printed its whole result and then did not exit within the limit);
5. writes ``results.md``, ``results.json``, ``bench_raw.jsonl``, ``bench_stdout.log``, ``gen.log``
   and ``server_<variant>.log`` x 3 under ``--out`` (8 files, one folder), and prints the report.
   With ``--profile-steps N``, each spec server's run profiles N forwards from ``--profile-delay``
   seconds into it (SGLang's ``/start_profile``); the report gets their GPU time by kernel class
   (``step_profile.py``), the traces stay in the work folder.

Every server's process group is killed in every case (normal end, error, timeout, SIGTERM).

Design decisions
----------------
**(1) Max running requests at equal memory.**  SGLang 0.5.17 budgets each server from the GPU
memory free when *that* server profiles (``KVCacheConfigurator._profile_available_bytes``: free
after its weights minus ``(1 - --mem-fraction-static)`` x free before them), so two servers on one
GPU do not get equal budgets: whichever allocates first shrinks the other's.  Hence one spec
server per GPU, each alone until its pools are sized; ``stock_nospec`` joins the first GPU only
after ``stock_spec``'s ``Memory pool end`` (the draft worker reuses the target's pool config and
budgets nothing).  The figure is SGLang's own derivation, not ours: with speculation SGLang always
sets ``--max-running-requests`` (48 if unset) and, with the radix cache off, takes the mamba pool
size from it instead of from memory (``_handle_max_mamba_cache``), so the spec servers run with the
radix cache on (``no_buffer``) and ask for ``SPEC_MAX_RUNNING_REQUESTS`` (4096, SGLang's own upper
estimate): the mamba budget ``rest x r/(1+r)`` (``--mamba-full-memory-ratio`` r = 0.9) solves the
mamba slots ``K`` (stock spec jointly with ``intermediate_ssm``, ``T`` per-draft states per running
request), and ``max_running_requests = K // 3`` (3 slots per request with the radix cache on); the
plug-in re-solves ``K`` with the ring bytes (``hooks/pool.py``).  Parsed from each log: the
scheduler's ``max_running_requests=``, the capping warning, ``Mamba Cache is allocated`` (slots,
state, per-draft GB), the plug-in's ``ReplaySSM memory`` / speculative-state / rings lines, and the free
memory before the weights and after the pools (the check that both budgets started equal).
Arithmetic (Nano-4B: 21 Mamba-2 layers of 96 x 80 x 128, fp32 state; per slot ``p`` = 78.75 MiB
state + 1.2 MiB conv; ring ``r`` ~ 7.1 MiB at L = 16, T = 4): stock spec fits ``B / (7p)`` running
requests in a mamba budget ``B`` (``K (1 + T/3) p = B``), replay without a per-draft buffer
``B / (3 (p + r))``, at most 2.14x; at one slot per request (radix off) it would be
``(1 + T) p / (p + r)`` = 4.6x (4.44x with SGLang's per-draft conv windows, which both servers
keep: ``--radix off-equal-memory``, design decision 5).  What the current plug-in reaches is what
the run reports (see ``benchmarks/README.md``).  Default ``--mem-fraction-static`` 0.6 for the spec servers: ~36 GiB of
mamba budget each (stock spec ~60 running requests) and ~56 GiB resident on the first GPU, leaving
room for ``stock_nospec`` (0.75 of what is free when it starts: ~40 GiB of state for 512 slots +
~6 GiB of KV + weights ~7.4 GiB).  A separate memory-only launch per variant would cost ~1 min of
start-up each before or after the ~5 min cold start of the measured servers: it does not fit in the
call; one GPU cannot give two servers equal budgets; so the measured spec servers are the memory
probes, and the throughput at c = 256-512 is measured **at equal memory** too.

**(2) Which variants run at which concurrencies.**  All three at every concurrency.  SGLang's
snapshot verify keeps ``T`` per-draft states per running request: 96 x 80 x 128 x 4 B x 21 layers x
T = 330 MB at T = 4 (0.31 GiB), so c = 256 needs 84.6 GB of them beside 21 GB of state and c = 512
169 GB: more than an H200 (explicitly sized, stock spec at c = 512 cannot start at all, and c = 256
needs the whole GPU).  Here the spec servers size themselves at equal memory and requests beyond
their limit queue in the server: the ``peak #running`` column (the largest ``#running-req`` of the
run's decode log lines) says how many each actually held, and ``steady decode tok/s (log)`` what
those lines read at that peak (runs of ``c`` prompts at concurrency ``c`` are one prefill burst and
one decode wave, so bench_serving's throughput weighs the burst and the ramps heavily).
``stock_nospec`` holds all 512.  The plug-in's pool keeps SGLang's per-draft buffer with ``auto`` (its
snapshot fallback may read it), so an explicitly sized replay spec at c = 512 would fail at start as
stock spec does; with
``--replayssm-verify replay`` it never allocates it (``pool.ReplayMambaPool._install_speculative_state``).
Memory-derived, neither can fail that way.  Time (estimated, not yet measured): install ~40 s,
models ~30 s, the spec servers ready ~4.5-5 min after launch and ``stock_nospec`` ~1-1.5 min after
them, then ~2-2.5 min of runs (output 128 tokens and ``max(32, c)`` prompts keep each run to
~5-20 s plus ~10 s of bench_serving start-up): ~9-9.5 min in all, so within ``--time-budget`` 530
(plus the install: under the call's 600 s) the last runs (c = 64) may be skipped.

**(3) Acceptance.**  The draft has random (dummy) weights: nearly every draft token is rejected, so
the accept length is ~1 (the bonus token).  Speculation cannot pay at that acceptance, so both spec
servers are expected to be slower than ``stock_nospec``, and the c = 1 target (replay spec >= 0.98x
the better of stock spec and stock without spec) is expected to be missed for that reason alone; the
report says so.  Two accept lengths per run: bench_serving's ``accept_length`` (the server's average
since it started: warm-up and earlier runs included) and this run's, from the decode log lines the
server wrote during the run (``accept len`` weighted by ``#running-req``); the latter decides
"equal acceptance length" (``|replay - stock| <= ACCEPT_TOL``).

The heuristic's choices: ``--replayssm-verify auto`` (default ``--replay-verify``) logs one
``ReplaySSM verify bs=.. T=..: <path> (...)`` line per CUDA-graph bucket (``heuristic.Decision
.log_line``), timed by the plug-in's probe; they are parsed into a table (buckets above the server's
``max_running_requests`` are never captured and are marked so).  The decisions cache is a file of
this run (``SGLANG_REPLAYSSM_VERIFY_CACHE``), so they are measured, not read back.  Memory: with
``auto`` the replay server keeps SGLang's per-draft reserve in its memory solve (its snapshot fallback
may read the buffer), so its running-request limit is stock spec's less the ring; only
``--replay-verify replay`` (linear drafts) solves without the reserve (``hooks/pool.py``) and shows the
memory gain.  The two questions need one run each.

**(4) Controlled acceptance: ``--draft oracle``.**  The target is the preset's *echo* variant
(``make_model.materialize(..., echo=True)``: the same shapes and bytes, residual branches scaled
down, the LM head the re-indexed embedding, so the greedy next token is ``echo_next(current)`` by a
logit margin > 15 that bf16 batch-composition noise cannot flip; the model directory gets
``_echo``), and the drafter is the test-only ``REPLAYSSM_ORACLE`` plug-in of ``tests/e2e/spec_oracle``
(NGRAM's draft-model-free flow; ``SGLANG_PLUGINS=replayssm,replayssm_spec_oracle``, the oracle file in
``REPLAYSSM_SPEC_ORACLE``).  Before the servers start, the oracle file is written from the exact
prompts bench_serving will send (``bench_prompts``: bench_serving's own ``get_dataset`` on the
namespace of the run's command line, after the same ``random`` / ``numpy`` seeding, then the
server's encoding of the text), one entry per distinct prompt of every concurrency's run, with the
reference = ``echo_continuation`` and the wrong rate ``--wrong-rate``: both spec servers get the same
drafts, so the same acceptance.  The expected accept length per run (``expected_accept_length`` of
its prompts; about ``(1 - (1 - r)^T) / r``) is reported beside the measured ones.  Once the spec
servers are up, ``REFERENCE_CHECK_PROMPTS`` more prompts of the oracle file (bench_serving's kind, another
seed: none of the runs' prompts enters a radix cache early) are generated greedily on every server and
compared with the references (differences are reported; the spec outputs are the target's greedy
tokens whatever the drafts).  The oracle raises on ``return_logprob``, so the warm-up of this mode
asks for no logprobs.  No draft model: nothing of a draft in memory, and the spec servers' memory is
the target's pools only.

**(5) Radix cache off at equal memory: ``--radix off-equal-memory [--equal-mamba-gib B]``.**  With
the radix cache on, SGLang keeps ``mamba slots // 3`` running requests, which caps what dropping the
per-draft states can buy at ~2.1x (the runs so far: 140 vs 65).  With the radix cache off SGLang takes
the mamba pool from ``--max-running-requests M`` (``_handle_max_mamba_cache``'s second branch): every
per-request buffer gets ``M + 1`` rows, so equal memory is set by arithmetic per server
(``mamba_row_bytes``, from SGLang's own cache params of the model config and the plug-in's
``sizing.ring_spec`` / ``pool.read_copy_bytes_per_slot``): stock spec's row is state + conv ``p`` + ``T``
per-draft SSM states + the per-draft conv windows; replay spec's (``--replayssm-verify replay``) ``p`` +
the conv windows + the ring ``r`` (Nano-4B, T = 4, L = 16: 397.3 vs 89.4 MiB).  Each gets the most
requests whose rows fit in ``B`` GiB (default ``EQUAL_MAMBA_GIB`` = 24: 60 vs 273 requests, 4.55x by
arithmetic; ~4.44x for large ``B``), both at ``--spec-mem-fraction`` (which then only decides the KV
pool, capped by ``--max-total-tokens`` for both).  The CPU tests check the row bytes against SGLang's
``MambaPool`` and the plug-in's ``ReplayMambaPool`` built on the meta device.  The report shows the
arithmetic and each server's own pool lines (``Mamba Cache is allocated``, the plug-in's speculative
state and rings lines: ``equal_memory_check``), so the equal-memory claim is read from the logs, not
just computed.  Refused: ``--replay-verify auto`` / ``snapshot`` (the replay pool then keeps SGLang's
per-draft buffer for the snapshot fallback: its row would be stock spec's plus the ring, and the mode
would measure the ring's cost), flags in ``--server-args`` / ``--replay-args`` that change the
arithmetic (``EQUAL_MEMORY_FIXED_FLAGS``), a ``B`` below one stock spec request.  Start-up: no server
allocates more than its own planned rows, at most ``B`` (the replay pool never allocates SGLang's
per-draft SSM buffer with ``--replayssm-verify replay``, so the per-draft states are only in stock
spec's own allocation); before any server starts the run checks that the larger of the two planned
allocations + weights + 3 GiB fits the smaller free memory of the two spec GPUs (``nvidia-smi``) and
refuses with the largest ``B`` that fits.  (Before the replay pool stopped allocating that buffer, the
replay server briefly needed stock spec's row x its own ``M + 1``, 106 GiB at 24 GiB, which is why
the default ``B`` is 24 GiB and not the ~36 GiB stock spec budgets at 0.6 with the radix cache on;
larger ``B`` pass the check now.)  All three servers get FlashInfer's workspace raised to
``EQUAL_MEMORY_FLASHINFER_WORKSPACE`` (2 GiB): the 384 MiB default overflowed at the replay server's
273-request verify graph.
``stock_nospec`` is unchanged in this mode (radix off, the largest concurrency, its own memory
fraction): a throughput reference, not part of the memory comparison.

**(6) One GPU: ``--gpus G --radix off-equal-memory``.**  When only one GPU is lent, every server runs
on it: each starts once the previous one logged its pools, with ``--max-total-tokens`` for the requests
it can hold and a ``--mem-fraction-static`` computed from the free memory just before its launch so that
SGLang's budget covers its planned mamba rows and that KV (``spec_one_gpu.py``; refused before anything
starts when the three cannot fit: ``--skip-nospec`` or a smaller largest concurrency then).  The
equal-memory comparison is the mamba rows', as in (5); the runs take the GPU one server at a time, the
spec pair's order alternating with the concurrency, so no run shares the GPU's compute with another.

No CPU mode: STANDALONE has no CPU path in SGLang 0.5.17 (no ``torch_native`` draft attention
backend) and ``--ssm-backend replay`` refuses it on a CPU (``spec_plan.startup_refusals``,
``benchmarks/notes/spec_algorithms.md``).  CPU tests cover the arguments, the commands
(against SGLang's and the plug-in's parsers), the log parsers and the report, the equal-memory
arithmetic, bench_serving's slow exit (real child processes), and ``main()`` with fake servers.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import bench_serving_ab as ab
from benchmarks import spec_one_gpu as one_gpu
from benchmarks import step_profile
from benchmarks.bench_serving_ab import run_bench_serving  # noqa: E402  (shared bench_serving runner)

import make_model  # tests/models/make_model.py (bench_serving_ab put tests/models on sys.path)

__all__ = [
    "VARIANTS",
    "parse_args",
    "draft_config",
    "graph_buckets",
    "gpu_env_ids",
    "common_flags",
    "variant_flags",
    "parse_decode_log",
    "parse_memory_log",
    "parse_heuristic_log",
    "nospec_order",
    "build_report",
    "bench_prompts",
    "oracle_entries",
    "main",
]

#: order matters: ``stock_spec`` is the baseline of every ratio; the first two are the spec servers
VARIANTS = ("stock_spec", "replay_spec", "stock_nospec")
SPEC_VARIANTS = VARIANTS[:2]
#: ``--max-running-requests`` of the spec servers: SGLang's own upper estimate, so memory decides
SPEC_MAX_RUNNING_REQUESTS = 4096
#: issue 6's targets (the shape-faithful models): replay spec / stock spec output throughput at these
#: concurrencies, replay / stock spec max running requests, c = 1 against the better stock variant
THROUGHPUT_X_MIN = 1.8
THROUGHPUT_TARGET_CONCURRENCY = (256, 512)
MAX_RUNNING_X_MIN = 2.5
C1_X_MIN = 0.98
#: "equal acceptance length": |replay - stock| of the runs' accept lengths at most this
ACCEPT_TOL = 0.05
POOL_MARK = "Memory pool end"
MIN_RUN_S = 20.0
#: seconds kept for the runs after waiting for a server: the spec servers', stock without spec's
#: (enough for the spec runs; a stock without spec that is not ready by then is stopped)
SPEC_READY_RESERVE_S = 60.0
NOSPEC_READY_RESERVE_S = 150.0
BENCH_TIMEOUT_S = 300.0
#: --radix: "on" (no_buffer, SGLang derives the running-request limit from memory) or "off-equal-memory"
#: (radix cache off, --max-running-requests per spec server from equal mamba-state bytes)
RADIX_MODES = ("on", "off-equal-memory")
#: --radix off-equal-memory: default mamba-state bytes of each spec server (GiB); chosen when the replay
#: server's start-up transient (~4.4x this) had to fit an H200 too, kept so runs stay comparable
EQUAL_MAMBA_GIB = 24.0
#: --radix off-equal-memory: FlashInfer's workspace of every server, bytes (SGLang's
#: SGLANG_FLASHINFER_WORKSPACE_SIZE, unless set in the environment): on the H200 the replay server's verify
#: graph at 273 requests x 4 draft tokens overflowed SGLang's 384 MiB default at capture (``71f2159``)
EQUAL_MEMORY_FLASHINFER_WORKSPACE = 2 << 30
#: --radix off-equal-memory: GPU memory kept free beside a spec server's mamba allocation and the weights
#: (CUDA context, the draft, cuBLAS workspaces) when checking that its start-up fits
STARTUP_HEADROOM_GIB = 3.0
#: --radix off-equal-memory: flags of --server-args / --replay-args that would change what the arithmetic
#: assumes (running requests, radix, state dtype, draft length, TP), refused
EQUAL_MEMORY_FIXED_FLAGS = (
    "--max-running-requests", "--max-mamba-cache-size", "--disable-radix-cache", "--mamba-radix-cache-strategy",
    "--mamba-ssm-dtype", "--dtype", "--speculative-algorithm", "--speculative-num-draft-tokens",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-adaptive", "--ssm-backend",
    "--replayssm-window", "--replayssm-verify", "--tp-size", "--tensor-parallel-size", "--tp", "--pp-size",
    "--pipeline-parallel-size", "--dp-size", "--data-parallel-size", "--dp", "--enable-dp-attention",
)
#: tolerance of the log check: the pool lines print GiB with 2 decimals (4 terms) or 3 (rings)
LOGGED_GIB_TOL = 0.03
#: --draft oracle: the test-only drafter plug-in (``tests/e2e/spec_oracle``) and its algorithm name
ORACLE_DIR = ab.ROOT / "tests" / "e2e" / "spec_oracle"
ORACLE_ALGORITHM = "REPLAYSSM_ORACLE"
ORACLE_ENV = "REPLAYSSM_SPEC_ORACLE"
#: prompts of the oracle file generated on every server once it is up (the reference check)
REFERENCE_CHECK_PROMPTS = 8


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and complete the command line (defaults that depend on other options are filled in)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_spec_serving",
        description="Speculative serving on two GPUs: stock spec vs replay spec vs stock without spec.",
    )
    p.add_argument("--family", choices=tuple(ab.FAMILY_MODELS), default="mamba2",
                   help="mamba2: nemotron_h_nano4b; gdn: qwen3_next_4b")
    p.add_argument("--model", default=None, help="preset of tests/models/make_model.py (default: the family's)")
    p.add_argument("--model-dir", default=None,
                   help="where the target is written (default /tmp/replayssm_bench_models/<model>); reused if complete")
    p.add_argument("--gpus", default="0,1",
                   help="two GPU indices (of CUDA_VISIBLE_DEVICES when set): stock spec and stock without "
                        "spec on the first, replay spec on the second; or one index with --radix "
                        "off-equal-memory: every server on it, started and run one at a time")
    p.add_argument("--skip-nospec", action="store_true",
                   help="do not start stock without spec (its rows of the table stay empty)")
    p.add_argument("--replay-first", action="store_true",
                   help="one GPU: replay spec runs before stock spec at the first concurrency (the order "
                        "still alternates after it), so a call whose time budget ends after one run "
                        "measures replay spec (GDN on the H200: a 600 s call held the start-up, ~300 s, "
                        "and stock spec's c = 512 run, not replay spec's)")
    p.add_argument("--concurrency", type=ab._int_list, default=[256, 512, 1, 64],
                   help="comma list, run in this order (default 256,512,1,64: the targets first)")
    p.add_argument("--num-prompts", type=ab._int_list, default=None,
                   help="comma list, one per concurrency (default: max(32, c); at c = 1, 8 prompts of "
                        "~10 s runs gave 1.005x and 0.940x in two calls on the H200)")
    p.add_argument("--input-len", type=int, default=512, help="random-ids input length")
    p.add_argument("--output-len", type=int, default=128, help="random-ids output length")
    p.add_argument("--draft-tokens", type=int, default=4,
                   help="T = --speculative-num-draft-tokens (steps T-1, topk 1)")
    p.add_argument("--window", type=int, default=16, help="--replayssm-window of the replay server")
    p.add_argument("--replay-verify", choices=("auto", "replay", "snapshot"), default=None,
                   help="--replayssm-verify of the replay server (auto: the heuristic decides per bucket; default "
                        "auto, with --radix off-equal-memory replay, the only one allowed there)")
    p.add_argument("--radix", choices=RADIX_MODES, default="on",
                   help="on: the spec servers run the radix cache (no_buffer) and SGLang sizes them from "
                        "--spec-mem-fraction (3 mamba slots per request); off-equal-memory: radix cache off, "
                        "--max-running-requests per spec server so that both hold the same mamba-state bytes "
                        "(--equal-mamba-gib)")
    p.add_argument("--equal-mamba-gib", type=float, default=None,
                   help=f"--radix off-equal-memory: mamba-state bytes of each spec server in GiB (state + conv, "
                        f"per-draft buffers, rings; default {EQUAL_MAMBA_GIB:g})")
    p.add_argument("--spec-mem-fraction", type=float, default=0.6,
                   help="--mem-fraction-static of both spec servers (equal memory)")
    p.add_argument("--nospec-mem-fraction", type=float, default=0.75,
                   help="--mem-fraction-static of stock without spec (of what is free when it starts)")
    p.add_argument("--server-args", default="", help="extra flags for every server (one shell-quoted string)")
    p.add_argument("--replay-args", default="", help="extra flags for the replay server only")
    p.add_argument("--out", default="bench_spec_out", help="output folder (created)")
    p.add_argument("--commit", default=None, help="recorded in the outputs (default: git rev-parse --short HEAD)")
    p.add_argument("--time-budget", type=float, default=530.0,
                   help="seconds for the whole command; later runs are skipped when it runs out")
    p.add_argument("--seed", type=int, default=1, help="bench_serving --seed (same prompts for every server)")
    p.add_argument("--draft", choices=("standalone", "oracle"), default="standalone",
                   help="standalone: STANDALONE with a tiny Llama draft of dummy weights (accept length ~1); "
                        "oracle: the echo model and the REPLAYSSM_ORACLE drafter, acceptance set by --wrong-rate")
    p.add_argument("--wrong-rate", type=float, default=None,
                   help="--draft oracle: probability that a draft token is wrong (default 0.25: expected accept "
                        "length ~2.73 at T=4)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many forwards of each spec server's runs with SGLang's torch profiler "
                        "(/start_profile; benchmarks/step_profile.py) and report GPU time by kernel class "
                        "(default 0: off)")
    p.add_argument("--profile-delay", type=float, default=20.0,
                   help="seconds into a run at which --profile-steps starts (steady decode, past the first "
                        "prefill burst)")
    # read by bench_serving_ab's helpers (model generation, bench_serving command)
    p.set_defaults(dataset="random-ids", device="cuda")
    args = p.parse_args(argv)
    try:
        _complete(args)
    except ValueError as e:
        p.error(str(e))
    return args


def _complete(args: argparse.Namespace) -> None:
    """Fill the derived defaults in ``args``; ValueError (expected vs actual) on bad values."""
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    one = len(gpus) == 1 and args.radix == "off-equal-memory"
    if not (one or len(gpus) == 2 and len(set(gpus)) == 2) or not all(g.isdigit() for g in gpus):
        raise ValueError(f"--gpus: expected two different GPU indices (one per spec server, so each budgets "
                         f"from the same free memory), or one with --radix off-equal-memory (every server "
                         f"budgeted by arithmetic: spec_one_gpu.py), got {args.gpus!r}")
    args.gpus = [int(g) for g in gpus]
    args.one_gpu = one
    if len(set(args.concurrency)) != len(args.concurrency):
        raise ValueError(f"--concurrency: expected distinct values (the runs are reported per concurrency, so a "
                         f"repeat would replace the earlier run's row; for the other order run again with "
                         f"--replay-first), got {args.concurrency}")
    if args.num_prompts is None:
        args.num_prompts = [max(32, c) for c in args.concurrency]
    if len(args.num_prompts) != len(args.concurrency):
        raise ValueError(f"--num-prompts: expected {len(args.concurrency)} values (one per concurrency), "
                         f"got {len(args.num_prompts)}")
    for name in ("input_len", "output_len", "window"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if args.draft_tokens < 2:
        raise ValueError(f"--draft-tokens: expected an integer >= 2, got {args.draft_tokens}")
    for name in ("spec_mem_fraction", "nospec_mem_fraction"):
        if not 0 < getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a fraction in (0, 1), got {getattr(args, name)}")
    if args.time_budget <= 0:
        raise ValueError(f"--time-budget: expected seconds > 0, got {args.time_budget}")
    if args.profile_steps < 0 or args.profile_delay < 0:
        raise ValueError(f"--profile-steps / --profile-delay: expected >= 0, got {args.profile_steps} / "
                         f"{args.profile_delay}")
    if args.draft == "oracle":
        if args.wrong_rate is None:
            args.wrong_rate = 0.25
        if not 0 <= args.wrong_rate <= 1:
            raise ValueError(f"--wrong-rate: expected a probability in [0, 1], got {args.wrong_rate}")
    elif args.wrong_rate is not None:
        raise ValueError(f"--wrong-rate: expected only with --draft oracle, got --draft {args.draft}")
    if args.model is None:
        args.model = ab.FAMILY_MODELS[args.family]
    if args.radix == "on":
        if args.equal_mamba_gib is not None:
            raise ValueError("--equal-mamba-gib: expected only with --radix off-equal-memory, got --radix on")
        if args.replay_verify is None:
            args.replay_verify = "auto"
        args.equal_memory = None
    else:
        if args.replay_verify is None:
            args.replay_verify = "replay"
        if args.equal_mamba_gib is None:
            args.equal_mamba_gib = EQUAL_MAMBA_GIB
        if not args.equal_mamba_gib > 0:
            raise ValueError(f"--equal-mamba-gib: expected GiB > 0, got {args.equal_mamba_gib}")
        args.equal_memory = equal_memory_plan(args)
    if args.model_dir is None:
        suffix = "_echo" if args.draft == "oracle" else ""
        args.model_dir = f"/tmp/replayssm_bench_models/{args.model}{suffix}"
    if args.commit is None:
        args.commit = ab._git_commit()


def gpu_env_ids(gpus: Sequence[int], visible: str | None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` values for GPU indices given relative to the parent's visible list.

    Parameters
    ----------
    gpus : sequence of int
        ``--gpus``.
    visible : str or None
        The parent's ``CUDA_VISIBLE_DEVICES`` (None or empty: all devices, indices as given).
    """
    if not visible:
        return [str(g) for g in gpus]
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    bad = [g for g in gpus if g >= len(ids)]
    if bad:
        raise ValueError(f"--gpus: expected indices < {len(ids)} (CUDA_VISIBLE_DEVICES={visible!r}), got {bad}")
    return [ids[g] for g in gpus]


# ----------------------------------------------------------------------------- commands


def draft_config(target: dict, base: dict) -> dict:
    """The draft's config: ``base`` (``tests/models/llama_tiny``) with the target's vocabulary and context
    and attention heads of 64 (FlashInfer's smallest head_dim; the tiny Llama's own is 64 / 4 = 16)."""
    return base | {"vocab_size": int(target["vocab_size"]), "head_dim": 64,
                   "max_position_embeddings": int(target["max_position_embeddings"])}


def graph_buckets(concurrency: Sequence[int]) -> list[int]:
    """CUDA-graph batch sizes of every server: powers of two up to the largest concurrency, plus each
    concurrency (a short list keeps the cold start down; SGLang also adds a server's own request limit)."""
    top = max(concurrency)
    return sorted({1 << k for k in range(top.bit_length()) if 1 << k <= top} | set(concurrency))


def max_total_tokens(args: argparse.Namespace) -> int:
    """KV tokens of every server: ``spec_one_gpu.kv_tokens`` of the largest concurrency."""
    return one_gpu.kv_tokens(max(args.concurrency), args)


def common_flags(args: argparse.Namespace) -> list[str]:
    """Flags of every server (before ``variant_flags``)."""
    return [
        "--dtype", "bfloat16",
        # the device payload strips sgl_kernel's FA3 library; FlashInfer serves every server (and the draft)
        "--attention-backend", "flashinfer",
        "--load-format", "safetensors",
        # no_buffer (the spec servers' radix strategy) needs it; every server gets it, for a fair c=1
        "--disable-overlap-schedule",
        "--cuda-graph-bs-decode", *map(str, graph_buckets(args.concurrency)),
        "--max-total-tokens", str(max_total_tokens(args)),
        "--random-seed", "0", "--log-level", "info",
    ]


def _spec_flags(draft_dir: str | Path, num_tokens: int, draft: str = "standalone") -> list[str]:
    if draft == "oracle":  # the plug-in sets steps T-1 and topk 1 itself (as NGRAM)
        return ["--speculative-algorithm", ORACLE_ALGORITHM, "--speculative-num-draft-tokens", str(num_tokens)]
    return ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft_dir),
            "--speculative-draft-load-format", "dummy", "--speculative-num-steps", str(num_tokens - 1),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(num_tokens)]


def variant_flags(variant: str, args: argparse.Namespace, draft_dir: str | Path) -> list[str]:
    """One server's own flags (after ``common_flags``).

    Spec servers: the same memory fraction, radix cache on (``no_buffer``), running requests left to
    the memory; with ``--radix off-equal-memory`` radix cache off and ``--max-running-requests`` from
    ``equal_memory_plan``; ``stock_nospec``: explicit pools for the largest concurrency, radix cache off.
    ``--server-args`` come last (they override), then the replay server's ``--replay-args``.
    """
    extra = shlex.split(args.server_args)
    if variant == "stock_nospec":
        return ["--ssm-backend", "default", "--mem-fraction-static", str(args.nospec_mem_fraction),
                "--max-running-requests", str(max(args.concurrency)), "--disable-radix-cache", *extra]
    if variant not in SPEC_VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    if getattr(args, "radix", "on") == "on":
        running = ["--max-running-requests", str(SPEC_MAX_RUNNING_REQUESTS),
                   "--mamba-radix-cache-strategy", "no_buffer"]
    else:  # radix off: SGLang sizes the mamba pool (and the per-draft buffer) from --max-running-requests
        running = ["--max-running-requests", str(args.equal_memory[variant]["max_running"]), "--disable-radix-cache"]
    flags = ["--mem-fraction-static", str(args.spec_mem_fraction), *running,
             *_spec_flags(draft_dir, args.draft_tokens, args.draft)]
    if variant == "stock_spec":
        return ["--ssm-backend", "default", *flags, *extra]
    return ["--ssm-backend", "replay", "--replayssm-window", str(args.window),
            "--replayssm-verify", args.replay_verify, *flags, *extra, *shlex.split(args.replay_args)]


# ----------------------------------------------------------------------------- --radix off-equal-memory
def flashinfer_workspace() -> str:
    """``SGLANG_FLASHINFER_WORKSPACE_SIZE`` for every server with ``--radix off-equal-memory`` (bytes, a string).

    The environment's value if set, else ``EQUAL_MEMORY_FLASHINFER_WORKSPACE``: a few hundred running requests
    overflow SGLang's default at verify-graph capture.
    """
    return os.environ.get("SGLANG_FLASHINFER_WORKSPACE_SIZE") or str(EQUAL_MEMORY_FLASHINFER_WORKSPACE)



#: SGLang's config classes of the hybrids ReplaySSM serves, by family (as ``hooks/pool.replay_family``)
_CONFIG_FAMILY = {
    "NemotronHConfig": "mamba2", "NemotronHPuzzleConfig": "mamba2", "FalconH1Config": "mamba2",
    "GraniteMoeHybridConfig": "mamba2", "Qwen3NextConfig": "gdn", "Qwen3_5TextConfig": "gdn",
    "Qwen3_5MoeTextConfig": "gdn",
}


def _config_class(target_cfg: dict) -> type:
    """SGLang's own config class (``sglang.srt.configs``) for the config's ``model_type``; ValueError
    unless it is one of the hybrids ReplaySSM serves."""
    import sglang.srt.configs as configs

    mt = target_cfg.get("model_type")
    cls = next((c for name, c in vars(configs).items() if name in _CONFIG_FAMILY and isinstance(c, type)
                and getattr(c, "model_type", None) == mt), None)
    if cls is None:
        raise ValueError(f"--radix off-equal-memory: expected a model_type of {sorted(_CONFIG_FAMILY)} "
                         f"(SGLang's hybrid configs ReplaySSM serves), got {mt!r}")
    return cls


def kv_bytes_per_token(target_cfg: dict) -> int:
    """KV-cache bytes per token (bf16 K and V of every full-attention layer, one rank), from SGLang's
    config class (``full_attention_layer_ids``)."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_tp_size=1):
        cfg = _config_class(target_cfg)(**target_cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return len(cfg.full_attention_layer_ids) * 2 * int(cfg.num_key_value_heads) * int(head_dim) * 2


def _cache_params(target_cfg: dict, conv_dtype: str = "bfloat16"):
    """SGLang's ``mamba2_cache_params`` of a model config (one rank, no TP) and the model's family.

    The config class is SGLang's own for the ``model_type`` (``_config_class``); the state dtypes
    come from SGLang's ``mamba2_state_dtype`` with the servers' ``SGLANG_MAMBA_CONV_DTYPE`` (and whatever
    ``SGLANG_MAMBA_SSM_DTYPE`` the environment has: the servers inherit it).  CPU only, no server.
    """
    from sglang.srt.runtime_context import get_parallel

    cls = _config_class(target_cfg)
    saved = os.environ.get("SGLANG_MAMBA_CONV_DTYPE")
    os.environ["SGLANG_MAMBA_CONV_DTYPE"] = conv_dtype
    try:
        with get_parallel().override(attn_tp_size=1):
            params = cls(**target_cfg).mamba2_cache_params
    finally:
        if saved is None:
            os.environ.pop("SGLANG_MAMBA_CONV_DTYPE", None)
        else:
            os.environ["SGLANG_MAMBA_CONV_DTYPE"] = saved
    return params, _CONFIG_FAMILY[cls.__name__]


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def mamba_row_bytes(target_cfg: dict, *, draft_tokens: int, window: int, read_dtype: str = "same",
                    eagle_topk: int = 1, act_dtype: str = "bfloat16") -> dict:
    """Mamba-state bytes of one pool row (one running request) of each spec server, radix cache off.

    With the radix cache off and ``--max-running-requests M`` (SGLang 0.5.17, speculative decoding)
    every per-request buffer has ``M + 1`` rows (the pool's padding row included): the checkpoint and
    conv state (``mamba_cache_per_req``: ``p``), SGLang's per-draft SSM states ``intermediate_ssm``
    (``T`` checkpoints per row) and per-draft conv windows (``intermediate_conv_window``, the
    deduplicated ``[conv_dim, T + K - 2]`` layout for CUDA linear drafts), and, on the replay server,
    the rings and cursors (``sizing.ring_spec`` with ``R = max(L, T) + T`` rows, plus a read copy,
    ``pool.read_copy_bytes_per_slot``: what ``hooks/pool.ring_bytes_per_slot`` charges).  With
    ``--replayssm-verify replay`` the replay pool never allocates ``intermediate_ssm``
    (``pool.ReplayMambaPool._install_speculative_state``), so it holds no per-draft states, not even
    at start-up.

    Returns
    -------
    dict
        ``{"family", "layers", "state_conv", "per_draft_ssm", "per_draft_conv", "ring", "stock_spec",
        "replay_spec"}``: the parts and the bytes of one row of each server (all in bytes).
    """
    import torch

    from sglang_replayssm.config import ReplaySSMConfig
    from sglang_replayssm.pool import read_copy_bytes_per_slot
    from sglang_replayssm.sizing import ring_spec

    params, family = _cache_params(target_cfg)
    shape, dtypes, layers = params.shape, params.dtype, len(params.layers)
    temporal = _prod(shape.temporal) * dtypes.temporal.itemsize * layers
    win = shape.conv_kernel - 1
    dedup = not shape.disable_conv_window_dedup and eagle_topk <= 1  # memory_pool.conv_window_dedup_enabled
    conv_windows = 0
    for conv in shape.conv:
        per = _prod(conv) // win * (draft_tokens + win - 1) if dedup else draft_tokens * _prod(conv)
        conv_windows += per * dtypes.conv.itemsize * layers
    ring = ring_spec(family=family, temporal_shape=tuple(shape.temporal), conv_dim=shape.conv[0][0],
                     num_k_heads=shape.num_k_heads_per_tp, num_layers=layers, window=window,
                     act_dtype=getattr(torch, act_dtype), spec_tokens=draft_tokens).bytes_per_slot
    ring += read_copy_bytes_per_slot(tuple(shape.temporal), layers,
                                     ReplaySSMConfig(backend="replay", read_dtype=read_dtype).read_torch_dtype())
    p = int(params.mamba_cache_per_req)
    per_draft = draft_tokens * temporal
    return {"family": family, "layers": layers, "state_conv": p, "per_draft_ssm": per_draft,
            "per_draft_conv": conv_windows, "ring": ring,
            "stock_spec": p + per_draft + conv_windows, "replay_spec": p + conv_windows + ring}


def _replay_read_dtype(replay_args: str) -> str:
    """``--replayssm-read-dtype`` of ``--replay-args`` (``same`` when absent)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--replayssm-read-dtype", default="same")
    return p.parse_known_args(shlex.split(replay_args))[0].replayssm_read_dtype


def equal_memory_plan(args: argparse.Namespace, target_cfg: dict | None = None) -> dict:
    """``--radix off-equal-memory``: each spec server's ``--max-running-requests`` for equal mamba bytes.

    Each server gets the most requests whose rows fit in ``B = --equal-mamba-gib``:
    ``M = floor(B / row) - 1`` (``M + 1`` rows, ``mamba_row_bytes``), so both hold at most ``B`` and
    at least ``B - row``: equal within one row of the larger (stock spec's).  ``startup_bytes``: the
    larger of the two servers' allocations, the most mamba state either allocates at start-up.

    Raises
    ------
    ValueError
        For a combination that cannot be equal memory or cannot start: ``--replay-verify`` other than
        ``replay`` (with ``auto`` / ``snapshot`` SGLang builds its per-draft buffer for the snapshot
        fallback, so the replay server would pay ``T`` states per request *and* the rings: the mode would
        measure the ring's cost, not the gain), a flag of ``EQUAL_MEMORY_FIXED_FLAGS`` in
        ``--server-args`` / ``--replay-args``, a budget below one request of stock spec, or a model
        SGLang does not size as a hybrid.
    """
    if args.replay_verify != "replay":
        raise ValueError(
            f"--radix off-equal-memory: expected --replay-verify replay, got {args.replay_verify!r}: with auto or "
            "snapshot the replay server keeps SGLang's per-draft SSM buffer (T states per request, for the snapshot "
            "fallback) beside its rings, so it holds more bytes per request than stock spec and the mode would "
            "measure the rings' cost, not what dropping the per-draft states buys")
    fixed = [t for t in shlex.split(args.server_args) + shlex.split(args.replay_args)
             if t.split("=", 1)[0] in EQUAL_MEMORY_FIXED_FLAGS]
    if fixed:
        raise ValueError(f"--radix off-equal-memory: expected none of {fixed} in --server-args / --replay-args "
                         "(the equal-memory arithmetic sets or assumes them)")
    if target_cfg is None:
        target_cfg = json.loads((ab.ROOT / "tests" / "models" / args.model / "config.json").read_text())
    rows = mamba_row_bytes(target_cfg, draft_tokens=args.draft_tokens, window=args.window,
                           read_dtype=_replay_read_dtype(args.replay_args))
    budget = int(args.equal_mamba_gib * (1 << 30))
    plan: dict = {"budget_gib": args.equal_mamba_gib, "budget_bytes": budget, "row_bytes": rows}
    for v in SPEC_VARIANTS:
        m = budget // rows[v] - 1
        if m < 1:
            raise ValueError(f"--equal-mamba-gib: expected room for one {v} request ({2 * rows[v] / (1 << 30):.3f} "
                             f"GiB with the padding row), got {args.equal_mamba_gib} GiB")
        plan[v] = {"max_running": m, "bytes_per_request": rows[v], "bytes": (m + 1) * rows[v],
                   "gib": round((m + 1) * rows[v] / (1 << 30), 4)}
    plan["ratio"] = round(plan["replay_spec"]["max_running"] / plan["stock_spec"]["max_running"], 4)
    plan["bytes_diff"] = plan["stock_spec"]["bytes"] - plan["replay_spec"]["bytes"]
    plan["startup_bytes"] = max(plan[v]["bytes"] for v in SPEC_VARIANTS)
    plan["startup_gib"] = round(plan["startup_bytes"] / (1 << 30), 3)
    return plan


def startup_fit(plan: dict, free_bytes: int | None, weights_bytes: int) -> dict:
    """Whether the spec servers' start-up fits: the larger planned mamba allocation (``startup_bytes``,
    at most ``B``) + weights + ``STARTUP_HEADROOM_GIB`` against ``free_bytes`` (the smaller reading of the
    spec GPUs; ``fits`` None when unknown), and the largest ``--equal-mamba-gib`` that would (every
    server's allocation is at most ``B``, so the room itself, rounded down)."""
    gib = 1 << 30
    need = plan["startup_bytes"] + weights_bytes + STARTUP_HEADROOM_GIB * gib
    room = None if free_bytes is None else free_bytes - weights_bytes - STARTUP_HEADROOM_GIB * gib
    return {"need_gib": round(need / gib, 3), "free_gib": None if free_bytes is None else round(free_bytes / gib, 3),
            "weights_gib": round(weights_bytes / gib, 3), "fits": None if free_bytes is None else need <= free_bytes,
            "max_budget_gib": None if room is None else math.floor(max(room, 0) / gib * 100) / 100}


def _gpu_free_bytes(gpu: str) -> int | None:
    """Free memory of one GPU (an id of ``CUDA_VISIBLE_DEVICES``) by ``nvidia-smi``; None without a reading."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", gpu],
                           capture_output=True, text=True, timeout=20)
        return int(r.stdout.split()[0]) << 20 if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def logged_mamba_gib(m: dict) -> float | None:
    """Mamba-state GiB a server logged at start (``parse_memory_log``): checkpoint + conv state, the
    per-draft buffers (SGLang's line, or the plug-in's speculative-state line), rings, read copy."""
    if m.get("state_gb") is None or m.get("conv_gb") is None:
        return None
    total = m["state_gb"] + m["conv_gb"] + (m.get("per_draft_conv_gb") or 0.0) + (m.get("per_draft_gb") or 0.0)
    return round(total + (m.get("ring_gb") or 0.0) + (m.get("read_copy_gb") or 0.0), 4)


def equal_memory_check(plan: dict | None, memory: dict) -> dict | None:
    """The equal-memory claim checked against the servers' own pool lines.

    Per spec server: the logged mamba GiB (``logged_mamba_gib``) vs the plan's, within
    ``LOGGED_GIB_TOL`` (the lines' rounding); the logged mamba slots and ``max_running_requests`` vs
    the plan's ``--max-running-requests``.  ``equal``: the two logged totals differ by at most one
    stock-spec row (+ the tolerance); None when either server's lines are missing.  ``ratio``: the
    logged ``max_running_requests`` of replay spec over stock spec's.
    """
    if plan is None:
        return None
    gib = 1 << 30
    out: dict = {}
    for v in SPEC_VARIANTS:
        m = memory.get(v) or {}
        logged = logged_mamba_gib(m)
        want = plan[v]["max_running"]
        out[v] = {
            "logged_gib": logged, "planned_gib": plan[v]["gib"],
            "gib_matches_plan": None if logged is None else abs(logged - plan[v]["gib"]) <= LOGGED_GIB_TOL,
            "logged_slots": m.get("mamba_slots"), "logged_max_running": m.get("max_running_requests"),
            "slots_match_plan": None if m.get("mamba_slots") is None else m["mamba_slots"] == want,
            "max_running_matches_plan": (None if m.get("max_running_requests") is None
                                         else m["max_running_requests"] == want),
        }
    a, b = out["stock_spec"]["logged_gib"], out["replay_spec"]["logged_gib"]
    row = plan["row_bytes"]["stock_spec"] / gib
    out["logged_diff_gib"] = None if None in (a, b) else round(a - b, 4)
    out["equal"] = None if None in (a, b) else abs(a - b) <= row + LOGGED_GIB_TOL
    s, r = out["stock_spec"]["logged_max_running"], out["replay_spec"]["logged_max_running"]
    out["ratio"] = round(r / s, 4) if s and r is not None else None
    return out


# ----------------------------------------------------------------------------- --draft oracle


def _oracle_module():
    """``tests/e2e/spec_oracle/replayssm_spec_oracle.py`` (test-only plug-in; imported for its helpers)."""
    if str(ORACLE_DIR) not in sys.path:
        sys.path.insert(0, str(ORACLE_DIR))
    import replayssm_spec_oracle

    return replayssm_spec_oracle


def oracle_env(oracle_file: str | Path) -> dict[str, str]:
    """Environment of a spec server with the oracle drafter (its plug-in loaded through its entry point)."""
    return {"SGLANG_PLUGINS": "replayssm,replayssm_spec_oracle",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ORACLE_DIR), os.environ.get("PYTHONPATH")])),
            ORACLE_ENV: str(oracle_file)}


def bench_prompts(args: argparse.Namespace, num_prompts: int, tokenizer) -> list[list[int]]:
    """The prompt ids a server receives from one run's ``sglang.bench_serving --dataset-name random-ids``.

    bench_serving 0.5.17 seeds ``random`` and ``numpy`` with ``--seed`` (``run_benchmark``), draws
    nothing else before ``get_dataset``, and sends each prompt as text (no ``--tokenize-prompt``),
    which the server encodes.  Here: the same seeding (the caller's random states are restored), its
    own ``get_dataset`` on the namespace of ``bench_serving_ab.bench_cmd``'s flags (the tests check
    it against bench_serving's parser), then ``tokenizer.encode`` of each text.
    """
    import random

    import numpy as np
    from sglang.benchmark.datasets import get_dataset

    ns = argparse.Namespace(dataset_name="random-ids", random_input_len=args.input_len,
                            random_output_len=args.output_len, num_prompts=num_prompts, random_range_ratio=1.0,
                            dataset_path="", tokenize_prompt=False, seed=args.seed)
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        random.seed(args.seed)
        np.random.seed(args.seed)
        with contextlib.redirect_stdout(None):  # its "#Input tokens" lines
            rows = get_dataset(ns, tokenizer, None)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return [tokenizer.encode(r.prompt) if isinstance(r.prompt, str) else list(r.prompt) for r in rows]


def oracle_entries(prompts: dict[int, list[list[int]]], output_len: int, vocab: int, rate: float,
                   num_draft_tokens: int) -> tuple[list[dict], dict[int, float]]:
    """Oracle-file entries (one per distinct prompt, reference = the echo model's greedy continuation)
    and the expected accept length of each run (``{concurrency: x}``).

    ``prompts``: ``{concurrency: that run's prompts}`` (``bench_prompts``).  Seeds are the entries'
    indices, so every server and every run see the same drafts for a prompt.
    """
    oracle = _oracle_module()
    entries: dict[tuple[int, ...], dict] = {}
    for run in prompts.values():
        for p in run:
            if tuple(p) not in entries:
                entries[tuple(p)] = {"prompt": list(p), "reference": make_model.echo_continuation(p, output_len, vocab),
                                     "rate": rate, "seed": len(entries)}
    expected = {c: round(oracle.expected_accept_length([entries[tuple(p)] for p in run], vocab, num_draft_tokens,
                                                       output_len), 4)
                for c, run in prompts.items()}
    return list(entries.values()), expected


def geometric_accept_length(rate: float, num_draft_tokens: int) -> float:
    """Accept length (bonus included) of ``T-1`` drafts each wrong with probability ``rate``, independently,
    for unbounded outputs: ``(1 - (1 - r)^T) / r`` (``T`` at ``r = 0``)."""
    return float(num_draft_tokens) if rate == 0 else (1 - (1 - rate) ** num_draft_tokens) / rate


def _generate_ids(url: str, ids: list[int], n: int, timeout: float) -> dict:
    """One greedy request without logprobs (the oracle drafter refuses them): ``{"tokens"}`` or ``{"error"}``."""
    import requests

    try:
        r = requests.post(f"{url}/generate", json={
            "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}},
            timeout=timeout)
        r.raise_for_status()
        return {"tokens": r.json()["output_ids"]}
    except Exception as e:  # reported, never fatal
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def _warmup_ids(urls: dict, n: int, input_len: int, vocab: int, timeout: float) -> None:
    """``bench_serving_ab._warmup`` without logprobs: ``n`` requests (``input_len`` tokens, 8 new) per server."""
    prompts = ab._probe_prompts(n, vocab, input_len, seed=11)
    prompts = [(p * (input_len // len(p) + 1))[:input_len] for p in prompts]
    with cf.ThreadPoolExecutor(min(2 * n, 512)) as ex:
        futs = [ex.submit(_generate_ids, url, p, 8, timeout) for url in urls.values() for p in prompts]
        errors = [r["error"] for r in (f.result() for f in futs) if "error" in r]
    if errors:
        _log(f"warm-up: {len(errors)} request(s) failed, e.g. {errors[0]}")


def check_references(urls: dict, entries: list[dict], new_tokens: int, timeout: float) -> dict:
    """Greedy outputs of ``entries``' prompts on every server vs their references.

    Returns ``{server: {"checked", "equal", "errors", "first_diff"}}``; ``first_diff``: ``[entry,
    position, got, expected]`` of the first differing token (None if all equal).
    """
    out = {}
    with cf.ThreadPoolExecutor(max(1, len(urls) * len(entries))) as ex:
        futs = {name: [ex.submit(_generate_ids, url, e["prompt"], new_tokens, timeout) for e in entries]
                for name, url in urls.items()}
        for name, fs in futs.items():
            res = {"checked": len(entries), "equal": 0, "errors": 0, "first_diff": None}
            for i, (f, e) in enumerate(zip(fs, entries)):
                r = f.result()
                if "error" in r:
                    res["errors"] += 1
                    continue
                ref = e["reference"][:new_tokens]
                if r["tokens"] == ref:
                    res["equal"] += 1
                elif res["first_diff"] is None:
                    k = next((j for j, (a, b) in enumerate(zip(r["tokens"], ref)) if a != b),
                             min(len(r["tokens"]), len(ref)))
                    res["first_diff"] = [i, k, r["tokens"][k] if k < len(r["tokens"]) else None,
                                         ref[k] if k < len(ref) else None]
            out[name] = res
    return out


def _generate_echo_model(args: argparse.Namespace, out: Path, timeout: float) -> float:
    """``bench_serving_ab._generate_model`` for the echo variant (a child process, bf16 shards on the GPU)."""
    t = time.monotonic()
    code = (
        "import sys, time, torch; sys.path.insert(0, sys.argv[1]); import make_model; t = time.time(); "
        "make_model.materialize(sys.argv[2], sys.argv[3], dtype=torch.bfloat16, device=sys.argv[4], "
        "shard_bytes=int(sys.argv[5]), echo=True); "
        "print(f'generated {sys.argv[2]} (echo) in {time.time() - t:.1f}s', flush=True)"
    )
    cmd = [sys.executable, "-c", code, str(ab.ROOT / "tests" / "models"), args.model, args.model_dir, args.device,
           str(ab.SHARD_BYTES)]
    with open(out / "gen.log", "a") as fh:
        r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=max(timeout, 1.0), cwd=ab.ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"model generation failed (exit {r.returncode}):\n{(out / 'gen.log').read_text()[-3000:]}")
    return time.monotonic() - t


# ----------------------------------------------------------------------------- log parsers


_DECODE_RX = re.compile(r"Decode batch[^,]*, #running-req: (\d+),(.*)$", re.M)
_ACCEPT_RX = re.compile(r"accept len: ([\d.]+)")
_GEN_RX = re.compile(r"gen throughput \(token/s\): ([\d.]+)")


def parse_decode_log(text: str) -> dict:
    """This run's decode log lines (SGLang 0.5.17 ``Decode batch, #running-req: N, ..., accept len: X, ...``).

    ``text``: the part of a server log written during one run.  Returns ``{"decode_lines",
    "peak_running", "accept_len", "steady_tok_s", "steady_lines"}``: the largest ``#running-req``, the
    mean ``accept len`` weighted by ``#running-req`` (None without spec lines / without lines), and the
    median ``gen throughput`` of the lines at the peak ``#running-req`` but the first of them (whose
    interval holds the admissions' prefills), over ``steady_lines`` lines (None below 2 such lines).
    """
    lines = peak = 0
    weighted = weight = 0.0
    gen: list[tuple[int, float]] = []
    for m in _DECODE_RX.finditer(text):
        running = int(m.group(1))
        lines += 1
        peak = max(peak, running)
        acc = _ACCEPT_RX.search(m.group(2))
        if acc:
            weighted += running * float(acc.group(1))
            weight += running
        tput = _GEN_RX.search(m.group(2))
        if tput:
            gen.append((running, float(tput.group(1))))
    steady = [t for r, t in gen if r == peak][1:]
    return {"decode_lines": lines, "peak_running": peak if lines else None,
            "accept_len": round(weighted / weight, 4) if weight else None,
            "steady_tok_s": round(statistics.median(steady), 1) if steady else None, "steady_lines": len(steady)}


#: the speculative buffers' sizes: SGLang's pool line, or the plug-in's when it built them (CPU, replay verify)
_SPEC_LINE = r"(?:Mamba Cache is allocated|ReplaySSM speculative state is allocated)\."
_MEMORY_RX = {
    "avail_before_weights_gb": (r"Load weight begin\. avail mem=([\d.]+) GB", float),
    "avail_after_pools_gb": (re.escape(POOL_MARK) + r"\. avail mem=([\d.]+) GB", float),
    "mamba_slots": (r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)", int),
    "conv_gb": (r"Mamba Cache is allocated\..*?conv_state size: ([\d.]+)GB", float),
    "state_gb": (r"Mamba Cache is allocated\..*?ssm_state size: ([\d.]+)GB", float),
    "per_draft_gb": (_SPEC_LINE + r".*?intermediate_ssm_state_cache size: ([\d.]+)GB", float),
    "per_draft_conv_gb": (_SPEC_LINE + r".*?intermediate_conv_window_cache size: ([\d.]+)GB", float),
    "per_draft_ssm_not_allocated": (r"ReplaySSM speculative state is allocated\..*?(intermediate_ssm not allocated)",
                                    bool),
    "ring_gb": (r"ReplaySSM rings are allocated\..*?ring size: ([\d.]+)GB", float),
    "ring_bytes_per_slot": (r"ReplaySSM memory: (\d+) B of ring", int),
    "state_bytes_per_slot": (r"ReplaySSM memory: .*?\(state (\d+) B per slot\)", int),
    "replay_slots_before": (r"ReplaySSM memory: .*?max_mamba_cache_size (\d+) -> \d+", int),
    "read_copy_gb": (r"ReplaySSM read copy is allocated\..*?size: ([\d.]+)GB", float),
    "capped_by_mamba_to": (r"max_running_requests is capped to (\d+) by the mamba state cache", int),
}


def parse_memory_log(text: str) -> dict:
    """Pool sizes a server logged at start (first occurrence each: the target's, before the draft's).

    Returns every key of ``_MEMORY_RX`` (None when absent) plus ``max_running_requests`` and
    ``max_total_num_tokens`` (the scheduler's start-up summary, the last one) and
    ``per_draft_gb_per_request``: SGLang's per-draft buffers (SSM states + conv windows) over their
    ``max_running_requests + 1`` rows.
    """
    out: dict = {}
    for key, (rx, cast) in _MEMORY_RX.items():
        m = re.search(rx, text)
        out[key] = cast(m.group(1)) if m else None
    runs = re.findall(r"max_total_num_tokens=(\d+).*?max_running_requests=(\d+)", text)
    out["max_running_requests"] = int(runs[-1][1]) if runs else None
    out["max_total_num_tokens"] = int(runs[-1][0]) if runs else None
    drafts = [out[k] for k in ("per_draft_gb", "per_draft_conv_gb") if out[k] is not None]
    rows = out["max_running_requests"]
    out["per_draft_gb_per_request"] = round(sum(drafts) / (rows + 1), 4) if drafts and rows else None
    return out


_DECISION_RX = re.compile(
    r"ReplaySSM verify bs=(?P<bs>\d+) T=(?P<T>\d+): (?P<path>\w+) \((?P<reason>.*); source=(?P<source>.*); "
    r"snapshot (?P<snapshot_mb>\S+) MB (?P<snapshot_us>\S+) us util (?P<snapshot_util>\S+), "
    r"replay (?P<replay_mb>\S+) MB (?P<replay_us>\S+) us util (?P<replay_util>\S+)\)\s*$", re.M)


def parse_heuristic_log(text: str) -> list[dict]:
    """The verify plan's per-bucket lines (``heuristic.Decision.log_line``), one per bucket (the last
    wins: the int32 guard re-logs the buckets it moves), sorted by batch size."""
    found: dict[tuple[int, int], dict] = {}
    for m in _DECISION_RX.finditer(text):
        d = m.groupdict()
        row = {"bs": int(d["bs"]), "T": int(d["T"]), "path": d["path"], "reason": d["reason"],
               "source": d["source"]}
        row.update({k: float(d[k]) for k in d if k.startswith(("snapshot_", "replay_"))})
        found[row["bs"], row["T"]] = row
    return [found[k] for k in sorted(found)]




# ----------------------------------------------------------------------------- report


def _accept(result: dict) -> float | None:
    """A run's accept length: this run's (server log) when there, else bench_serving's."""
    run_acc = (result.get("server_log_decode") or {}).get("accept_len")
    return run_acc if run_acc is not None else result.get("accept_length")


def _throughput_rows(runs: dict) -> list[str]:
    lines = [
        "| concurrency | variant | prompts | completed | out tok/s | x vs stock spec | median TPOT ms "
        "| median ITL ms | accept len (bench_serving) | accept len (this run) | peak #running "
        "| steady decode tok/s (log) | x steady |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sorted(runs):
        base = (runs[c].get("stock_spec") or {}).get("output_throughput")
        base_steady = ((runs[c].get("stock_spec") or {}).get("server_log_decode") or {}).get("steady_tok_s")
        for v in VARIANTS:
            r = runs[c].get(v) or {}
            log = r.get("server_log_decode") or {}
            tput = r.get("output_throughput")
            steady = log.get("steady_tok_s")
            lines.append(
                f"| {c} | {v} | {runs[c].get('num_prompts', '—')} | {ab._done(r) if r else '—'} | {ab._fmt(tput)} "
                f"| {ab._fmt(ab._ratio(tput, base), '.3f')} | {ab._fmt(r.get('median_tpot_ms'), '.2f')} "
                f"| {ab._fmt(r.get('median_itl_ms'), '.2f')} | {ab._fmt(r.get('accept_length'), '.3f')} "
                f"| {ab._fmt(log.get('accept_len'), '.3f')} | {ab._fmt(log.get('peak_running'), 'd')} "
                f"| {ab._fmt(steady)} | {ab._fmt(ab._ratio(steady, base_steady), '.3f')} |")
    return lines + [
        "",
        "x = output throughput / stock spec's at the same concurrency. accept len (bench_serving): its "
        "`accept_length`, the server's average since it started (warm-up and earlier runs included); "
        "(this run): the decode log lines written during the run, weighted by #running-req. peak #running: "
        "the largest #running-req of those lines (requests beyond a server's limit queue). steady decode "
        "tok/s (log): the median `gen throughput` of the run's decode lines at its peak #running, the first "
        "of them left out (its interval holds the admissions' prefills); x steady: over stock spec's. Not a "
        "bench_serving figure: it leaves out the prefill burst and the ramps, which a short run weighs heavily.",
    ]


def _memory_rows(memory: dict, meta: dict) -> list[str]:
    base = (memory.get("stock_spec") or {}).get("max_running_requests")
    lines = [
        "| variant | GPU | --mem-fraction-static | free before weights GB | max_running_requests | mamba slots "
        "| state + conv GB | per-draft GB (per request) | rings GB | free after pools GB | x vs stock spec |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in VARIANTS:
        m = memory.get(v) or {}
        state = None if m.get("state_gb") is None else m["state_gb"] + (m.get("conv_gb") or 0.0)
        per_draft = ab._fmt(m.get("per_draft_gb"), ".2f")
        if m.get("per_draft_gb_per_request") is not None:
            per_draft += f" ({m['per_draft_gb_per_request']:.3f})"
        if m.get("per_draft_ssm_not_allocated"):
            per_draft += ", SSM states not allocated"
        mrr = m.get("max_running_requests")
        lines.append(
            f"| {v} | {(meta.get('gpu_of') or {}).get(v, '—')} | {(meta.get('mem_fraction') or {}).get(v, '—')} "
            f"| {ab._fmt(m.get('avail_before_weights_gb'), '.2f')} | {ab._fmt(mrr, 'd')} "
            f"| {ab._fmt(m.get('mamba_slots'), 'd')} "
            f"| {ab._fmt(state, '.2f')} | {per_draft} | {ab._fmt(m.get('ring_gb'), '.3f')} "
            f"| {ab._fmt(m.get('avail_after_pools_gb'), '.2f')} "
            f"| {ab._fmt(ab._ratio(mrr, base) if v in SPEC_VARIANTS else None, '.2f')} |")
    if meta.get("radix") == "off-equal-memory":
        note = ("Spec servers: radix cache off, --max-running-requests from equal mamba-state bytes (above): "
                "max_running_requests is the plan's, the pool lines say what each allocated. free after pools "
                "counts everything on the GPU by then (weights, draft, allocator cache), so the pool lines, not "
                "this column, check the equal memory.")
    else:
        note = ("Spec servers: each alone on its GPU while it sized its pools, radix cache on (no_buffer), "
                f"--max-running-requests {SPEC_MAX_RUNNING_REQUESTS}: max_running_requests is SGLang's derivation "
                "(mamba slots // 3).")
    return lines + ["", f"{note} stock_nospec: explicit (radix off, one slot per request), not a memory figure."]


def _equal_memory_rows(meta: dict, memory: dict) -> list[str]:
    """--radix off-equal-memory: the arithmetic per request, the chosen limits, and the servers' pool lines."""
    plan = meta.get("equal_memory")
    if not plan:
        return []
    check = equal_memory_check(plan, memory)
    mib, gib = float(1 << 20), float(1 << 30)
    rows = plan["row_bytes"]
    lines = [
        f"Radix cache off, each spec server sized for {plan['budget_gib']:g} GiB of mamba state: "
        "--max-running-requests M = the most requests whose M + 1 rows (SGLang's padding row included) fit. "
        "Bytes per row by arithmetic (SGLang's cache params of the model config, the plug-in's ring sizing); "
        "logged: the servers' own pool lines (state + conv + per-draft buffers kept + rings).",
        "",
        "| variant | state + conv MiB | per-draft SSM MiB | per-draft conv MiB | ring MiB | MiB per request "
        "| --max-running-requests | planned GiB | logged GiB | logged slots | logged max_running_requests "
        "| KV tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in SPEC_VARIANTS:
        c = check[v]
        draft = rows["per_draft_ssm"] if v == "stock_spec" else 0
        ring = rows["ring"] if v == "replay_spec" else 0
        lines.append(
            f"| {v} | {rows['state_conv'] / mib:.2f} | {draft / mib:.2f} | {rows['per_draft_conv'] / mib:.2f} "
            f"| {ring / mib:.2f} | {rows[v] / mib:.2f} | {plan[v]['max_running']} | {plan[v]['gib']:.3f} "
            f"| {ab._fmt(c['logged_gib'], '.3f')} | {ab._fmt(c['logged_slots'], 'd')} "
            f"| {ab._fmt(c['logged_max_running'], 'd')} "
            f"| {ab._fmt((memory.get(v) or {}).get('max_total_num_tokens'), 'd')} |")
    equal = {None: "not measured", True: "equal", False: "NOT equal"}[check["equal"]]
    lines += [
        "",
        f"Max running requests by arithmetic: {plan['replay_spec']['max_running']} / "
        f"{plan['stock_spec']['max_running']} = {plan['ratio']:.2f}x (not a measurement); from the logs: "
        f"{ab._fmt(check['ratio'], '.2f')}x.",
        f"Equal memory from the logs: stock_spec {ab._fmt(check['stock_spec']['logged_gib'], '.3f')} GiB vs "
        f"replay_spec {ab._fmt(check['replay_spec']['logged_gib'], '.3f')} GiB (difference "
        f"{ab._fmt(check['logged_diff_gib'], '+.3f')}; one stock_spec request is {rows['stock_spec'] / gib:.3f} "
        f"GiB): {equal}.",
    ]
    for v in SPEC_VARIANTS:
        c = check[v]
        off = [what for what, ok in (("mamba GiB", c["gib_matches_plan"]), ("mamba slots", c["slots_match_plan"]),
                                     ("max_running_requests", c["max_running_matches_plan"])) if ok is False]
        if off:
            lines.append(f"{v}: logged {', '.join(off)} differ from the plan (see its server log).")
    fit = plan.get("startup_check") or {}
    checked = ("not checked" if fit.get("free_gib") is None else
               f"with the weights and {STARTUP_HEADROOM_GIB:g} GiB headroom {fit['need_gib']:.1f} GiB vs "
               f"{fit['free_gib']:.1f} GiB free on the spec GPUs (the smaller reading) before the servers started")
    lines.append(
        f"Start-up: at most {plan['startup_gib']:.1f} GiB of mamba state per spec server (each allocates only its "
        f"planned rows; the replay pool allocates no per-draft SSM buffer); {checked}.")
    budgets = meta.get("one_gpu_budgets")
    if budgets:
        per = "; ".join(
            f"{v} {b['running']} requests, {b['mamba_bytes'] / gib:.2f} GiB mamba + {b['kv_tokens']} KV tokens "
            f"({b['kv_bytes'] / gib:.2f} GiB), --mem-fraction-static "
            f"{(meta.get('mem_fraction') or {}).get(v, '—')} of {b.get('free_at_launch_gib', '—')} GiB free at its launch"
            for v, b in budgets["servers"].items())
        lines.append(
            f"One GPU (spec_one_gpu.py): every server on it, each started once the previous one sized its pools and "
            f"budgeted by arithmetic ({budgets['kv_bytes_per_token']} KV bytes per token): {per}; "
            f"{budgets['need_gib']:.1f} GiB needed in all vs {budgets['free_gib']:.1f} GiB free; the runs took the GPU "
            "one server at a time (the spec pair's order alternating with the concurrency).")
    return lines


def _heuristic_rows(decisions: list[dict], max_running: int | None) -> list[str]:
    if not decisions:
        return ["No `ReplaySSM verify bs=` lines in the replay server's log."]
    lines = ["| bs | T | path | source | snapshot us | replay us | snapshot / replay | snapshot util "
             "| captured | reason |", "|---:|---:|---|---|---:|---:|---:|---:|---|---|"]
    for d in decisions:
        captured = "—" if max_running is None else ("yes" if d["bs"] <= max_running else "no (> limit)")
        lines.append(
            f"| {d['bs']} | {d['T']} | {d['path']} | {d['source']} | {d['snapshot_us']:.1f} | {d['replay_us']:.1f} "
            f"| {ab._fmt(ab._ratio(d['snapshot_us'], d['replay_us']), '.2f')} | {d['snapshot_util']:.2f} | {captured} "
            f"| {d['reason']} |")
    return lines


def _oracle_lines(runs: dict, meta: dict) -> list[str]:
    """--draft oracle: expected vs measured accept length per run, and the reference check."""
    o = meta.get("oracle") or {}
    expected = {int(c): x for c, x in (o.get("expected_accept_len") or {}).items()}
    lines = [
        f"Acceptance: REPLAYSSM_ORACLE drafts on the echo model, each draft token wrong with probability "
        f"{meta.get('wrong_rate')} (the same drafts for both spec servers; geometric accept length "
        f"{ab._fmt(o.get('geometric_accept_len'), '.3f')} at T={meta.get('draft_tokens')}; expected per run: "
        "the references' own draws, the outputs' last steps cut by the output length).",
        "",
        "| concurrency | expected accept len | stock_spec (this run) | replay_spec (this run) "
        "| stock_spec (bench_serving) | replay_spec (bench_serving) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sorted(runs):
        r = runs[c]
        cells = [ab._fmt(((r.get(v) or {}).get("server_log_decode") or {}).get("accept_len"), ".3f")
                 for v in SPEC_VARIANTS]
        cells += [ab._fmt((r.get(v) or {}).get("accept_length"), ".3f") for v in SPEC_VARIANTS]
        lines.append(f"| {c} | {ab._fmt(expected.get(c), '.3f')} | {' | '.join(cells)} |")
    checks = o.get("reference_check") or {}
    lines.append("")
    if not checks:
        lines.append("Reference check: not run.")
    for v in VARIANTS:
        if v in checks:
            r = checks[v]
            diff = "" if r["first_diff"] is None else (
                f"; first difference [entry, position, got, expected] {r['first_diff']}")
            lines.append(f"Reference check {v}: {r['equal']}/{r['checked']} greedy outputs equal the references "
                         f"({r['errors']} errors{diff}).")
    return lines


def _verdict(x: float | None, goal: float) -> str:
    return "not measured" if x is None else ("met" if x >= goal else "MISSED")


def _target_lines(runs: dict, memory: dict, plan: dict | None = None) -> list[str]:
    lines = []
    for c in THROUGHPUT_TARGET_CONCURRENCY:
        r = runs.get(c) or {}
        s, p = r.get("stock_spec") or {}, r.get("replay_spec") or {}
        x = ab._ratio(p.get("output_throughput"), s.get("output_throughput"))
        sa, pa = _accept(s), _accept(p)
        equal = "not measured" if None in (sa, pa) else (
            "equal" if abs(pa - sa) <= ACCEPT_TOL else f"NOT equal (|diff| > {ACCEPT_TOL})")
        lines.append(f"target c={c}: replay spec / stock spec output throughput >= {THROUGHPUT_X_MIN:.2f}: "
                     f"{ab._fmt(x, '.3f')} {_verdict(x, THROUGHPUT_X_MIN)}; accept len {ab._fmt(sa, '.3f')} vs "
                     f"{ab._fmt(pa, '.3f')}: {equal}")
    mx = ab._ratio((memory.get("replay_spec") or {}).get("max_running_requests"),
                   (memory.get("stock_spec") or {}).get("max_running_requests"))
    how = "radix cache on"
    if plan is not None:
        equal = (equal_memory_check(plan, memory) or {}).get("equal")
        how = ("radix cache off, equal memory by the pool lines: "
               + {None: "not measured", True: "equal", False: "NOT equal"}[equal])
    lines.append(f"target: replay spec / stock spec max running requests at equal memory >= "
                 f"{MAX_RUNNING_X_MIN:.2f}: {ab._fmt(mx, '.2f')} {_verdict(mx, MAX_RUNNING_X_MIN)} ({how})")
    r1 = runs.get(1) or {}
    best = max((v for v in ((r1.get(k) or {}).get("output_throughput") for k in ("stock_spec", "stock_nospec"))
                if v is not None), default=None)
    x1 = ab._ratio((r1.get("replay_spec") or {}).get("output_throughput"), best)
    lines.append(f"target c=1: replay spec / the better of stock spec and stock without spec >= {C1_X_MIN:.2f}: "
                 f"{ab._fmt(x1, '.3f')} {_verdict(x1, C1_X_MIN)}")
    return lines


def _profile_lines(runs: dict, meta: dict) -> list[str]:
    """Per concurrency with a profiled run: GPU time by kernel class (``step_profile.report_lines``)."""
    lines = []
    for c in sorted(runs):
        got = {v: r["step_profile"] for v in VARIANTS if isinstance(r := runs[c].get(v), dict)
               and isinstance(r.get("step_profile"), dict)}
        if not got:
            continue
        errors = [f"{v}: {p['error']}" for v, p in got.items() if "error" in p]
        summaries = {v: p["summary"] for v, p in got.items() if "summary" in p}
        lines += [f"#### GPU time over {meta.get('profile_steps')} profiled forwards, c={c} (torch profiler, "
                  f"{meta.get('profile_delay'):g} s into each run; a share, not a timing: the profiler slows "
                  "launches, and the window may hold admissions' prefills; these runs' throughput above includes "
                  "the profiler and its trace export)", ""]
        lines += step_profile.report_lines(summaries)
        lines += [f"Profile not taken: {e}" for e in errors]
        lines.append("")
    return lines


def build_report(runs: dict, memory: dict, decisions: list[dict], meta: dict) -> str:
    """Markdown: throughput per concurrency and variant, memory at equal fraction, the verify plan, targets.

    Parameters
    ----------
    runs : dict
        ``{concurrency: {"num_prompts": n, variant: result}}``; a result is a bench_serving JSON line
        plus our ``server_log_decode`` (``parse_decode_log``), or ``{"skipped": why}`` / ``{"error": why}``.
    memory : dict
        ``{variant: parse_memory_log(...)}``.
    decisions : list of dict
        ``parse_heuristic_log`` of the replay server's log.
    meta : dict
        Run description: ``model``, ``family``, ``commit``, ``date``, ``gpu``, ``input_len``,
        ``output_len``, ``draft_tokens``, ``window``, ``replay_verify``, ``gpu_of``, ``mem_fraction``,
        ``flags``, ``warnings``; with ``draft`` ``"oracle"``: ``wrong_rate`` and ``oracle``
        (``expected_accept_len`` per concurrency, ``geometric_accept_len``, ``reference_check``); with
        ``radix`` ``"off-equal-memory"``: ``equal_memory`` (``equal_memory_plan``, plus
        ``startup_check``).
    """
    t = meta.get("draft_tokens")
    oracle = meta.get("draft") == "oracle"
    drafter = (f"REPLAYSSM_ORACLE drafter on the echo variant of the model, wrong rate {meta.get('wrong_rate')}, "
               f"{t - 1 if t else '—'} steps, topk 1" if oracle else
               f"STANDALONE draft (tiny Llama, dummy weights), {t - 1 if t else '—'} steps, topk 1")
    acceptance = _oracle_lines(runs, meta) if oracle else [
        "Acceptance: the draft has random (dummy) weights, so nearly every draft token is rejected and the "
        "accept length is ~1 (the bonus token): speculation cannot pay at that acceptance, and the spec servers "
        "are expected to be slower than stock without spec."]
    radix = ("radix cache off, equal mamba-state memory" if meta.get("radix") == "off-equal-memory"
             else "radix cache on (no_buffer)")
    lines = [
        f"### Speculative serving (T={t}): {meta.get('model')} ({meta.get('family')}), stock spec vs replay spec "
        "vs stock without spec",
        "",
        f"commit `{meta.get('commit')}`, {meta.get('date')}, {meta.get('gpu') or '—'}; bench_serving random-ids, "
        f"input {meta.get('input_len')}, output {meta.get('output_len')}, range ratio 1.0; {drafter}, "
        f"{t} draft tokens; replay "
        f"--replayssm-window {meta.get('window')} --replayssm-verify {meta.get('replay_verify')}; spec servers: "
        f"{radix}; "
        "server flags in results.json.",
        "",
        *_throughput_rows(runs),
        "",
        *acceptance,
        "",
        "#### Max running requests at equal memory",
        "",
        *_equal_memory_rows(meta, memory),
        *([""] if meta.get("equal_memory") else []),
        *_memory_rows(memory, meta),
        "",
        f"#### Verify path per bucket (replay spec, --replayssm-verify {meta.get('replay_verify')})",
        "",
        *_heuristic_rows(decisions, (memory.get("replay_spec") or {}).get("max_running_requests")),
        "",
        *_profile_lines(runs, meta),
        *_target_lines(runs, memory, meta.get("equal_memory")),
    ]
    lines += [f"WARNING: {w}" for w in meta.get("warnings", [])]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- running


def _log(msg: str) -> None:
    print(f"[bench_spec_serving {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclasses.dataclass
class _Server:
    """One server of the run: where it runs, how it was started, whether it is ready."""

    name: str
    gpu: str
    port: int
    log: Path
    flags: list[str]
    proc: subprocess.Popen | None = None
    ready: bool = False
    error: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def usable(self) -> bool:
        return self.proc is not None and self.error is None


class _Session:
    """State of one ``main()`` run: servers, results, deadline; every step is a method."""

    def __init__(self, args: argparse.Namespace, argv: Sequence[str], out: Path, work: Path) -> None:
        self.args = args
        self.out = out
        self.work = work
        self.dl = ab._Deadline(args.time_budget)
        self.target_cfg = json.loads((ab.ROOT / "tests" / "models" / args.model / "config.json").read_text())
        self.draft_dir = Path(f"{args.model_dir}_draft")
        ids = gpu_env_ids(args.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        gpu_a, gpu_b = ids * 2 if args.one_gpu else ids
        self.base_flags = common_flags(args)
        self.servers = {
            v: _Server(v, gpu, ab.srv.free_port(), out / f"server_{v}.log", variant_flags(v, args, self.draft_dir))
            for v, gpu in zip(VARIANTS, (gpu_a, gpu_b, gpu_a)) if not (args.skip_nospec and v == "stock_nospec")
        }
        self.budgets: dict[str, dict] = {}
        self.runs: dict[int, dict] = {c: {"num_prompts": n} for c, n in zip(args.concurrency, args.num_prompts)}
        self.memory: dict[str, dict] = {}
        self.decisions: list[dict] = []
        self.timings: dict[str, float] = {}
        self.status = 0
        self.unequal_warned = False
        self.lock = threading.Lock()
        self.oracle_entries: list[dict] = []
        self.meta = self._meta(argv)
        self.profiles_taken = 0
        if args.profile_steps > 0:
            self.meta["warnings"].append(
                f"--profile-steps {args.profile_steps}: the spec runs were profiled, so their throughput includes "
                "the profiler's overhead over those forwards and the server's trace export (a stall mid-run); take "
                "throughput from runs without it")

    def _meta(self, argv: Sequence[str]) -> dict:
        a = self.args
        cmd = [sys.executable, "-m", "benchmarks.bench_spec_serving", *argv]
        return {
            "model": a.model, "family": a.family, "commit": a.commit, "gpu": ab._gpu_name(),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "input_len": a.input_len, "output_len": a.output_len, "draft_tokens": a.draft_tokens,
            "window": a.window, "replay_verify": a.replay_verify, "draft": a.draft, "wrong_rate": a.wrong_rate,
            "radix": a.radix, "equal_memory": a.equal_memory,
            "flashinfer_workspace": flashinfer_workspace() if a.radix == "off-equal-memory" else None,
            "gpu_of": {v: s.gpu for v, s in self.servers.items()}, "one_gpu": a.one_gpu,
            "mem_fraction": {v: a.nospec_mem_fraction if v == "stock_nospec" else a.spec_mem_fraction
                             for v in VARIANTS},
            "flags": {v: " ".join(self.base_flags + s.flags) for v, s in self.servers.items()},
            "draft_config": draft_config(self.target_cfg, self._draft_base()) if a.draft == "standalone" else None,
            "command": " ".join(shlex.quote(x) for x in cmd), "warnings": [],
            "profile_steps": a.profile_steps, "profile_delay": a.profile_delay,
        }

    @staticmethod
    def _draft_base() -> dict:
        return json.loads((ab.ROOT / "tests" / "models" / "llama_tiny" / "config.json").read_text())

    def warn(self, msg: str) -> None:
        with self.lock:
            self.meta["warnings"].append(msg)
        _log(f"warning: {msg}")

    def write(self) -> str:
        report = build_report(self.runs, self.memory, self.decisions, self.meta)
        (self.out / "results.md").write_text(report)
        (self.out / "results.json").write_text(json.dumps(
            {"meta": self.meta, "timings_s": self.timings, "memory": self.memory, "verify_plan": self.decisions,
             "equal_memory_check": equal_memory_check(self.meta.get("equal_memory"), self.memory),
             "runs": {str(c): r for c, r in self.runs.items()}, "model_config": self.target_cfg,
             "args": vars(self.args)}, indent=1, default=str))
        return report

    # -- models and servers

    def make_models(self) -> None:
        timeout = min(240.0, self.dl.left() - ab.TEARDOWN_RESERVE_S)
        if self.args.draft == "oracle":
            self.timings["generate"] = _generate_echo_model(self.args, self.out, timeout)
        else:
            self.timings["generate"] = ab._generate_model(self.args, self.out, timeout)
            make_model.materialize("llama_tiny", self.draft_dir, config=self.meta["draft_config"])
        _log(f"models ready in {self.dl.elapsed():.0f}s")

    @property
    def oracle_file(self) -> Path:
        return self.work / "oracle.json"

    def write_oracle(self) -> None:
        """--draft oracle: the oracle file from the runs' exact prompts (before the servers start, so its
        one read, at the warm-up's first request, is over before any run)."""
        if self.args.draft != "oracle":
            return
        from sglang.benchmark.utils import get_tokenizer

        t = time.monotonic()
        a = self.args
        tokenizer = get_tokenizer(str(a.model_dir))
        by_n: dict[int, list[list[int]]] = {}
        for n in set(a.num_prompts):
            by_n[n] = bench_prompts(a, n, tokenizer)
        prompts = {c: by_n[n] for c, n in zip(a.concurrency, a.num_prompts)}
        bad = sorted({len(p) for run in prompts.values() for p in run} - {a.input_len})
        if bad:
            self.warn(f"oracle: prompt lengths {bad} after the server's encoding, expected {a.input_len}")
        vocab = int(self.target_cfg["vocab_size"])
        # the reference check's prompts: bench_serving's kind with another seed, so that the check leaves
        # no run prompt in the spec servers' radix caches (bench_serving does not flush them)
        check = bench_prompts(argparse.Namespace(**{**vars(a), "seed": a.seed + 1000}), REFERENCE_CHECK_PROMPTS,
                              tokenizer)
        entries, expected = oracle_entries({**prompts, 0: check}, a.output_len, vocab, a.wrong_rate,
                                           a.draft_tokens)
        expected.pop(0)
        self.oracle_file.write_text(json.dumps({"entries": entries}))
        keys = {tuple(p) for p in check}
        self.oracle_entries = [e for e in entries if tuple(e["prompt"]) in keys]
        self.meta["oracle"] = {
            "wrong_rate": a.wrong_rate, "entries": len(entries), "expected_accept_len": expected,
            "geometric_accept_len": round(geometric_accept_length(a.wrong_rate, a.draft_tokens), 4),
            "reference_check": {},
        }
        self.timings["oracle_file"] = time.monotonic() - t
        _log(f"oracle file: {len(entries)} prompts, expected accept length {expected} "
             f"({self.timings['oracle_file']:.1f}s)")

    def _launch(self, s: _Server) -> None:
        env = {"SGLANG_MAMBA_CONV_DTYPE": "bfloat16", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": s.gpu,
               "SGLANG_REPLAYSSM_VERIFY_CACHE": str(self.work / "verify_decisions.json")}
        if self.args.draft == "oracle" and s.name in SPEC_VARIANTS:
            env |= oracle_env(self.oracle_file)
        if self.args.radix == "off-equal-memory":
            env["SGLANG_FLASHINFER_WORKSPACE_SIZE"] = flashinfer_workspace()
        s.proc = ab.srv.launch(Path(self.args.model_dir), s.flags, s.log, port=s.port, env=env,
                               base_flags=self.base_flags)
        self.timings[f"launch_{s.name}"] = self.dl.elapsed()
        _log(f"started {s.name} on GPU {s.gpu} (pid {s.proc.pid}, port {s.port})")

    def _wait_mark(self, s: _Server, mark: str, timeout: float) -> None:
        """Until ``mark`` is in the server's log; RuntimeError if it exits, TimeoutError after ``timeout``."""
        end = time.monotonic() + timeout
        while mark not in (s.log.read_text(errors="replace") if s.log.exists() else ""):
            if s.proc.poll() is not None:
                raise RuntimeError(f"{s.name} exited with {s.proc.returncode} before {mark!r}")
            if time.monotonic() > end:
                raise TimeoutError(f"{s.name}: no {mark!r} in {timeout:.0f}s")
            time.sleep(1.0)

    def check_startup_fits(self) -> None:
        """--radix off-equal-memory: refuse (RuntimeError) spec servers whose mamba state cannot fit their GPUs.

        Each spec server allocates its planned rows at start-up and nothing more (the replay pool never
        allocates SGLang's per-draft SSM buffer with ``--replayssm-verify replay``), at most ``B``: the
        larger of the two (``startup_bytes``) + weights + headroom must fit; a run that fails there costs
        the whole cold start.  Free memory: the smaller ``nvidia-smi`` reading of the spec GPUs before
        any server starts (not checked without both readings).
        """
        plan = self.args.equal_memory
        if plan is None:
            return
        weights = sum(f.stat().st_size for f in Path(self.args.model_dir).glob("*.safetensors"))
        gpus = sorted({self.servers[v].gpu for v in SPEC_VARIANTS})
        readings = [_gpu_free_bytes(g) for g in gpus]
        free = None if None in readings else min(readings)
        fit = startup_fit(plan, free, weights)
        self.meta["equal_memory"] = {**plan, "startup_check": fit}
        if self.args.one_gpu:
            self._check_one_gpu_fits(plan, free, weights)
            return
        if free is None:
            self.warn("the spec servers' start-up not checked (no nvidia-smi reading of the free memory of GPUs "
                      f"{','.join(gpus)}): each needs up to {fit['need_gib']:.1f} GiB with the weights")
        elif not fit["fits"]:
            raise RuntimeError(
                f"--equal-mamba-gib {plan['budget_gib']:g}: a spec server's mamba state ({plan['startup_gib']:.1f} "
                f"GiB) + weights + {STARTUP_HEADROOM_GIB:g} GiB = {fit['need_gib']:.1f} GiB > {fit['free_gib']:.1f} "
                f"GiB free on GPUs {','.join(gpus)} (the smaller reading); "
                f"expected --equal-mamba-gib <= {fit['max_budget_gib']:.2f}")

    def _check_one_gpu_fits(self, plan: dict, free: int | None, weights: int) -> None:
        """One GPU: every server's budget (``spec_one_gpu.server_budgets``) must fit it together."""
        kv = kv_bytes_per_token(self.target_cfg)
        self.budgets = one_gpu.server_budgets(self.args, plan, kv, weights, tuple(self.servers))
        fit = one_gpu.one_gpu_fit(self.budgets, free)
        self.meta["one_gpu_budgets"] = {"kv_bytes_per_token": kv, **fit,
                                        "servers": {v: dict(b) for v, b in self.budgets.items()}}
        if free is None:
            raise RuntimeError(f"--gpus {self.servers['stock_spec'].gpu} (one GPU): no nvidia-smi reading of its free "
                               "memory: the servers' fractions need one")
        if not fit["fits"]:
            raise RuntimeError(
                f"one GPU: the servers need {fit['need_gib']:.1f} GiB (per server {fit['per_server_gib']} + "
                f"{one_gpu.FRACTION_SLACK_GIB + one_gpu.PER_SERVER_RESERVE_GIB:g} GiB each) > {fit['free_gib']:.1f} "
                "GiB free; expected fewer: --skip-nospec, a smaller largest --concurrency or --equal-mamba-gib")

    def _launch_on_shared_gpu(self, s: _Server) -> None:
        """One GPU: this server's fraction and KV tokens from what is free now, then its launch."""
        free = _gpu_free_bytes(s.gpu)
        if free is None:
            raise RuntimeError(f"{s.name}: no nvidia-smi reading of GPU {s.gpu}'s free memory")
        extra = one_gpu.server_flags(self.budgets[s.name], free)
        drop = {"--mem-fraction-static", "--max-total-tokens"}
        kept, skip = [], False
        for t in s.flags:
            if skip:
                skip = False
            elif t in drop:
                skip = True
            else:
                kept.append(t)
        s.flags = [*kept, *extra]
        self.meta["flags"][s.name] = " ".join(self.base_flags + s.flags)
        self.meta["mem_fraction"][s.name] = float(extra[1])
        self.meta["one_gpu_budgets"]["servers"][s.name]["free_at_launch_gib"] = round(free / (1 << 30), 3)
        self._launch(s)

    def _start_one_gpu(self) -> None:
        """One GPU: each server after the previous one logged its pools (so it budgets from what is left)."""
        prev = None
        for s in self.servers.values():
            if prev is not None:
                self._wait_mark(prev, POOL_MARK, timeout=min(300.0, max(self.dl.left() - 60.0, 1.0)))
                self.timings[f"{prev.name}_pools_sized"] = self.dl.elapsed()
            self._launch_on_shared_gpu(s)
            prev = s

    def start(self) -> None:
        """The spec servers at once, each alone on its GPU; stock without spec once stock spec sized its pools.
        One GPU: one after another (``_start_one_gpu``)."""
        if self.args.one_gpu:
            self._start_one_gpu()
            return
        for v in SPEC_VARIANTS:
            self._launch(self.servers[v])
        first = self.servers["stock_spec"]
        try:
            self._wait_mark(first, POOL_MARK, timeout=min(300.0, max(self.dl.left() - 60.0, 1.0)))
            self.timings["stock_spec_pools_sized"] = self.dl.elapsed()
        except (RuntimeError, TimeoutError) as e:
            self.warn(f"stock_nospec started without stock_spec's pools sized ({e}): stock_spec's budget may "
                      "include stock_nospec's allocations")
        if "stock_nospec" in self.servers:
            self._launch(self.servers["stock_nospec"])

    def prepare(self, names: Sequence[str], reserve_s: float) -> None:
        """Wait for these servers, keeping ``reserve_s`` of the budget (one that fails or is late is stopped,
        so it disturbs no run, and the others go on), then warm the new ones up at once."""
        fresh = []
        for v in names:
            s = self.servers[v]
            if s.ready or not s.usable():
                continue
            try:
                ready = ab._wait_ready({v: s.proc}, {v: s.port}, {v: s.log},
                                       deadline=time.monotonic() + max(self.dl.left() - reserve_s, 1.0))
                s.ready = True
                self.timings[f"ready_{v}"] = self.dl.elapsed()
                fresh.append(v)
                _log(f"{v} ready ({ready[v]:.0f}s of waiting)")
            except Exception as e:  # reported; the other servers go on
                s.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                self.warn(f"{v} did not start: {s.error} (see server_{v}.log)")
                self.status = 1
                ab.srv.stop(s.proc)
        self.refresh_logs()
        self._check_backends(fresh)
        if fresh and self.dl.left() > 90:
            t = time.monotonic()
            warmup = _warmup_ids if self.args.draft == "oracle" else ab._warmup
            warmup({v: self.servers[v].url for v in fresh}, max(self.args.concurrency), self.args.input_len,
                   int(self.target_cfg["vocab_size"]), timeout=min(120.0, self.dl.left() - 60.0))
            self.timings[f"warmup_{'+'.join(fresh)}"] = time.monotonic() - t
            self._check_references(fresh)

    def _check_references(self, fresh: Sequence[str]) -> None:
        """--draft oracle: the first prompts' greedy outputs on these servers vs the oracle's references."""
        if self.args.draft != "oracle" or not fresh or self.dl.left() < 90:
            return
        t = time.monotonic()
        entries = self.oracle_entries
        found = check_references({v: self.servers[v].url for v in fresh}, entries, self.args.output_len,
                                 timeout=min(60.0, self.dl.left() - 60.0))
        self.timings[f"reference_check_{'+'.join(fresh)}"] = time.monotonic() - t
        self.meta["oracle"]["reference_check"].update(found)
        for v, r in found.items():
            if r["equal"] != r["checked"]:
                self.warn(f"{v}: {r['equal']}/{r['checked']} greedy outputs equal the oracle's references "
                          f"({r['errors']} errors; first difference [entry, position, got, expected] "
                          f"{r['first_diff']}): the drafts do not follow this server's tokens there")

    def _check_backends(self, fresh: Sequence[str]) -> None:
        """Warn when a server that just came up runs the other SSM backend than its name says."""
        for v in fresh:
            rings = ab.REPLAY_LOG_MARK in self.servers[v].log.read_text(errors="replace")
            if rings != (v == "replay_spec"):
                self.warn(f"{v}: its log {'shows' if rings else 'lacks'} {ab.REPLAY_LOG_MARK!r}: "
                          f"{'ReplaySSM is active' if rings else 'ReplaySSM may not be active'} there")

    def refresh_logs(self) -> None:
        """Pool sizes of every server and the replay server's verify plan, from their logs."""
        for v, s in self.servers.items():
            if s.log.exists():
                self.memory[v] = parse_memory_log(s.log.read_text(errors="replace"))
        replay = self.servers["replay_spec"].log
        if replay.exists():
            self.decisions = parse_heuristic_log(replay.read_text(errors="replace"))
        before = [self.memory.get(v, {}).get("avail_before_weights_gb") for v in SPEC_VARIANTS]
        if (None not in before and abs(before[0] - before[1]) > 1.0 and not self.unequal_warned
                and not self.args.one_gpu):
            self.unequal_warned = True
            self.warn(f"the spec servers found {before[0]:.2f} vs {before[1]:.2f} GB free before their weights: "
                      "their memory budgets are not equal")

    # -- benchmark runs

    def bench_one(self, s: _Server, c: int, n: int) -> tuple[dict, str]:
        """One bench_serving run; returns (result, its stdout)."""
        tag = f"{s.name}-c{c}"
        ofile = self.work / f"{tag}.jsonl"
        cmd = ab.bench_cmd(self.args, self.args.model_dir, s.port, c, n, ofile, tag)
        benv = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
                    SGLANG_PLUGINS="replayssm")
        log_from = s.log.stat().st_size if s.log.exists() else 0
        t = time.monotonic()
        profiler = self._profile_timer(s, tag)
        try:
            run = run_bench_serving(cmd, ofile, env=benv, cwd=self.work,
                                    timeout=min(self.dl.left() - ab.TEARDOWN_RESERVE_S, BENCH_TIMEOUT_S))
        finally:
            if profiler is not None:  # a request already in flight is waited for
                profiler[0].cancel()
                profiler[0].join(timeout=60.0)
        self.timings[f"bench_{tag}"] = time.monotonic() - t
        text = f"\n===== {tag}: {' '.join(cmd)}\n{run.text}"
        res = run.result
        if res is None:
            return {"error": f"bench_serving exit {run.rc}"}, text
        if run.rc != 0:
            self.warn(f"c={c} {s.name}: bench_serving exit {run.rc}, but its result was out: taken from its "
                      f"{run.source} (see bench_stdout.log)")
        res = {k: v for k, v in res.items() if k != "server_info"}
        if run.rc != 0:
            res["bench_exit"] = {"rc": run.rc, "result_from": run.source}
        res["server_log_decode"] = parse_decode_log(ab._read_from(s.log, log_from))
        if profiler is not None:
            res["step_profile"] = self._profile_result(s, profiler[1])
        return res, text

    def _profile_timer(self, s: _Server, tag: str) -> tuple[threading.Timer, dict] | None:
        """With ``--profile-steps``: a started timer that asks ``s`` to profile, ``--profile-delay`` s from
        now, its next forwards; the dict gets ``error`` if the request fails."""
        if self.args.profile_steps <= 0 or s.name not in SPEC_VARIANTS:
            return None
        with self.lock:
            self.profiles_taken += 1
            state: dict = {"id": f"{tag}-{self.profiles_taken}"}  # unique: a concurrency may repeat

        def fire() -> None:
            try:
                step_profile.start_profile(s.url, self.work / "profiles", state["id"], self.args.profile_steps)
                state["started"] = True
            except (OSError, RuntimeError, ValueError) as e:  # requests' errors are OSErrors
                state["error"] = f"/start_profile failed: {type(e).__name__}: {e}"

        timer = threading.Timer(self.args.profile_delay, fire)
        timer.daemon = True
        timer.start()
        return timer, state

    def _profile_result(self, s: _Server, state: dict) -> dict:
        """The summary of the run's trace, or why there is none (a trace that does not come stops the
        profiler, so that the next run's request is not refused as "already in progress")."""
        if not state.get("started"):
            return {"error": state.get("error", f"the run ended before --profile-delay "
                                                f"{self.args.profile_delay:g} s")}
        path = step_profile.wait_trace(step_profile.trace_path(self.work / "profiles", state["id"]),
                                       timeout=max(1.0, min(60.0, self.dl.left() - ab.TEARDOWN_RESERVE_S)))
        if path is None:
            with contextlib.suppress(OSError, RuntimeError):
                step_profile.stop_profile(s.url)
            return {"error": "no trace within 60 s (fewer than --profile-steps forwards left in the run?); "
                             "profiler stopped"}
        try:
            summary = step_profile.summarize(step_profile.load_events(path))
        except (OSError, EOFError, ValueError, KeyError, TypeError) as e:  # a cut or malformed trace
            return {"error": f"trace not readable: {type(e).__name__}: {e}", "trace": str(path)}
        summary["kernels"] = summary["kernels"][:40]
        return {"summary": summary, "trace": str(path)}

    def phase(self, names: Sequence[str], c: int, n: int) -> None:
        """bench_serving against these servers at once (they are on different GPUs); on one GPU one after
        another, in the order given."""
        names = [v for v in names if v in self.servers and self.servers[v].ready]
        if not names:
            return
        if self.args.one_gpu and len(names) > 1:
            for v in names:
                self.phase((v,), c, n)
            return
        if self.dl.left() - ab.TEARDOWN_RESERVE_S < MIN_RUN_S:
            for v in names:
                self.runs[c][v] = {"skipped": "time budget"}
            self.warn(f"c={c} {'+'.join(names)}: skipped (time budget)")
            return
        ex = cf.ThreadPoolExecutor(len(names))
        try:
            done = {v: ex.submit(self.bench_one, self.servers[v], c, n) for v in names}
            results = {v: f.result() for v, f in done.items()}
        finally:  # on SIGTERM do not wait here: the teardown stops the servers, which ends the runs
            ex.shutdown(wait=False)
        for v, (res, text) in results.items():
            self._record(v, c, n, res, text)

    def _record(self, v: str, c: int, n: int, res: dict, text: str) -> None:
        with open(self.out / "bench_stdout.log", "a") as fh:
            fh.write(text)
        self.runs[c][v] = res
        if "error" in res:
            self.warn(f"c={c} {v}: {res['error']} (see bench_stdout.log)")
            self.status = 1
            return
        with open(self.out / "bench_raw.jsonl", "a") as fh:
            fh.write(json.dumps({**res, "spec_variant": v, "spec_max_concurrency": c}) + "\n")
        if res.get("completed") != n:
            self.warn(f"c={c} {v}: {res.get('completed')}/{n} requests completed")
        log = res["server_log_decode"]
        _log(f"{v}-c{c}: {res.get('output_throughput') or 0:.1f} out tok/s, median TPOT "
             f"{res.get('median_tpot_ms') or 0:.2f} ms, accept len {ab._fmt(log['accept_len'], '.3f')}, "
             f"peak #running {log['peak_running']}, steady decode {ab._fmt(log['steady_tok_s'])} tok/s (log)")

    def stop(self) -> None:
        with contextlib.suppress(BaseException):
            _log("stopping servers")
            ab._stop_all({v: s.proc for v, s in self.servers.items() if s.proc is not None})


def nospec_order(concurrency: Sequence[int]) -> list[int]:
    """Stock without spec's concurrencies: c = 1 first (the c = 1 target needs it), then as given."""
    return sorted(concurrency, key=lambda c: c != 1)


def _run(session: _Session) -> None:
    """Models, servers, warm-ups; then every spec pair (both spec servers at once), then stock without spec.

    No run starts before all three servers are ready (or given up): a server still starting (weights,
    CUDA-graph capture) on the first GPU would slow stock spec's runs there and not replay spec's.
    """
    session.make_models()
    session.write_oracle()
    session.check_startup_fits()
    session.start()
    session.prepare(SPEC_VARIANTS, SPEC_READY_RESERVE_S)
    if "stock_nospec" not in session.servers:
        session.warn("stock without spec not started (--skip-nospec)")
    session.prepare(tuple(v for v in ("stock_nospec",) if v in session.servers), NOSPEC_READY_RESERVE_S)
    prompts = dict(zip(session.args.concurrency, session.args.num_prompts))
    for i, c in enumerate(session.args.concurrency):
        # one GPU: the pair one after the other, which one first alternating with the concurrency
        # (stock spec first unless --replay-first)
        session.phase(SPEC_VARIANTS[::-1] if (i + session.args.replay_first) % 2 else SPEC_VARIANTS, c,
                      prompts[c])
        session.write()
    for c in nospec_order(session.args.concurrency) if "stock_nospec" in session.servers else ():
        session.phase(("stock_nospec",), c, prompts[c])
        session.write()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 0, 1 if a step failed (the report says which), 2 if terminated."""
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"replayssm_spec_{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    for name in ("bench_raw.jsonl", "bench_stdout.log", "gen.log"):
        (out / name).write_text("")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, ab._on_signal)
    session = _Session(args, sys.argv[1:] if argv is None else argv, out, work)
    try:
        _run(session)
    except ab._Terminated as e:
        session.warn(f"terminated by {e}")
        session.status = 2
    except Exception as e:  # keep whatever was measured; the report still comes out
        session.warn(f"aborted: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        session.status = 1
    finally:
        ab.ignore_term_signals()  # let the teardown finish
        session.stop()
    session.refresh_logs()
    session.timings["total"] = session.dl.elapsed()
    report = session.write()
    print("\n" + report, flush=True)
    return session.status


if __name__ == "__main__":
    sys.exit(main())
