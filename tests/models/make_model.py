"""Tiny hybrid-SSM test models: config + deterministic weights + a local tokenizer.

``materialize(name, out_dir)`` writes a complete model directory that ``sglang.launch_server
--model-path out_dir`` and ``sglang.bench_serving --tokenizer out_dir`` load with no hub access:

- ``config.json`` from ``tests/models/<name>/config.json``;
- ``model.safetensors`` with weights drawn from a fixed seed at **realistic scales** (unit-RMS
  activations, sharp logits, SSM decays that keep a memory of tens of tokens).  SGLang's
  ``--load-format dummy`` draws every tensor from uniform(+-1e-3), which gives near-uniform logits
  whose greedy argmax is decided by rounding noise, useless for equality tests;
- ``tokenizer.json`` / ``tokenizer_config.json``: a word-level tokenizer over the model's vocab
  (``w0 .. wN`` plus 4 specials) built with the ``tokenizers`` package, so that decoding random ids
  and re-encoding the text gives the ids back (what ``--dataset-name random-ids`` does).

Checkpoint names follow the Hugging Face layout each SGLang loader expects.  Trap: transformers 5.12
``save_pretrained`` would name the Nemotron-H embedding ``backbone.embedding.weight``, which SGLang
silently ignores (``Parameter model.embedding.weight not found``; every output token is then 0).  We
write ``backbone.embeddings.weight`` ourselves.

Shape-faithful presets for serving benchmarks (``benchmarks/bench_serving_ab.py``), same generator:
``nemotron_h_nano4b`` (Nemotron-3-Nano-4B-like: 42 layers, 21 Mamba-2 layers of 96 heads x 80 x 128,
8 groups, 4 attention + 17 MLP layers, hidden 3136), ``qwen3_next_4b`` (Qwen3.5-4B-like GDN shapes,
24 GDN layers of HV=32 / Hk=16 / K=V=128 + 8 gated-attention layers, in SGLang's Qwen3-Next
architecture, which has MoE MLPs only: 4 experts all active + a shared one, as wide as Qwen3.5-4B's
dense 9216) and ``qwen3_5_4b`` (the same in SGLang's dense ``Qwen3_5ForCausalLM``).  About 4 B
parameters each: build them on a GPU, ``materialize(name, out, dtype=torch.bfloat16, device="cuda")``.

Echo variant (``materialize(..., echo=True)``, script flag ``--echo``; issue 6's controlled-acceptance
spec benchmark): the same tensors, shapes and bytes, but greedy decoding is robust to numerical noise.
Every residual branch's output projection (Mamba-2 / GDN ``out_proj``, attention ``o_proj``, every MLP
and expert ``down_proj``) is scaled by ``ECHO_BRANCH_SCALE``, so the final hidden state is the current
token's embedding plus a small residual, and the LM head is the embedding table re-indexed by
``echo_next``: row ``echo_next(x)`` is ``ECHO_LOGIT / hidden_size`` x embedding ``x`` (specials
``0..3`` never win).  The next token is therefore ``echo_next(current token)`` with a logit of about
``ECHO_LOGIT`` against a largest wrong logit of a few units (margin > 15 at hidden 128 and 3136),
far above bf16 noise (ulp 0.125 at 30).  Every layer still runs on unit-RMS inputs (the norms see
the embedding), and every weight is at most as large as the plain preset's (nothing overflows).

Run as a script: ``python tests/models/make_model.py nemotron_h_tiny /tmp/nh [--echo]``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import torch

__all__ = ["MODELS", "ECHO_BRANCH_SCALE", "ECHO_LOGIT", "materialize", "build_tokenizer", "echo_next",
           "echo_continuation"]

HERE = Path(__file__).resolve().parent
MODELS = ("nemotron_h_tiny", "qwen3_next_tiny", "qwen3_5_tiny", "llama_tiny", "nemotron_h_nano4b", "qwen3_next_4b",
          "qwen3_5_4b")
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
#: echo variant: residual branches' output projections x this; the echo token's logit (about)
ECHO_BRANCH_SCALE = 0.05
ECHO_LOGIT = 30.0


# ----------------------------------------------------------------------------- tokenizer


def build_tokenizer(vocab_size: int, out_dir: Path) -> None:
    """Write a word-level ``tokenizer.json`` with exactly ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for i in range(len(SPECIALS), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "pad_token": "<pad>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
                "add_bos_token": False,
                "add_eos_token": False,
            },
            indent=1,
        )
    )
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )


