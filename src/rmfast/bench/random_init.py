"""Full-size reward models with random weights, built from configs committed here: ``rmfast bench --random-init``.

No checkpoint, no hub, no download: :data:`CONFIGS` holds the published architecture of each model
(hidden size, layers, heads, kv heads, head dim, intermediate size, vocabulary, rope settings; Gemma 2's
softcaps, sliding window and ``query_pre_attn_scalar``), written out from the models' public
``config.json``. :func:`random_init_model` builds ``AutoModelForSequenceClassification`` (one output)
from one of them directly on the device in the target dtype and draws its weights there; the
tokenizer is generated (:func:`synthetic_tokenizer`) with the model's vocabulary size, so every id is
a candidate. The scores mean nothing; the work per candidate is the real model's, which is what a
speed measurement needs. ``tiny=True`` keeps each config's features (GQA ratio, llama3 rope scaling,
softcaps, a sliding window shorter than the prompt) at a CPU-test size.

Weights: linear layers ~ N(0, 1/fan_in) except q_proj, N(0, 4/fan_in) (:data:`Q_SCALE`), embeddings
N(0, 1) (Gemma: N(0, 1/hidden), since it scales them by sqrt(hidden)), RMSNorm weights 1 + N(0, 0.1²)
(Gemma's ``1 + w`` form: N(0, 0.1²)). HF's default std 0.02 makes every score nearly equal, so the
benchmark's rank-agreement check would compare noise. Even at these scales a deep random model mixes
its positions evenly, and the candidate moves the score little more than bf16 rounding does; the
doubled query scale makes attention pick a few positions (measured on the CPU, 192 ids, bf16 vs fp32
truth: Llama-3.2-1B score std 0.047 -> 0.15, rank correlation to truth 0.96 -> 0.99 for rmfast and HF
alike; Gemma-2-2B std 0.085 -> 0.19, 0.965/0.972 -> 0.984/0.987). Scales of 4x and more make it chaotic
(at 6x: 0.81 to truth).
"""

from __future__ import annotations

import math

import torch

from ..loader import LoadedModel
from .models import BenchModel

# As published (the models' config.json on the hub; the fields the architecture reads).
_LLAMA3_ROPE_1B = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
_LLAMA3_ROPE_8B = {**_LLAMA3_ROPE_1B, "factor": 8.0}
_GEMMA2 = dict(model_type="gemma2", hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
               rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096, attn_logit_softcapping=50.0,
               final_logit_softcapping=30.0, attention_bias=False, tie_word_embeddings=True, vocab_size=256000)
_LLAMA3 = dict(model_type="llama", hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5,
               rope_theta=500000.0, attention_bias=False, mlp_bias=False, vocab_size=128256)

CONFIGS: dict[str, dict] = {
    "llama-3.2-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "rope_scaling": _LLAMA3_ROPE_1B, "tie_word_embeddings": True},
    "llama-3.1-8b": {**_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "rope_scaling": _LLAMA3_ROPE_8B, "tie_word_embeddings": False},
    "gemma-2-2b": {**_GEMMA2, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256},
    "gemma-2-9b": {**_GEMMA2, "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "query_pre_attn_scalar": 256},
    "gemma-2-27b": {**_GEMMA2, "hidden_size": 4608, "intermediate_size": 36864, "num_hidden_layers": 46,
                    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                    "query_pre_attn_scalar": 144},  # hidden / heads, not head_dim
}

#: Published parameter counts (billions) of the causal LMs; the classifier drops an untied LM head
#: and adds a (hidden, 1) score head. tests/test_gpu_check.py checks CONFIGS against these.
PUBLISHED_PARAMS_B = {"llama-3.2-1b": 1.236, "llama-3.1-8b": 8.030, "gemma-2-2b": 2.614, "gemma-2-9b": 9.242,
                      "gemma-2-27b": 27.227}

#: Per model family: the special tokens of the generated tokenizer and the plain template whose suffix
#: is the real chat template's (Llama 3: ``<|eot_id|>``, one token; Gemma 2: ``<end_of_turn>\\n``, two).
FAMILIES = {
    "llama": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>",
              "extra": ("<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
              "template": "User: {prompt}\nAssistant: {response}<|eot_id|>"},
    "gemma2": {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "extra": ("<start_of_turn>", "<end_of_turn>"),
               "template": "User: {prompt}\nAssistant: {response}<end_of_turn>\n"},
}

#: q_proj's init scale relative to 1/sqrt(fan_in): sharper attention, scores that depend on the candidate.
Q_SCALE = 2.0

#: tiny=True: each config at a CPU-test size, its features kept (see :func:`config_dict`).
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "vocab_size": 1024,
        "num_hidden_layers": 4}


