"""Replay verify or SGLang's snapshot verify: one choice per CUDA-graph batch bucket and draft length.

Speculative verify of ``T`` tokens can run two ways for a hybrid SSM layer:

- **snapshot** (SGLang 0.5.17 stock): the verify kernel reads the state ``S`` and writes one state
  per draft token into ``intermediate_ssm``; the commit copies the accepted one back into
  ``temporal`` (read + write ``S``): ``(3 + T)·S + T·I`` bytes per layer and request (math.md §11);
  as this plug-in runs it, a materialise call (our verify kernel over a one-token window on an
  empty ring: ``S + r + I``, ``r`` one full ring record) comes first: ``B_snap`` counts that too.
- **replay** (ours): read ``S`` and the fields of the ring history that the kernel reads, write
  ``T`` ring records, write ``S`` only on a flush step (a GDN flush row reads ``S`` twice: the fold
  launch, then the window launch); ``B_replay`` is the mean over the steady verify cycle at ``a = T``
  accepted tokens per step (``replay_verify_bytes``).

With a split-precision read copy (``--replayssm-read-dtype``: ``S_r`` bytes per slot and layer, fp8's
row scales included) our kernels read the copy instead of ``S`` on non-flush rows (the materialise
call's empty-ring row among them) and in a GDN flush row's window launch, and a flush row also writes
the refreshed copy; SGLang's snapshot verify and commit read ``S``, and the commit is followed by a
refresh of the copy from the committed checkpoint (``S + S_r``).

Both come from ``sglang_replayssm.byte_model``, the one byte model of the kernels (shared with the
benchmarks): ``*_replay_verify_bytes`` per step (``verify_read_copy_bytes`` with a copy),
``read_copy_refresh_bytes`` and ``verify_cycle`` for the steady cycle.

The replay path moves far fewer bytes, but does more arithmetic per byte and has the same launch
count, so it only pays where the snapshot path is **bandwidth-bound**.  The rule, per bucket (batch
size ``bs``) and ``T``:

1. tree drafts (``topk > 1``): snapshot (the chunkwise verify is valid for linear chains only);
2. ``--replayssm-verify replay`` / ``snapshot``: that path (the override);
3. otherwise (``auto``), from the times ``t_snap``, ``t_replay`` of one verify step of the whole
   bucket (all SSM layers) and the bytes ``B_snap``, ``B_replay`` the byte model says they move,
   the achieved bandwidth utilisation ``u = B / t / peak``:

   - ``u_snap < BANDWIDTH_BOUND`` (0.5): the snapshot path is latency/launch-bound; snapshot;
   - else replay iff ``t_replay * MIN_SPEEDUP <= t_snap`` (``MIN_SPEEDUP = 1.05``); else snapshot.

   The times come from a short timed probe on CUDA (``probe(bs, T) -> Timing``, supplied by the
   integration: ``verify_probe.VerifyProbe``, which times one layer of each path on the server's own
   pool, both commits once per forward, scales by the SSM layers, measures a few anchor buckets and
   interpolates the others, logging which).  Without a probe (CPU), or when the probe fails or
   returns unusable numbers, the times are predicted from the byte model alone:
   ``t = layers · launch_s + B / peak`` (the log line says ``source=byte-model`` and why).

Every decision is logged, one line per bucket, with the numbers behind it, and cached in a JSON
file keyed by device, shape, ``T``, bucket and versions (SGLang, sglang-replayssm, digests of the
kernels' and the plug-in's source, this rule), so a restart on the same GPU, model and code re-uses it without
probing.  Overrides and tree drafts are not cached (they need no probe).

Nothing here imports SGLang or touches a GPU unless a CUDA probe / ``cuda_device_profile`` is called.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from sglang_replayssm.byte_model import (
    GDNDims,
    Mamba2Dims,
    VerifyBytes,
    gdn_replay_verify_bytes,
    gdn_snapshot_commit_bytes,
    gdn_snapshot_verify_bytes,
    mamba2_replay_verify_bytes,
    mamba2_snapshot_commit_bytes,
    mamba2_snapshot_verify_bytes,
    read_copy_refresh_bytes,
    read_copy_size,
    verify_cycle,
    verify_read_copy_bytes,
)
from sglang_replayssm.config import VERIFY_MODES
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.sizing import ring_spec, verify_flush_limit

__all__ = [
    "BANDWIDTH_BOUND",
    "HEURISTIC_VERSION",
    "MIN_SPEEDUP",
    "VERIFY_MODES",
    "Decision",
    "DecisionCache",
    "DeviceProfile",
    "Timing",
    "VerifyShape",
    "check_verify_mode",
    "cpu_device_profile",
    "cuda_device_profile",
    "decide",
    "decide_buckets",
    "replay_verify_bytes",
    "snapshot_path_bytes",
    "snapshot_verify_bytes",
    "time_cuda",
    "verify_shape",
]

logger = logging.getLogger(__name__)

HEURISTIC_VERSION = 1
BANDWIDTH_BOUND = 0.5
"""Achieved / peak bandwidth of the snapshot path at or above which it counts as bandwidth-bound."""
MIN_SPEEDUP = 1.05
"""The replay path must be at least this much faster (measured or predicted) to be chosen."""
CACHE_ENV_VAR = "SGLANG_REPLAYSSM_VERIFY_CACHE"


# --------------------------------------------------------------------------------------------------
# Byte model (sglang_replayssm.byte_model, per layer and request)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyShape:
    """The per-layer shape the byte model needs, for one rank.

    Attributes
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"``.
    dims : Mamba2Dims or GDNDims
        The layer's per-rank heads and dims (``sglang_replayssm.byte_model``), of ``family``.
    state_bytes : int
        Bytes per element of the checkpoint (``temporal``).
    act_bytes : int
        Bytes per element of the activations (and of the records stored in their dtype).
    u_bytes : int or None
        Bytes per element of GDN's ``ring_u`` (``sizing.ring_spec``: fp32); ``None`` for Mamba-2.
    num_layers : int
        SSM layers on this rank.
    window : int
        Decode window ``L``.
    read_bytes : int or None
        Split precision: bytes per element of the read copy (2 for bf16 / fp16, 1 for fp8); ``None``
        (the default): no copy.
    read_scale_bytes : int
        Bytes of the copy's scale per state row (fp8: 4, one fp32 scale per row); 0 otherwise.
    variant : str
        What changes the replay kernels' cost beyond these sizes, or names it (the checkpoint's,
        activations' and read copy's dtypes, stochastic rounding; ``pool_verify_shape``): part of
        ``key`` so that a cached decision is not re-used across them; ``""`` (none) by default.
        ``key`` also holds ``read_bytes`` / ``read_scale_bytes``, so a copy is keyed even without a
        variant.  The byte model sees the copy through ``read_bytes`` / ``read_scale_bytes``, not
        through this.

    Raises
    ------
    ValueError
        ``dims`` not of ``family``, ``u_bytes`` missing for GDN, ``read_bytes`` below 1, or
        ``read_scale_bytes`` negative or given without a copy.
    """

    family: str
    dims: Mamba2Dims | GDNDims
    state_bytes: int
    act_bytes: int
    u_bytes: int | None = None
    num_layers: int
    window: int
    read_bytes: int | None = None
    read_scale_bytes: int = 0
    variant: str = ""

    def __post_init__(self) -> None:
        expected = {"mamba2": Mamba2Dims, "gdn": GDNDims}.get(self.family)
        if expected is None or not isinstance(self.dims, expected):
            raise ValueError(f"dims: expected {expected.__name__ if expected else 'a known family'} for family "
                             f"{self.family!r}, got {type(self.dims).__name__}")
        if self.family == "gdn" and self.u_bytes is None:
            raise ValueError("u_bytes: expected ring_u's element size for family 'gdn', got None")
        if self.read_bytes is not None and self.read_bytes < 1:
            raise ValueError(f"read_bytes: expected the read copy's element size >= 1 or None, got {self.read_bytes}")
        if self.read_scale_bytes < 0 or (self.read_scale_bytes and self.read_bytes is None):
            raise ValueError(f"read_scale_bytes: expected >= 0, and 0 without a read copy (read_bytes None), got "
                             f"{self.read_scale_bytes} with read_bytes {self.read_bytes}")

    def key(self) -> str:
        dims = ".".join(f"{f.name}{getattr(self.dims, f.name)}" for f in dataclasses.fields(self.dims))
        u = f":u{self.u_bytes}" if self.u_bytes is not None else ""
        # the copy's sizes are keyed themselves (not only through ``variant``, which a hand-built shape
        # may leave empty)
        read = "" if self.read_bytes is None else f":r{self.read_bytes}s{self.read_scale_bytes}"
        return (
            f"{self.family}:{dims}:s{self.state_bytes}:a{self.act_bytes}{u}{read}:layers{self.num_layers}"
            f":L{self.window}" + (f":{self.variant}" if self.variant else "")
        )

    @property
    def read_copy_bytes(self) -> int:
        """``S_r``: one slot's read copy in one layer, scales included (0 without a copy)."""
        if self.read_bytes is None:
            return 0
        return read_copy_size(self.dims, self.read_bytes, self.read_scale_bytes)

    def replay(self, num_tokens: int) -> VerifyBytes:
        """Our verify kernel's per-step model for ``T = num_tokens`` (with the read copy if any)."""
        if self.family == "mamba2":
            model = mamba2_replay_verify_bytes(self.dims, num_tokens, self.state_bytes, self.act_bytes)
        else:
            model = gdn_replay_verify_bytes(self.dims, num_tokens, self.state_bytes, self.act_bytes, self.u_bytes)
        if self.read_bytes is None:
            return model
        label = f"{8 * self.read_bytes}-bit" + (" + row scales" if self.read_scale_bytes else "")
        return verify_read_copy_bytes(model, self.read_copy_bytes, label)

    def snapshot(self, num_tokens: int) -> tuple[VerifyBytes, VerifyBytes]:
        """SGLang's snapshot verify and its commit, for ``T = num_tokens``."""
        verify, commit = ((mamba2_snapshot_verify_bytes, mamba2_snapshot_commit_bytes) if self.family == "mamba2"
                          else (gdn_snapshot_verify_bytes, gdn_snapshot_commit_bytes))
        return (verify(self.dims, num_tokens, self.state_bytes, self.act_bytes),
                commit(self.dims, num_tokens, self.state_bytes, self.act_bytes))


