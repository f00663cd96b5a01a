"""The teacher-forcing logit processor of ``benchmarks/kl_teacher_forced.py``, run inside SGLang servers.

SGLang 0.5.17 (``--enable-custom-logit-processor``) deserialises a ``CustomLogitProcessor`` sent with
a request (``CustomLogitProcessor.to_str()``: ``dill`` of the class, which pickles a class of an
importable module *by reference*) and calls it in the scheduler process, inside
``Sampler._preprocess_logits``, on the request's row of the next-token logits, **before** greedy
argmax and before the returned logprobs are computed.  So the processor itself has to take the
distribution; the logprobs a server returns describe the forced row, not the model.

Per request, per sampling step ``t`` (``t = len(req.output_ids)``: the tokens already appended; with
``--disable-overlap-schedule`` every step's result is processed before the next batch is sampled, so
``t`` is exact; the CLI asserts the returned tokens equal the forced ones and every step was seen
once):

- ``mode == "reference"``: one device-to-host copy of the fp32 logits row (what SGLang's sampler
  sees: ``LogitsProcessor`` hands it fp32 logits cut to ``vocab_size``) into row ``t`` of the
  file-backed ``logits.f32 [n, vocab]``; its argmax into ``tokens.i64[t]``;
- ``mode == "compare"``: the same copy, then ``KL(ref || run) = sum_v p_ref (logp_ref - logp_run)``
  against the reference's row ``t`` into ``kl.f64[t]``, both ``log_softmax`` in float64 on the host
  (fp32 log-probabilities of magnitude ~10 carry rounding of ~1e-6 each, which put a floor of ~1e-7
  nats under the KL estimate: measured on the tiny model, where the true KL of ReplaySSM's fp32 path
  is far below it); and the run's own argmax into ``argmax.i64[t]``;
- in both modes the row is then forced: ``-inf`` everywhere but the forced token (the reference's
  own argmax; in compare mode the reference's token at ``t``), so every configuration decodes the
  same sequence, and ``hits.i32[t] += 1``.

The server must be able to import this module (``benchmarks`` on its ``PYTHONPATH``; the CLI sets
that).  An error inside the processor is appended to ``error.txt`` in the run's folder and leaves the
row unforced (the server keeps running; the CLI then reports the error and the token mismatch).

This module imports only numpy, torch and SGLang's ``CustomLogitProcessor``.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

__all__ = ["MODES", "RunFiles", "TeacherForcedKL", "create_run_files", "kl_row", "log_softmax64", "open_run_files",
           "read_error"]

MODES = ("reference", "compare")
#: file name -> numpy dtype; ``logits`` is [n, vocab], the others [n]
_REFERENCE_FILES = {"logits.f32": np.float32, "tokens.i64": np.int64, "hits.i32": np.int32}
_COMPARE_FILES = {"kl.f64": np.float64, "argmax.i64": np.int64, "hits.i32": np.int32}
ERROR_FILE = "error.txt"


@dataclass
class RunFiles:
    """The memory-mapped arrays of one run (a reference or a compared configuration).

    Attributes
    ----------
    mode : str
        ``"reference"`` or ``"compare"``.
    hits : np.memmap
        ``[n] int32``: how often the processor saw step ``t`` (1 each when the step index is right).
    logits : np.memmap or None
        Reference: ``[n, vocab] float32`` logits rows (written).  Compare: the reference's rows
        (read only).
    tokens : np.memmap or None
        ``[n] int64``: the reference's greedy tokens (written by the reference, read by compare).
    kl : np.memmap or None
        Compare only: ``[n] float64`` ``KL(ref || run)`` per step, NaN until written.
    argmax : np.memmap or None
        Compare only: ``[n] int64`` the run's own greedy token per step, -1 until written.
    """

    mode: str
    hits: np.memmap
    logits: np.memmap | None = None
    tokens: np.memmap | None = None
    kl: np.memmap | None = None
    argmax: np.memmap | None = None


def create_run_files(mode: str, run_dir: str | Path, n_tokens: int, vocab: int) -> None:
    """Create (or reset) the files of one run, before its request is sent.

    Parameters
    ----------
    mode : str
        ``"reference"`` or ``"compare"``.
    run_dir : str or Path
        The run's folder (created).  A reference's ``logits.f32`` is ``n_tokens x vocab x 4`` bytes
        (sparse until written).
    n_tokens, vocab : int
        Decode steps and vocabulary size, both >= 1.

    Raises
    ------
    ValueError
        On an unknown mode or a non-positive size.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if n_tokens < 1 or vocab < 1:
        raise ValueError(f"n_tokens and vocab: expected >= 1, got {n_tokens}, {vocab}")
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / ERROR_FILE).unlink(missing_ok=True)
    files = _REFERENCE_FILES if mode == "reference" else _COMPARE_FILES
    fill = {"kl.f64": np.nan, "argmax.i64": -1, "tokens.i64": -1, "hits.i32": 0}
    for name, dtype in files.items():
        shape = (n_tokens, vocab) if name == "logits.f32" else (n_tokens,)
        mm = np.memmap(d / name, dtype=dtype, mode="w+", shape=shape)
        if name in fill:
            mm[:] = fill[name]
        mm.flush()
        del mm


