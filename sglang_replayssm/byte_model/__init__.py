"""Byte model: bytes each of our kernels and SGLang 0.5.17's peers moves through device memory.

One model for everything that counts bytes: the benchmarks' bandwidth columns
(``benchmarks/bytes_model.py`` builds math.md §11's closed forms and its reports on it) and the
serving plug-in's verify-path heuristic (``sglang_replayssm.heuristic``: its byte-model fallback and
logged utilisation). It was audited against the Triton interpreter's unique loads and stores per
launch. Plain Python: it imports neither SGLang, torch nor Triton, so the benchmark CLIs can import it
before they decide on ``TRITON_INTERPRET`` (``import replayssm_kernels`` defines every Triton kernel,
and each reads that variable once, when defined); the record layouts it counts are
kernels/README.md's ("Records").

Units and arguments
-------------------
Bytes per layer, per request, per step, on one tensor-parallel rank. Shapes are ``Mamba2Dims``
``(H, P, N, G)`` or ``GDNDims`` ``(HV, Hk, K, V)`` (head counts after sharding; any object with
these attributes works). Dtypes are element sizes in bytes: ``state_bytes`` (checkpoint: 4 fp32,
2 fp16 / bf16), ``act_bytes`` (activations), ``u_bytes`` (GDN ``ring_u``: fp32 in serving).

- decode (``decode.py``, ``KernelBytes``): phase ``w`` = ``ring_len`` at the step (records already
  in the ring); a ring of window ``L`` cycles through ``w = 0 .. L-1``, the step at ``w = L-1`` (or
  a forced one) flushes;
- verify (``verify.py``, ``VerifyBytes``): ``T`` tokens per request, committed history ``h`` and
  the flush flag; ``verify_cycle(L, T, a)`` gives the steady cycle of ``(h, flush)`` at ``a``
  accepted tokens per step.

What is counted (unique bytes, each read or written once):

- state: ``S`` read every step; ``S`` written on flush steps only (the baselines write it every step);
- ring: the record fields that the phase reads (kernels/README.md, "Records"), and the records a
  step appends;
- I/O: this step's activations in and the output out (math.md's ``I``).

What is left out (all < 0.01% at the real shapes, and identical across schemes where they apply):

- per-layer parameters (``A``, ``D``, ``dt_bias``, ``A_log``): a few hundred bytes per layer, shared
  by the whole batch;
- per-row slot indices and cursors (``slot_idx``, ``ring_start``, ``ring_len``, ``flush``: 13 B/row);
- the conv window (math.md §10: the same in every scheme);
- re-reads that hit L2 (B shared by the H/G heads of a group, q/k shared by HV/Hk value heads,
  SGLang's built-in decode kernel reading its S0 tile twice on a flush, in one program): counted
  once.  A re-read by a later launch (the GDN verifies' flush rows: the fold launch writes ``S``,
  the next launch reads it again, after the whole batch's stores) is counted.

A split-precision read copy (``read_copy.py``): non-flush rows read the copy's ``S_r`` bytes instead
of ``S``, flush rows also write the refreshed copy (and a second launch on a flush row reads the copy),
and a refresh outside the kernels reads ``S`` and writes ``S_r``; ``benchmarks/bytes_read_copy.py``
re-exports it.
"""

from sglang_replayssm.byte_model.decode import (
    gdn_builtin_replay_bytes,
    gdn_packed_decode_bytes,
    gdn_replay_bytes,
    mamba2_replay_bytes,
    selective_state_update_bytes,
)
from sglang_replayssm.byte_model.read_copy import (
    READ_COPY_BYTES,
    READ_COPY_SCALE_BYTES,
    ReadCopyKernelBytes,
    ReadCopyVerifyBytes,
    gdn_read_copy_bytes,
    mamba2_read_copy_bytes,
    read_copy_bytes,
    read_copy_refresh_bytes,
    read_copy_size,
    verify_read_copy_bytes,
)
from sglang_replayssm.byte_model.sizes import GDNDims, Mamba2Dims, Sizes, gdn_record_fields, gdn_sizes, mamba2_sizes
from sglang_replayssm.byte_model.steps import KernelBytes, StepBytes, VerifyBytes, verify_cycle
from sglang_replayssm.byte_model.verify import (
    gdn_builtin_fold_step_bytes,
    gdn_builtin_spec_verify_bytes,
    gdn_replay_verify_bytes,
    gdn_snapshot_commit_bytes,
    gdn_snapshot_verify_bytes,
    mamba2_replay_verify_bytes,
    mamba2_snapshot_commit_bytes,
    mamba2_snapshot_verify_bytes,
)

__all__ = [
    "READ_COPY_BYTES",
    "READ_COPY_SCALE_BYTES",
    "GDNDims",
    "KernelBytes",
    "Mamba2Dims",
    "ReadCopyKernelBytes",
    "ReadCopyVerifyBytes",
    "Sizes",
    "StepBytes",
    "VerifyBytes",
    "gdn_builtin_fold_step_bytes",
    "gdn_builtin_replay_bytes",
    "gdn_builtin_spec_verify_bytes",
    "gdn_packed_decode_bytes",
    "gdn_read_copy_bytes",
    "gdn_record_fields",
    "gdn_replay_bytes",
    "gdn_replay_verify_bytes",
    "gdn_sizes",
    "gdn_snapshot_commit_bytes",
    "gdn_snapshot_verify_bytes",
    "mamba2_read_copy_bytes",
    "mamba2_replay_bytes",
    "mamba2_replay_verify_bytes",
    "mamba2_sizes",
    "mamba2_snapshot_commit_bytes",
    "mamba2_snapshot_verify_bytes",
    "read_copy_bytes",
    "read_copy_refresh_bytes",
    "read_copy_size",
    "selective_state_update_bytes",
    "verify_cycle",
    "verify_read_copy_bytes",
]