def verify_shape(
    *,
    family: str,
    temporal_shape: tuple[int, int, int],
    conv_dim: int,
    num_k_heads: int,
    num_layers: int,
    window: int,
    state_dtype: torch.dtype,
    act_dtype: torch.dtype,
) -> VerifyShape:
    """Build a ``VerifyShape`` from SGLang's per-rank state shape (as ``sizing.ring_spec`` takes it,
    which checks it and gives the ring's groups and ``u`` dtype)."""
    spec = ring_spec(
        family=family, temporal_shape=temporal_shape, conv_dim=conv_dim, num_k_heads=num_k_heads,
        num_layers=num_layers, window=window, act_dtype=act_dtype,
    )
    if family == "mamba2":
        h, p, n = temporal_shape
        dims, u_bytes = Mamba2Dims(H=h, P=p, N=n, G=spec.tensors["B"][0][0]), None
    else:
        hv, v, k = temporal_shape
        dims, u_bytes = GDNDims(HV=hv, Hk=num_k_heads, K=k, V=v), spec.tensors["u"][1].itemsize
    return VerifyShape(
        family=family, dims=dims, state_bytes=state_dtype.itemsize, act_bytes=act_dtype.itemsize,
        u_bytes=u_bytes, num_layers=num_layers, window=window,
    )