def open_run_files(mode: str, run_dir: str | Path, n_tokens: int, vocab: int,
                   ref_dir: str | Path | None = None, *, writable: bool = True) -> RunFiles:
    """Map the files of one run (made by ``create_run_files``).

    Parameters
    ----------
    mode : str
        ``"reference"`` or ``"compare"``.
    run_dir : str or Path
        The run's folder.
    n_tokens, vocab : int
        As given to ``create_run_files``.
    ref_dir : str or Path, optional
        Compare mode: the reference run's folder (its ``logits.f32`` and ``tokens.i64`` are mapped
        read-only).
    writable : bool
        Map the run's own files for writing (the processor) or read-only (the CLI reading results).

    Returns
    -------
    RunFiles
    """
    d = Path(run_dir)
    own = "r+" if writable else "r"
    hits = np.memmap(d / "hits.i32", dtype=np.int32, mode=own, shape=(n_tokens,))
    if mode == "reference":
        return RunFiles(mode, hits,
                        logits=np.memmap(d / "logits.f32", dtype=np.float32, mode=own, shape=(n_tokens, vocab)),
                        tokens=np.memmap(d / "tokens.i64", dtype=np.int64, mode=own, shape=(n_tokens,)))
    if mode != "compare":
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if ref_dir is None:
        raise ValueError("compare mode needs ref_dir (the reference run's folder)")
    r = Path(ref_dir)
    return RunFiles(mode, hits,
                    logits=np.memmap(r / "logits.f32", dtype=np.float32, mode="r", shape=(n_tokens, vocab)),
                    tokens=np.memmap(r / "tokens.i64", dtype=np.int64, mode="r", shape=(n_tokens,)),
                    kl=np.memmap(d / "kl.f64", dtype=np.float64, mode=own, shape=(n_tokens,)),
                    argmax=np.memmap(d / "argmax.i64", dtype=np.int64, mode=own, shape=(n_tokens,)))


def read_error(run_dir: str | Path) -> str | None:
    """The processor's error text for a run, or None if it recorded none."""
    p = Path(run_dir) / ERROR_FILE
    return p.read_text() if p.exists() else None


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """``log_softmax`` of a ``[vocab]`` row in float64 (``-inf`` logits give ``-inf``)."""
    x = logits.astype(np.float64)
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def kl_row(ref_logits: np.ndarray, run_logits: np.ndarray) -> float:
    """``KL(ref || run) = sum_v p_ref (logp_ref - logp_run)`` from two logits rows, in float64.

    Parameters
    ----------
    ref_logits, run_logits : np.ndarray
        ``[vocab]`` logits (any float dtype); terms with ``p_ref = 0`` count 0.

    Returns
    -------
    float
        In nats; ``inf`` where the run gives ``-inf`` to a token the reference does not.  Identical
        rows give exactly 0; otherwise rounding leaves at most ~1e-16 below the true value.
    """
    lr, lq = log_softmax64(ref_logits), log_softmax64(run_logits)
    p = np.exp(lr)
    with np.errstate(invalid="ignore"):
        terms = p * (lr - lq)
    return float(np.sum(np.where(p > 0, terms, 0.0)))


# Maps opened in this (scheduler) process, by run folder: one open per run, not per step.
_OPEN: dict[tuple, RunFiles] = {}


def _files_for(params: dict[str, Any]) -> RunFiles:
    key = (params["kl_mode"], params["kl_dir"], int(params["kl_tokens"]), int(params["kl_vocab"]),
           params.get("kl_ref_dir"))
    files = _OPEN.get(key)
    if files is None:
        files = open_run_files(key[0], key[1], key[2], key[3], key[4])
        _OPEN[key] = files
    return files


def _step(row: torch.Tensor, params: dict[str, Any]) -> None:
    """Record one step of one request and force its row in place."""
    files = _files_for(params)
    t = len(params["__req__"].output_ids)
    n, vocab = files.hits.shape[0], int(params["kl_vocab"])
    if t >= n:
        raise IndexError(f"step {t} >= --tokens {n}: more sampling steps than max_new_tokens")
    if row.shape[-1] != vocab:
        raise ValueError(f"logits row has {row.shape[-1]} entries, the run files {vocab} (the config's vocab_size)")
    # One device-to-host copy of the fp32 row; the rest runs on the host.
    host = row.float().cpu().numpy()
    if files.mode == "reference":
        token = int(np.argmax(host))
        files.logits[t] = host
        files.tokens[t] = token
    else:
        token = int(files.tokens[t])
        if token < 0:
            raise ValueError(f"the reference has no token at step {t} (its run did not reach it)")
        files.kl[t] = kl_row(files.logits[t], host)
        files.argmax[t] = int(np.argmax(host))
    files.hits[t] += 1
    row.fill_(float("-inf"))
    row[token] = 0.0


class TeacherForcedKL(CustomLogitProcessor):
    """Take each step's logits, then force the reference's token (see the module docstring).

    ``custom_params`` per request: ``kl_mode`` (``"reference"`` / ``"compare"``), ``kl_dir`` (this
    run's folder), ``kl_ref_dir`` (compare: the reference's folder), ``kl_tokens`` (``n``),
    ``kl_vocab``.  Rows without ``kl_mode`` are returned untouched.
    """

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any] | None] | None = None
                 ) -> torch.Tensor:
        for i, params in enumerate(custom_param_list or []):
            if not params or params.get("kl_mode") is None:
                continue
            try:
                _step(logits[i], params)
            except Exception:
                with open(Path(params["kl_dir"]) / ERROR_FILE, "a") as fh:
                    fh.write(traceback.format_exc())
        return logits