def config_dict(name: str, *, layers: int | None = None, tiny: bool = False) -> dict:
    """The committed config of ``name`` (a copy), with ``layers`` decoder layers; ``tiny``: shrunk.

    Shrinking keeps the query/kv head ratio (GQA), the rope scaling, the softcaps and a
    ``query_pre_attn_scalar`` different from the head dim (1.5x), and makes the sliding window 16
    tokens, shorter than the benchmark prompt, so windowed attention over the prompt is exercised.
    """
    if name not in CONFIGS:
        raise ValueError(f"unknown random-init model {name!r}; known: {', '.join(CONFIGS)}")
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CONFIGS[name].items()}
    if tiny:
        ratio = d["num_attention_heads"] // d["num_key_value_heads"]
        d.update(TINY)
        d["num_key_value_heads"] = max(1, TINY["num_attention_heads"] // ratio)
        if "query_pre_attn_scalar" in d:
            d["query_pre_attn_scalar"] = int(1.5 * TINY["head_dim"])
        if "sliding_window" in d:
            d["sliding_window"] = 16
    if layers is not None:
        if int(layers) < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        d["num_hidden_layers"] = int(layers)
    return d


def family(name: str) -> dict:
    return FAMILIES[CONFIGS[name]["model_type"]]


def label(name: str, *, layers: int | None = None, tiny: bool = False) -> str:
    """The benchmark's name for a configuration: ``gemma-2-9b@random``, ``llama-3.1-8b@random-tiny-L2``."""
    return f"{name}@random" + ("-tiny" if tiny else "") + (f"-L{layers}" if layers is not None else "")


def synthetic_tokenizer(vocab_size: int, *, bos: str, eos: str, pad: str, extra=(), chat_template: str | None = None):
    """A byte-level tokenizer of exactly ``vocab_size`` ids, made here (no file, no download).

    Ids: the special tokens first (bos, eos, pad, then ``extra``), then the 256 byte symbols, then
    filler tokens ``<0>``, ``<1>``, … up to the size. It has no merges, so any text encodes as its
    bytes and decodes back exactly (what :func:`rmfast.template.build_template` checks); the filler
    ids are never produced by text, only scored as candidate ids (they decode to their names).
    Plain-format text gets ``bos`` prepended (``add_special_tokens=True``), as Llama's and Gemma's do.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys([bos, eos, pad, *extra]))
    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab)} special and byte tokens")
    i = 0
    while len(vocab) < vocab_size:
        vocab[f"<{i}>"] = len(vocab)
        i += 1
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                      special_tokens=[(bos, vocab[bos])])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token=eos, pad_token=pad,
                                  extra_special_tokens=[s for s in specials if s not in (bos, eos, pad)])
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def _reinit(model: torch.nn.Module, seed: int) -> None:
    """Draw every parameter in place, on its device, in its dtype (scales in the module docstring)."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(int(seed))
    gemma = model.config.model_type.startswith("gemma")
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" in name:
                p.normal_(0.0, 1.0 / math.sqrt(hidden) if gemma else 1.0, generator=g)
            elif p.dim() == 2:
                scale = Q_SCALE if name.endswith("q_proj.weight") else 1.0
                p.normal_(0.0, scale / math.sqrt(p.shape[1]), generator=g)
            elif "norm" in name:
                p.normal_(0.0 if gemma else 1.0, 0.1, generator=g)
            else:  # biases
                p.zero_()


def random_init_model(name: str, *, device: str | torch.device = "cpu", dtype: str | torch.dtype = torch.bfloat16,
                      layers: int | None = None, tiny: bool = False, seed: int = 0,
                      attn_implementation: str = "eager") -> LoadedModel:
    """``name``'s architecture as a one-output classifier with random weights, made on ``device`` in ``dtype``.

    The parameters are allocated on the device in the target dtype (``torch.device`` context,
    ``from_config(dtype=...)``), never on the CPU first: a 27B model needs no host copy. Eager
    attention, like :func:`rmfast.loader.load` (Gemma 2's softcapping needs it in the baselines).

    Returns a :class:`rmfast.loader.LoadedModel` with the generated tokenizer and the family's plain
    template as ``default_template``; ``source`` records the config and seed.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from ..loader import quiet_transformers, resolve_device, resolve_dtype

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    d = config_dict(name, layers=layers, tiny=tiny)
    fam = family(name)
    tok = synthetic_tokenizer(d["vocab_size"], bos=fam["bos"], eos=fam["eos"], pad=fam["pad"], extra=fam["extra"])
    kw = {k: v for k, v in d.items() if k != "model_type"}
    cfg = AutoConfig.for_model(d["model_type"], **kw, num_labels=1, pad_token_id=tok.pad_token_id,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with quiet_transformers(), torch.device(dev):
        model = AutoModelForSequenceClassification.from_config(cfg, dtype=dt, attn_implementation=attn_implementation)
    _reinit(model, seed)
    model.eval().requires_grad_(False)
    source = {"spec": f"random-init:{name}", "type": "random-init", "name": label(name, layers=layers, tiny=tiny),
              "path": None, "sha256": None, "revision": None, "alias": None, "random_head_seed": None,
              "init_seed": int(seed), "config": d}
    return LoadedModel(model=model, tokenizer=tok, kind="classifier", source=source, default_template=fam["template"])


def random_init_bench_models(names: str, *, layers: int | None = None, tiny: bool = False) -> list[BenchModel]:
    """``--random-init a,b``: one score-head benchmark configuration per name, on the family's plain template."""
    out = []
    for name in [s.strip() for s in names.split(",") if s.strip()]:
        if name not in CONFIGS:
            raise ValueError(f"unknown random-init model {name!r}; known: {', '.join(CONFIGS)}")
        d = config_dict(name, layers=layers, tiny=tiny)
        note = (f"{name} architecture ({d['num_hidden_layers']} layers, hidden {d['hidden_size']}, vocab {d['vocab_size']:,}) "
                "with random weights and a generated byte-level tokenizer: speed only, the scores mean nothing")
        out.append(BenchModel(label(name, layers=layers, tiny=tiny), f"random-init:{name}", "score",
                              family(name)["template"], None, note))
    return out


def param_count(name: str, *, layers: int | None = None, tiny: bool = False) -> int:
    """Parameters of the classifier ``random_init_model`` builds (counted on the meta device: no memory)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from ..loader import quiet_transformers

    d = config_dict(name, layers=layers, tiny=tiny)
    kw = {k: v for k, v in d.items() if k != "model_type"}
    cfg = AutoConfig.for_model(d["model_type"], **kw, num_labels=1, pad_token_id=0)
    with quiet_transformers(), torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def cost_model_config(name: str, *, layers: int | None = None, tiny: bool = False) -> dict:
    """The config in :data:`rmfast.bench.flops.COST_MODELS`' form, for :func:`~rmfast.bench.flops.gpu_cost_model`."""
    d = config_dict(name, layers=layers, tiny=tiny)
    gemma = d["model_type"] == "gemma2"
    return {"label": label(name, layers=layers, tiny=tiny), "layers": d["num_hidden_layers"], "d": d["hidden_size"],
            "inter": d["intermediate_size"], "heads": d["num_attention_heads"], "kv_heads": d["num_key_value_heads"],
            "head_dim": d["head_dim"], "vocab": d["vocab_size"], "suffix": 2 if gemma else 1, "norms": 4 if gemma else 2}