def snapshot_verify_bytes(shape: VerifyShape, num_tokens: int) -> float:
    """SGLang 0.5.17's snapshot verify + commit copy, per layer and request: ``(3 + T)·S + T·I``."""
    verify, commit = shape.snapshot(num_tokens)
    return verify.step().total + commit.step().total


def snapshot_path_bytes(shape: VerifyShape, num_tokens: int) -> float:
    """The plug-in's snapshot path, per layer and request: SGLang's (``snapshot_verify_bytes``) plus
    the materialise call before it (our verify kernel over a one-token window on an empty ring, which
    reads the checkpoint and one token and writes that token's record: ``S + r + I``), so
    ``(4 + T)·S + r + (T + 1)·I``.  What the probe times on that path, so the utilisation is taken
    over it.

    With a read copy (``S_r``): the materialise call's empty-ring row is a non-flush row, so it reads
    the copy (``S_r + r + I``), and after SGLang's commit the pool refreshes the rows' copies from
    their new checkpoints (``spec.py``'s commit, ``pool.refresh_read``: ``S + S_r``), so
    ``(4 + T)·S + 2·S_r + r + (T + 1)·I``.
    """
    materialise = shape.replay(1)
    path = snapshot_verify_bytes(shape, num_tokens) + materialise.step(0).total
    if shape.read_bytes is not None:
        path += read_copy_refresh_bytes(materialise.S, shape.read_copy_bytes).total
    return path