# ----------------------------------------------------------------------------- weights


class _Gen:
    """Deterministic tensors at chosen scales (fp32, fixed seed per model; CPU unless ``device`` says).

    The stream depends on the device: the same seed gives other (equally deterministic) weights on CUDA.
    """

    def __init__(self, seed: int, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.g = torch.Generator(device=self.device).manual_seed(seed)

    def normal(self, *shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g, device=self.device) * std

    def uniform(self, *shape: int, lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(*shape, generator=self.g, device=self.device)

    def linear(self, out_f: int, in_f: int, gain: float = 1.0) -> torch.Tensor:
        return self.normal(out_f, in_f, std=gain / math.sqrt(in_f))

    def norm(self, n: int) -> torch.Tensor:
        return 1.0 + self.normal(n, std=0.05)


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def _nemotron_h_weights(cfg: dict, gen: _Gen) -> dict[str, torch.Tensor]:
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    h, p, n, g = cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["ssm_state_size"], cfg["mamba_n_groups"]
    k = cfg["conv_kernel"]
    inner = h * p
    conv_dim = inner + 2 * g * n
    w: dict[str, torch.Tensor] = {
        "backbone.embeddings.weight": gen.normal(v, d, std=1.0),
        "backbone.norm_f.weight": gen.norm(d),
        # logits with std ~3: greedy decisions are far from rounding noise
        "lm_head.weight": gen.linear(v, d, gain=3.0),
    }
    pattern = cfg["hybrid_override_pattern"]
    for i, kind in enumerate(pattern):
        pre = f"backbone.layers.{i}"
        w[f"{pre}.norm.weight"] = gen.norm(d)
        if kind == "M":
            in_proj = torch.cat(
                [
                    gen.linear(inner, d),  # gate z
                    gen.linear(conv_dim, d),  # x, B, C (pre-conv)
                    gen.linear(h, d, gain=0.5),  # raw dt: small, the bias sets the scale
                ]
            )
            w[f"{pre}.mixer.in_proj.weight"] = in_proj
            w[f"{pre}.mixer.conv1d.weight"] = gen.normal(conv_dim, 1, k, std=0.6 / math.sqrt(k))
            w[f"{pre}.mixer.conv1d.bias"] = gen.normal(conv_dim, std=0.1)
            # decay per token exp(A*dt) in ~[0.75, 0.99]: memory of tens of tokens, so the ring matters
            w[f"{pre}.mixer.A_log"] = torch.log(gen.uniform(h, lo=0.5, hi=4.0))
            w[f"{pre}.mixer.dt_bias"] = _inv_softplus(gen.uniform(h, lo=0.01, hi=0.08))
            w[f"{pre}.mixer.D"] = gen.uniform(h, lo=0.5, hi=1.5)
            w[f"{pre}.mixer.norm.weight"] = gen.norm(inner)
            w[f"{pre}.mixer.out_proj.weight"] = gen.linear(d, inner, gain=0.5)
        elif kind == "*":
            nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            w[f"{pre}.mixer.q_proj.weight"] = gen.linear(nh * hd, d)
            w[f"{pre}.mixer.k_proj.weight"] = gen.linear(nkv * hd, d)
            w[f"{pre}.mixer.v_proj.weight"] = gen.linear(nkv * hd, d)
            w[f"{pre}.mixer.o_proj.weight"] = gen.linear(d, nh * hd, gain=0.5)
        elif kind == "-":
            f = cfg["intermediate_size"]
            w[f"{pre}.mixer.up_proj.weight"] = gen.linear(f, d)
            w[f"{pre}.mixer.down_proj.weight"] = gen.linear(d, f, gain=0.5)
        else:
            raise ValueError(f"layer kind {kind!r} not supported by the tiny generator")
    return w


def _pack_qkvzba(
    qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, hk: int, dk: int, dv: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's packed in-projections: per key head ``[q | k | v (r heads) | z (r heads)]`` and
    ``[b (r) | a (r)]``, ``r = HV / Hk``, from ``qkv = [all q | all k | all v]``, ``z``, ``b``, ``a``."""
    d = qkv.shape[1]
    q, k, v = torch.split(qkv, [hk * dk, hk * dk, z.shape[0]], dim=0)
    r = z.shape[0] // (hk * dv)
    qkvz = torch.cat(
        [q.view(hk, dk, d), k.view(hk, dk, d), v.view(hk, r * dv, d), z.view(hk, r * dv, d)], dim=1
    ).reshape(-1, d)
    ba = torch.cat([b.view(hk, r, d), a.view(hk, r, d)], dim=1).reshape(-1, d)
    return qkvz, ba


def _qwen3_next_weights(cfg: dict, gen: _Gen) -> dict[str, torch.Tensor]:
    """Qwen3-Next (GDN + gated full attention, MoE MLP), in Qwen3-Next's checkpoint layout.

    The GDN in-projections are the packed ``in_proj_qkvz`` / ``in_proj_ba`` of the released Qwen3-Next
    checkpoints (``_pack_qkvzba``).  SGLang 0.5.17 cannot load the split names ``in_proj_qkv`` /
    ``in_proj_z`` for ``Qwen3NextForCausalLM`` with unquantized weights: its stacked mapping passes the
    shard id ``(0, 1, 2)``, which ``MergedColumnParallelLinear.weight_loader`` refuses
    (``NotImplementedError: Shard id with multiple indices``).
    """
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    kconv = cfg["linear_conv_kernel_dim"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    ne, fe, fs = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    key_dim, value_dim = hk * dk, hv * dv
    conv_dim = 2 * key_dim + value_dim
    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": gen.normal(v, d, std=1.0),
        # Gemma-style RMSNorm, (1 + weight) * x: store small offsets
        "model.norm.weight": gen.normal(d, std=0.05),
        "lm_head.weight": gen.linear(v, d, gain=3.0),
    }
    interval = cfg["full_attention_interval"]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}"
        w[f"{pre}.input_layernorm.weight"] = gen.normal(d, std=0.05)
        w[f"{pre}.post_attention_layernorm.weight"] = gen.normal(d, std=0.05)
        w[f"{pre}.mlp.gate.weight"] = gen.linear(ne, d)
        for e in range(ne):
            w[f"{pre}.mlp.experts.{e}.gate_proj.weight"] = gen.linear(fe, d)
            w[f"{pre}.mlp.experts.{e}.up_proj.weight"] = gen.linear(fe, d)
            w[f"{pre}.mlp.experts.{e}.down_proj.weight"] = gen.linear(d, fe, gain=0.5)
        w[f"{pre}.mlp.shared_expert.gate_proj.weight"] = gen.linear(fs, d)
        w[f"{pre}.mlp.shared_expert.up_proj.weight"] = gen.linear(fs, d)
        w[f"{pre}.mlp.shared_expert.down_proj.weight"] = gen.linear(d, fs, gain=0.5)
        w[f"{pre}.mlp.shared_expert_gate.weight"] = gen.linear(1, d)
        if (i + 1) % interval:
            la = f"{pre}.linear_attn"
            qkv = gen.linear(conv_dim, d)
            z = gen.linear(value_dim, d)
            b = gen.linear(hv, d)
            a = gen.linear(hv, d, gain=0.5)
            w[f"{la}.in_proj_qkvz.weight"], w[f"{la}.in_proj_ba.weight"] = _pack_qkvzba(qkv, z, b, a, hk, dk, dv)
            w[f"{la}.conv1d.weight"] = gen.normal(conv_dim, 1, kconv, std=0.6 / math.sqrt(kconv))
            w[f"{la}.A_log"] = torch.log(gen.uniform(hv, lo=0.5, hi=4.0))
            w[f"{la}.dt_bias"] = _inv_softplus(gen.uniform(hv, lo=0.01, hi=0.08))
            w[f"{la}.norm.weight"] = gen.norm(dv)
            w[f"{la}.out_proj.weight"] = gen.linear(d, value_dim, gain=0.5)
        else:
            sa = f"{pre}.self_attn"
            # gated attention: q_proj emits [q | gate] per head
            w[f"{sa}.q_proj.weight"] = gen.linear(2 * nh * hd, d)
            w[f"{sa}.k_proj.weight"] = gen.linear(nkv * hd, d)
            w[f"{sa}.v_proj.weight"] = gen.linear(nkv * hd, d)
            w[f"{sa}.o_proj.weight"] = gen.linear(d, nh * hd, gain=0.5)
            w[f"{sa}.q_norm.weight"] = gen.normal(hd, std=0.05)
            w[f"{sa}.k_norm.weight"] = gen.normal(hd, std=0.05)
    return w


def _qwen3_5_weights(cfg: dict, gen: _Gen) -> dict[str, torch.Tensor]:
    """Qwen3.5 dense (``Qwen3_5ForCausalLM``): Qwen3-Next's GDN and gated attention, dense SwiGLU MLP."""
    d, v, f = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    kconv = cfg["linear_conv_kernel_dim"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    key_dim, value_dim = hk * dk, hv * dv
    conv_dim = 2 * key_dim + value_dim
    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": gen.normal(v, d, std=1.0),
        "model.norm.weight": gen.normal(d, std=0.05),  # Gemma-style (1 + weight)
        "lm_head.weight": gen.linear(v, d, gain=3.0),
    }
    interval = cfg["full_attention_interval"]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}"
        w[f"{pre}.input_layernorm.weight"] = gen.normal(d, std=0.05)
        w[f"{pre}.post_attention_layernorm.weight"] = gen.normal(d, std=0.05)
        w[f"{pre}.mlp.gate_proj.weight"] = gen.linear(f, d)
        w[f"{pre}.mlp.up_proj.weight"] = gen.linear(f, d)
        w[f"{pre}.mlp.down_proj.weight"] = gen.linear(d, f, gain=0.5)
        if (i + 1) % interval:
            la = f"{pre}.linear_attn"
            # Qwen3.5's split checkpoint names; SGLang's Qwen3_5 loader merges them (its packed
            # weight loaders accept the (0, 1, 2) shard id that Qwen3-Next's refuses).
            w[f"{la}.in_proj_qkv.weight"] = gen.linear(conv_dim, d)
            w[f"{la}.in_proj_z.weight"] = gen.linear(value_dim, d)
            w[f"{la}.in_proj_b.weight"] = gen.linear(hv, d)
            w[f"{la}.in_proj_a.weight"] = gen.linear(hv, d, gain=0.5)
            w[f"{la}.conv1d.weight"] = gen.normal(conv_dim, 1, kconv, std=0.6 / math.sqrt(kconv))
            w[f"{la}.A_log"] = torch.log(gen.uniform(hv, lo=0.5, hi=4.0))
            w[f"{la}.dt_bias"] = _inv_softplus(gen.uniform(hv, lo=0.01, hi=0.08))
            w[f"{la}.norm.weight"] = gen.norm(dv)
            w[f"{la}.out_proj.weight"] = gen.linear(d, value_dim, gain=0.5)
        else:
            sa = f"{pre}.self_attn"
            w[f"{sa}.q_proj.weight"] = gen.linear(2 * nh * hd, d)  # [q | gate] per head
            w[f"{sa}.k_proj.weight"] = gen.linear(nkv * hd, d)
            w[f"{sa}.v_proj.weight"] = gen.linear(nkv * hd, d)
            w[f"{sa}.o_proj.weight"] = gen.linear(d, nh * hd, gain=0.5)
            w[f"{sa}.q_norm.weight"] = gen.normal(hd, std=0.05)
            w[f"{sa}.k_norm.weight"] = gen.normal(hd, std=0.05)
    return w


# ----------------------------------------------------------------------------- echo variant


def echo_next(token: int, vocab: int) -> int:
    """The echo model's greedy next token after ``token``: the next non-special id (cyclic over
    ``4 .. vocab-1``); after a special ``s`` (``0..3``): ``4 + s``."""
    n = len(SPECIALS)
    if token < n:
        return n + token
    return n + (token - n + 1) % (vocab - n)


def echo_continuation(prompt: list[int], length: int, vocab: int) -> list[int]:
    """The echo model's greedy output of ``length`` tokens for ``prompt`` (it depends on the last token only)."""
    out, token = [], int(prompt[-1])
    for _ in range(length):
        token = echo_next(token, vocab)
        out.append(token)
    return out


#: names of each family's embedding and LM head
_EMBED_HEAD = {
    "nemotron_h": ("backbone.embeddings.weight", "lm_head.weight"),
    "qwen": ("model.embed_tokens.weight", "lm_head.weight"),
}
#: residual branches' output projections (the last linear before each residual add)
_BRANCH_OUT = (".out_proj.weight", ".o_proj.weight", ".down_proj.weight")


def _echo(weights: dict[str, torch.Tensor]) -> None:
    """Turn a preset's weights into its echo variant in place (module docstring)."""
    embed_key = next(e for e, _ in _EMBED_HEAD.values() if e in weights)
    emb = weights[embed_key]
    v, d = emb.shape
    idx = torch.arange(v, device=emb.device)
    n = len(SPECIALS)
    head = torch.zeros_like(emb)
    # row echo_next(x) gets embedding x; specials' successors 4..7 get two sources (both win nowhere else)
    succ = torch.where(idx < n, n + idx, n + (idx - n + 1) % (v - n))
    head.index_add_(0, succ, emb)
    weights["lm_head.weight"] = head * (ECHO_LOGIT / d)
    for k in weights:
        if k.endswith(_BRANCH_OUT):
            weights[k] = weights[k] * ECHO_BRANCH_SCALE


_BUILDERS = {
    "nemotron_h_tiny": (_nemotron_h_weights, 1234),
    "qwen3_next_tiny": (_qwen3_next_weights, 4321),
    "qwen3_5_tiny": (_qwen3_5_weights, 4322),
    # config + tokenizer only: an unsupported family, refused before any weight is read
    "llama_tiny": (None, 0),
    # shape-faithful ~4B presets for the serving benchmarks (build on a GPU)
    "nemotron_h_nano4b": (_nemotron_h_weights, 2024),
    "qwen3_next_4b": (_qwen3_next_weights, 3535),
    "qwen3_5_4b": (_qwen3_5_weights, 3536),
}


def _vocab_size(cfg: dict) -> int:
    return cfg["vocab_size"]


def _save_sharded(weights: dict[str, torch.Tensor], out: Path, dtype: torch.dtype, shard_bytes: int) -> None:
    """Write ``model-0000i-of-0000n.safetensors`` shards of at most ``shard_bytes`` plus the HF index.

    Tensors are cast on their own device and moved to the host one shard at a time (host memory
    stays at about one shard), and each is dropped from ``weights`` once cast.
    """
    from safetensors.torch import save_file

    names = list(weights)
    shards: list[list[str]] = [[]]
    size = 0
    for k in names:
        nbytes = weights[k].numel() * torch.empty((), dtype=dtype).element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(k)
        size += nbytes
    n = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i, keys in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        host = {}
        for k in keys:
            t = weights.pop(k).to(dtype).contiguous()
            host[k] = t.cpu()
            total += t.numel() * t.element_size()
            weight_map[k] = fname
        save_file(host, str(out / fname), metadata={"format": "pt"})
        del host
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )


def materialize(name: str, out_dir: str | Path, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", config: dict | None = None,
                shard_bytes: int | None = None, echo: bool = False) -> Path:
    """Write model ``name`` (one of ``MODELS``) into ``out_dir``; return the directory.

    Idempotent: an existing complete directory with the same config is left as is.
    ``device``: where the weights are drawn and cast (``"cuda"`` for the ~4B presets).
    ``config``: use this config dict instead of ``tests/models/<name>/config.json`` (same builder
    and seed; the benchmark tests shrink a preset this way).  ``shard_bytes``: write HF-style
    shards of at most this size (plus ``model.safetensors.index.json``) instead of one file.
    ``echo``: write the echo variant (module docstring; ``echo_continuation`` predicts its greedy output).
    """
    from safetensors.torch import save_file

    if name not in _BUILDERS:
        raise ValueError(f"model: expected one of {MODELS}, got {name!r}")
    out = Path(out_dir)
    src_cfg = HERE / name / "config.json"
    cfg_text = src_cfg.read_text() if config is None else json.dumps(config, indent=2)
    if echo and _BUILDERS.get(name, (None,))[0] is None:
        raise ValueError(f"echo: expected a model with weights, got {name!r}")
    stamp = out / ".complete"
    stamp_text = cfg_text + ("\n# echo variant\n" if echo else "")
    if stamp.exists() and stamp.read_text() == stamp_text:
        return out
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(cfg_text)
    builder, seed = _BUILDERS[name]
    if builder is not None:
        with torch.no_grad():
            weights = builder(cfg, _Gen(seed, device))
            if echo:
                _echo(weights)
            if shard_bytes is None:
                save_file({k: t.to(dtype).contiguous().cpu() for k, t in weights.items()},
                          str(out / "model.safetensors"), metadata={"format": "pt"})
            else:
                _save_sharded(weights, out, dtype, shard_bytes)
        del weights
    if config is None:
        shutil.copyfile(src_cfg, out / "config.json")
    else:
        (out / "config.json").write_text(cfg_text)
    build_tokenizer(_vocab_size(cfg), out)
    stamp.write_text(stamp_text)
    return out


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--echo"]
    if len(argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} {{{','.join(MODELS)}}} OUT_DIR [--echo]")
    print(materialize(argv[0], argv[1], echo="--echo" in sys.argv[1:]))