def replay_verify_bytes(shape: VerifyShape, num_tokens: int, accepted: int | None = None) -> float:
    """Replay verify, per layer and request: our kernel's bytes averaged over the steady verify cycle.

    With the flush rule the server runs, "flush when ``len + T > limit``" (the late rule's
    ``limit = max(L, T) + T``: ``sizing.verify_flush_limit``), and ``a`` accepted tokens per step, a
    flush leaves ``len = a`` and the history grows by ``a`` while ``len + T <= limit``
    (``verify_cycle``): ``F = floor(max(limit − T, 0)/a) + 1`` steps, the last flushing, mean history
    ``a·(F + 1)/2``.  Each step reads ``S`` (twice on a GDN flush row), the history's fields that the
    kernel reads, writes ``T`` records and ``S`` on the flush step, and moves ``T·I``.  With a read copy
    (``S_r``) non-flush rows read it instead of ``S``, a GDN flush row reads ``S + S_r`` (fold launch,
    then the window launch on the refreshed copy), and the flush step writes ``S + S_r``
    (``byte_model.verify_read_copy_bytes``).  ``a`` defaults to ``T`` (every draft accepted): the most
    frequent flushes.

    Raises
    ------
    ValueError
        ``a`` outside ``1 .. T``.
    """
    a = num_tokens if accepted is None else accepted
    limit = verify_flush_limit(shape.window, num_tokens)
    return shape.replay(num_tokens).cycle_mean(verify_cycle(limit, num_tokens, a))


# --------------------------------------------------------------------------------------------------
# Device and timings
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """What the rule needs to know of the device.

    Attributes
    ----------
    name : str
        Cache key part, e.g. ``"cuda:NVIDIA H200"`` or ``"cpu"``.
    kind : str
        ``"cuda"`` (timed probes allowed) or ``"cpu"`` (byte model only).
    peak_bytes_per_s : float
        Peak (copy) bandwidth: the denominator of the utilisation.
    launch_s : float
        Fixed cost per layer and verify step, used only when predicting times from the byte model.
    peak_source : str
        How ``peak_bytes_per_s`` was obtained (logged).
    """

    name: str
    kind: str
    peak_bytes_per_s: float
    launch_s: float
    peak_source: str


def cpu_device_profile(peak_bytes_per_s: float = 50e9, launch_s: float = 20e-6) -> DeviceProfile:
    """A nominal CPU profile (no measurement: decisions on CPU come from the byte model alone)."""
    return DeviceProfile(name="cpu", kind="cpu", peak_bytes_per_s=peak_bytes_per_s, launch_s=launch_s,
                         peak_source="nominal")


def time_cuda(fn: Callable[[], object], *, warmup: int = 3, iters: int = 10) -> float:
    """Mean seconds per call of ``fn`` on the current CUDA stream (CUDA events; syncs)."""
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def cuda_device_profile(device: torch.device | int | None = None, *, probe_bytes: int = 1 << 30,
                        launch_s: float = 5e-6) -> DeviceProfile:
    """Measure the device-to-device copy bandwidth of a CUDA device (``probe_bytes`` read + written)."""
    index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index or 0
    props = torch.cuda.get_device_properties(index)
    with torch.cuda.device(index):
        src = torch.empty(probe_bytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        seconds = time_cuda(lambda: dst.copy_(src))
        del src, dst
    return DeviceProfile(name=f"cuda:{props.name}", kind="cuda", peak_bytes_per_s=probe_bytes / seconds,
                         launch_s=launch_s, peak_source="measured copy")


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of one verify step of a whole bucket (all SSM layers), per path."""

    snapshot_s: float
    replay_s: float
    how: str = ""  # how the probe got them when not measured at this bucket (logged in ``source``)

    def usable(self) -> bool:
        return all(math.isfinite(t) and t > 0 for t in (self.snapshot_s, self.replay_s))


Probe = Callable[[int, int], Timing]
"""``probe(batch_size, num_tokens) -> Timing``: times both verify paths on the device (CUDA only)."""


# --------------------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """One bucket's choice and the numbers behind it."""

    batch_size: int
    num_tokens: int
    path: str  # "replay" or "snapshot"
    reason: str
    source: str  # "measured", "byte-model", "override", "tree", "cached ..."
    #: where the times come from ("measured ..." or "byte-model ..."); logged where ``source`` does
    #: not say it (an override or a tree draft decides without timing, so its times are the byte model's)
    times: str = ""
    snapshot_bytes: float
    replay_bytes: float
    snapshot_s: float
    replay_s: float
    snapshot_util: float
    replay_util: float

    def log_line(self) -> str:
        return (
            f"ReplaySSM verify bs={self.batch_size} T={self.num_tokens}: {self.path} ({self.reason}; "
            f"source={self.source}{self._times_note()}; snapshot {self.snapshot_bytes / 1e6:.3f} MB "
            f"{self.snapshot_s * 1e6:.1f} us util {self.snapshot_util:.2f}, replay "
            f"{self.replay_bytes / 1e6:.3f} MB {self.replay_s * 1e6:.1f} us util {self.replay_util:.2f})"
        )

    def _times_note(self) -> str:
        return f", times: {self.times}" if self.times and not self.source.endswith(self.times) else ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: Mapping) -> Decision:
        return cls(**fields)


def check_verify_mode(mode: str, topk: int) -> None:
    """Refuse (``ReplaySSMStartupError``) an unknown mode, or ``replay`` forced on tree drafts."""
    if mode not in VERIFY_MODES:
        raise ReplaySSMStartupError(
            f"--replayssm-verify: expected one of {', '.join(VERIFY_MODES)}, got {mode!r}"
        )
    if mode == "replay" and topk > 1:
        raise ReplaySSMStartupError(
            f"--replayssm-verify replay cannot serve tree drafts (--speculative-eagle-topk {topk} > 1): the "
            "chunkwise replay verify is valid for linear draft chains only; use auto or snapshot"
        )


def decide(
    batch_size: int,
    num_tokens: int,
    shape: VerifyShape,
    device: DeviceProfile,
    *,
    mode: str = "auto",
    topk: int = 1,
    timing: Timing | None = None,
    fallback_note: str = "",
) -> Decision:
    """Choose the verify path of one bucket (see the module docstring for the rule).

    Parameters
    ----------
    batch_size, num_tokens : int
        The CUDA-graph bucket ``bs`` and draft length ``T`` (tokens verified per request).
    shape, device : VerifyShape, DeviceProfile
    mode : str
        ``--replayssm-verify``.
    topk : int
        ``--speculative-eagle-topk``; ``> 1`` is a tree draft.
    timing : Timing, optional
        Measured times of both paths; ``None`` (or unusable numbers) predicts them from the byte model.
    fallback_note : str
        Why ``timing`` is missing (logged), e.g. ``"no CUDA"``.
    """
    check_verify_mode(mode, topk)
    if batch_size < 1 or num_tokens < 1:
        raise ValueError(f"expected batch_size >= 1 and num_tokens >= 1, got {batch_size}, {num_tokens}")
    scale = batch_size * shape.num_layers
    b_snap = snapshot_path_bytes(shape, num_tokens) * scale
    b_replay = replay_verify_bytes(shape, num_tokens) * scale
    if timing is not None and timing.usable():
        source = "measured" + (f" ({timing.how})" if timing.how else "")
        t_snap, t_replay = timing.snapshot_s, timing.replay_s
    else:
        if timing is not None:
            fallback_note = f"unusable probe times {timing.snapshot_s!r}/{timing.replay_s!r}"
        source = "byte-model" + (f" ({fallback_note})" if fallback_note else "")
        fixed = shape.num_layers * device.launch_s
        t_snap = fixed + b_snap / device.peak_bytes_per_s
        t_replay = fixed + b_replay / device.peak_bytes_per_s
    u_snap = b_snap / t_snap / device.peak_bytes_per_s
    u_replay = b_replay / t_replay / device.peak_bytes_per_s
    times = source

    if topk > 1:
        path, reason, source = "snapshot", f"tree drafts (topk={topk}) use the snapshot path", "tree"
    elif mode != "auto":
        path, reason, source = mode, f"override --replayssm-verify {mode}", "override"
    elif u_snap < BANDWIDTH_BOUND:
        path = "snapshot"
        reason = f"snapshot path not bandwidth-bound (util {u_snap:.2f} < {BANDWIDTH_BOUND})"
    elif t_replay * MIN_SPEEDUP <= t_snap:
        path = "replay"
        reason = (f"snapshot path bandwidth-bound (util {u_snap:.2f} >= {BANDWIDTH_BOUND}) and replay "
                  f"{t_snap / t_replay:.2f}x faster")
    else:
        path = "snapshot"
        reason = (f"replay not faster enough ({t_snap / t_replay:.2f}x < {MIN_SPEEDUP}x) although the "
                  f"snapshot path is bandwidth-bound (util {u_snap:.2f})")
    return Decision(
        batch_size=batch_size, num_tokens=num_tokens, path=path, reason=reason, source=source, times=times,
        snapshot_bytes=b_snap, replay_bytes=b_replay, snapshot_s=t_snap, replay_s=t_replay,
        snapshot_util=u_snap, replay_util=u_replay,
    )


# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------


def source_digest(root: str | os.PathLike) -> str:
    """First 12 hex digits of a SHA-256 over every ``*.py`` file under ``root`` (relative path and
    bytes, in sorted order): it changes whenever the kernels' code does, even where the package
    version does not (an editable install between releases)."""
    h = hashlib.sha256()
    base = Path(root)
    for f in sorted(base.rglob("*.py")):
        h.update(f.relative_to(base).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _versions() -> str:
    import replayssm_kernels

    from sglang_replayssm import __version__

    try:
        from importlib.metadata import version

        sglang_version = version("sglang")
    except Exception:  # noqa: BLE001 -- a missing distribution only weakens the key
        sglang_version = "unknown"
    kernels = source_digest(Path(replayssm_kernels.__file__).parent)
    # the plug-in's own code too: the probe and the verify / commit paths it times live there
    plugin = source_digest(Path(__file__).parent)
    return (f"sglang{sglang_version}:replayssm{__version__}:kernels{kernels}:plugin{plugin}"
            f":rule{HEURISTIC_VERSION}")


def default_cache_path() -> Path:
    """``$SGLANG_REPLAYSSM_VERIFY_CACHE``, else ``~/.cache/sglang_replayssm/verify_decisions.json``."""
    value = os.environ.get(CACHE_ENV_VAR)
    if value:
        return Path(value)
    return Path.home() / ".cache" / "sglang_replayssm" / "verify_decisions.json"


class DecisionCache:
    """Decisions of ``auto`` mode in a JSON file, keyed by device, shape, T, bucket and versions.

    An unreadable or malformed file is treated as empty (and rewritten); writes are atomic.
    """

    def __init__(self, path: str | os.PathLike, versions: str | None = None) -> None:
        self.path = Path(path)
        self.versions = _versions() if versions is None else versions

    def key(self, device: DeviceProfile, shape: VerifyShape, batch_size: int, num_tokens: int) -> str:
        return f"{device.name}|{shape.key()}|T{num_tokens}|bs{batch_size}|{self.versions}"

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Decision | None:
        fields = self._read().get(key)
        if not isinstance(fields, dict):
            return None
        try:
            return Decision.from_json(fields)
        except TypeError:
            return None

    def put_many(self, entries: Mapping[str, Decision]) -> None:
        """Add ``entries`` to the file (atomic replace); raises ``OSError`` where it cannot be written."""
        data = self._read()
        data.update({key: decision.to_json() for key, decision in entries.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def decide_buckets(
    buckets: Iterable[int],
    num_tokens: int,
    shape: VerifyShape,
    device: DeviceProfile,
    *,
    mode: str = "auto",
    topk: int = 1,
    probe: Probe | None = None,
    cache: DecisionCache | None = None,
    log: logging.Logger | None = logger,
) -> dict[int, Decision]:
    """Decide every bucket, logging one line each (``log`` None: no lines, for decisions a caller
    replaces before they are final); re-use and fill ``cache`` in ``auto`` mode.

    The probe runs only when ``device.kind == "cuda"``; on CPU the byte model decides and the log says
    so.  A probe that raises falls back to the byte model for that bucket (logged, not cached).
    """
    check_verify_mode(mode, topk)
    if topk > 1 and log is not None:
        log.info("ReplaySSM verify: tree drafts (--speculative-eagle-topk %d > 1) go to SGLang's snapshot "
                 "verify for every bucket", topk)
    decisions: dict[int, Decision] = {}
    fresh: dict[str, Decision] = {}
    cacheable = mode == "auto" and topk <= 1
    for bs in sorted(set(buckets)):
        key = cache.key(device, shape, bs, num_tokens) if cache is not None else None
        cached = cache.get(key) if cacheable and cache is not None else None
        if cached is not None:
            decision = dataclasses.replace(cached, source=f"cached {cached.source}")
        else:
            timing, note, store = None, "", cacheable
            if not cacheable:
                pass
            elif device.kind != "cuda":
                note = "no CUDA: byte model only"
            elif probe is None:
                note = "no probe"
            else:
                try:
                    timing = probe(bs, num_tokens)
                except Exception as exc:  # noqa: BLE001 -- any probe failure falls back, logged
                    note, store = f"probe failed: {type(exc).__name__}: {exc}", False
                else:  # times scaled past the pool's capacity hold for this pool only: not cached
                    store = not timing.how.startswith("extrapolated")
            decision = decide(bs, num_tokens, shape, device, mode=mode, topk=topk, timing=timing,
                              fallback_note=note)
            # CUDA: only measured decisions are cached (a later start probes again); CPU: byte model.
            if store and key is not None and (decision.source.startswith("measured") or device.kind != "cuda"):
                fresh[key] = decision
        decisions[bs] = decision
        if log is not None:
            log.info("%s", decision.log_line())
    if cache is not None and fresh:
        try:
            cache.put_many(fresh)
        except OSError as exc:  # the decisions stand; only their reuse by a later start is lost
            (log or logger).warning("ReplaySSM verify: decisions not cached (%s: %s); the next start decides again",
                                    type(exc).__name__, exc)
    return decisions
