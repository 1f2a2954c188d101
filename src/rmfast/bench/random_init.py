"""Full-size reward models with random weights, built from the registry's configs: ``rmfast bench --random-init``.

No checkpoint, no hub, no download: a name is a known reward model (an alias of ``rmfast models``, its
hub id or hub name: :mod:`rmfast.loading.registry`) or one of the registry's base architectures
(``llama-3.1-8b``, ``gemma-2-27b``, ``qwen3-8b``, ...: :data:`rmfast.loading.registry.BASES`), whose published
configuration (hidden size, layers, heads, kv heads, head dim, intermediate size, vocabulary, rope
settings; Gemma 2's softcaps, sliding window and ``query_pre_attn_scalar``; Qwen3's q/k norms) is the
one place these numbers are written. :func:`random_init_model` builds ``AutoModelForSequenceClassification``
(one output) from it directly on the device in the target dtype and draws its weights there; the
tokenizer is generated (:func:`synthetic_tokenizer`) with the model's vocabulary size, so every id is a
candidate. The scores mean nothing; the work per candidate is the real model's, which is what a speed
measurement needs. Reward models with a custom head (ArmoRM, QRM, URM) are built as their backbone
with a plain one-output ``score`` head: the backbone's cost per candidate is theirs, their head's own
(a few small matrices on the final hidden state) is not measured. ``tiny=True`` keeps each config's
features (GQA ratio, llama3 rope scaling, softcaps, a sliding window shorter than the prompt) at a
CPU-test size.

Weights: linear layers ~ N(0, 1/fan_in) except q_proj, N(0, 4/fan_in) (:data:`Q_SCALE`), embeddings
N(0, 1) (Gemma: N(0, 1/hidden), since it scales them by sqrt(hidden)), RMSNorm weights 1 + N(0, 0.1²)
(Gemma's ``1 + w`` form: N(0, 0.1²)). HF's default std 0.02 makes every score nearly equal, so the
benchmark's rank-agreement check would compare noise. Even at these scales a deep random model mixes
its positions evenly, and the candidate moves the score little more than bf16 rounding does; the
doubled query scale makes attention pick a few positions (measured on the CPU, 192 ids, bf16 vs fp32
truth: Llama-3.2-1B score std 0.047 -> 0.15, rank correlation to truth 0.96 -> 0.99 for rmfast and HF
alike; Gemma-2-2B std 0.085 -> 0.19, 0.965/0.972 -> 0.984/0.987). Scales of 4x and more make it chaotic
(at 6x: 0.81 to truth).

    >>> from rmfast.bench.random_init import config_dict, label
    >>> d = config_dict("S-Lla-1B-V2", layers=2)          # Skywork-Reward-V2-Llama-3.2-1B, cut to 2 layers
    >>> d["hidden_size"], d["vocab_size"], d["num_hidden_layers"], label("S-Lla-1B-V2", layers=2)
    (2048, 128256, 2, 'S-Lla-1B-V2@random-L2')
"""

from __future__ import annotations

import math

import torch

from ..dims import model_dims as config_dims
from ..loading import registry
from ..errors import UserError
from ..loading.loader import LoadedModel, load
from ..fast.arch import SUPPORTED
from .models import BenchModel, random_init_names

#: Per model type: the special tokens of the generated tokenizer, its chat template (the real one's turn markup,
#: so a benchmark tokenizes conversations as it would a real reward model's: the response's tail alone,
#: :mod:`rmfast.template_tail`), and the length in tokens of the suffix after the response (Llama 3:
#: ``<|eot_id|>``, one token; Gemma 2: ``<end_of_turn>\n``, two; Qwen3: ``<|im_end|>\n``, two). Qwen's tokenizers
#: add no BOS (``bos=None``).
FAMILIES = {
    "llama": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>",
              "extra": ("<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
              "chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
                               "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                               "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}", "suffix": 1},
    "gemma2": {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "extra": ("<start_of_turn>", "<end_of_turn>"),
               "chat_template": "{{ bos_token }}{% for m in messages %}<start_of_turn>"
                                "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}"
                                "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
                                "{% endif %}", "suffix": 2},
    "qwen3": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "extra": ("<|im_start|>",),
              "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
              "suffix": 2},
}

#: q_proj's init scale relative to 1/sqrt(fan_in): sharper attention, scores that depend on the candidate.
Q_SCALE = 2.0

#: tiny=True: each config at a CPU-test size, its features kept (see :func:`config_dict`).
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "vocab_size": 1024,
        "num_hidden_layers": 4}


names = random_init_names  # every name --random-init takes (bench.models)


def resolve(name: str) -> tuple[str, dict]:
    """(canonical name, full config copy) of a registry alias / hub id, or of a base architecture."""
    try:
        return registry.config_of(name)
    except ValueError as e:
        raise ValueError(f"unknown random-init model {name!r}: {str(e).split(': ', 1)[1]}") from None


def config_dict(name: str, *, layers: int | None = None, tiny: bool = False) -> dict:
    """The registry's config of ``name`` (a copy), with ``layers`` decoder layers; ``tiny``: shrunk.

    Shrinking keeps the query/kv head ratio (GQA), the rope scaling, the softcaps and a
    ``query_pre_attn_scalar`` different from the head dim (1.5x), and makes the sliding window 16
    tokens, shorter than the benchmark prompt, so windowed attention over the prompt is exercised.
    """
    d = resolve(name)[1]
    n_real = config_dims(d).layers
    if layers is not None and int(layers) > n_real:  # "the first N": more would build (and time) a larger model
        raise UserError(f"--layers {layers}: {resolve(name)[0]} has {n_real} decoder layers; give 1..{n_real} "
                        "(the first N of its config)")
    if tiny:
        real = config_dims(d)
        ratio = real.heads // real.kv_heads
        d.update(TINY)
        d["num_key_value_heads"] = max(1, TINY["num_attention_heads"] // ratio)
        if "query_pre_attn_scalar" in d:
            d["query_pre_attn_scalar"] = int(1.5 * TINY["head_dim"])
        if d.get("sliding_window") is not None:
            d["sliding_window"] = 16
    if layers is not None:
        if int(layers) < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        d["num_hidden_layers"] = int(layers)
    return d


def family(name: str) -> dict:
    return FAMILIES[resolve(name)[1]["model_type"]]


def label(name: str, *, layers: int | None = None, tiny: bool = False) -> str:
    """The benchmark's name for a configuration: ``gemma-2-9b@random``, ``S-Lla-1B-V2@random-tiny-L2``."""
    return f"{resolve(name)[0]}@random" + ("-tiny" if tiny else "") + (f"-L{layers}" if layers is not None else "")


def synthetic_tokenizer(vocab_size: int, *, bos: str | None, eos: str, pad: str, extra=(),
                        chat_template: str | None = None):
    """A byte-level tokenizer of exactly ``vocab_size`` ids, made here (no file, no download).

    Ids: the special tokens first (bos, eos, pad, then ``extra``), then the 256 byte symbols, then
    filler tokens ``<0>``, ``<1>``, … up to the size. It has no merges, so any text encodes as its
    bytes and decodes back exactly (what :func:`rmfast.template.build_template` checks); the filler
    ids are never produced by text, only scored as candidate ids (they decode to their names).
    Plain-format text gets ``bos`` prepended (``add_special_tokens=True``), as Llama's and Gemma's do;
    ``bos=None``: none, as Qwen's.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [s for s in dict.fromkeys([bos, eos, pad, *extra]) if s is not None]
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
    if bos is not None:
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
    hidden = config_dims(model.config).hidden
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


def _hf_config(d: dict, **kw):
    from transformers import AutoConfig

    return AutoConfig.for_model(d["model_type"], **{k: v for k, v in d.items() if k != "model_type"}, **kw)


def _no_default_init():
    """Skip transformers' own weight init: :func:`_reinit` draws every parameter anyway, and HF's pass was
    most of the build time (Qwen3-0.6B cut to 2 layers on the CPU: 15 s of 20 s). Buffers (rotary tables,
    Gemma's embedding scale) are made by the constructors, so the model is the same (checked in tests)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: keep its init
        import contextlib

        return contextlib.nullcontext()
    return no_init_weights()


def random_init_model(name: str, *, device: str | torch.device = "cpu", dtype: str | torch.dtype = torch.bfloat16,
                      layers: int | None = None, tiny: bool = False, seed: int = 0,
                      attn_implementation: str = "eager") -> LoadedModel:
    """``name``'s architecture as a one-output classifier with random weights, made on ``device`` in ``dtype``.

    ``name``: an alias of ``rmfast models`` (or its hub id) or a base architecture of the registry.
    The parameters are allocated on the device in the target dtype (``torch.device`` context,
    ``from_config(dtype=...)``), never on the CPU first: a 27B model needs no host copy. Eager
    attention, like :func:`rmfast.loading.loader.load` (Gemma 2's softcapping needs it in the baselines).

    Returns a :class:`rmfast.loading.loader.LoadedModel` with the generated tokenizer, which carries its family's
    chat template (no ``default_template``); ``source`` records the config, the alias and the seed.

        >>> lm = random_init_model("S-Qwe-0.6B-V2", layers=1, tiny=True, dtype="float32")
        >>> lm.model.config.model_type, len(lm.model.model.layers), len(lm.tokenizer), lm.source["name"]
        ('qwen3', 1, 1024, 'S-Qwe-0.6B-V2@random-tiny-L1')
    """
    from transformers import AutoModelForSequenceClassification

    from ..cpu import record
    from ..loading.loader import dtype_and_choice, dtype_name, quiet_transformers, resolve_device

    dev = resolve_device(device)
    dtype_name(dtype)  # a bad name fails before any work
    canonical = resolve(name)[0]
    d, fam, tok, cfg = _config_and_tokenizer(name, layers, tiny)
    dt, choice = dtype_and_choice(dtype, dev, config=cfg)  # auto on CPU: bf16 only where it is fast here
    with quiet_transformers(), torch.device(dev), _no_default_init():
        model = AutoModelForSequenceClassification.from_config(cfg, dtype=dt, attn_implementation=attn_implementation)
    _reinit(model, seed)
    model.eval().requires_grad_(False)
    record(model, choice)
    known = registry.find(canonical)
    source = {"spec": f"random-init:{canonical}", "type": "random-init", "name": label(name, layers=layers, tiny=tiny),
              "path": None, "sha256": None, "revision": None, "alias": known.alias if known else None,
              "random_head_seed": None, "init_seed": int(seed), "config": d}
    return LoadedModel(model=model, tokenizer=tok, kind="classifier", source=source, default_template=None)


def _config_and_tokenizer(name: str, layers: int | None, tiny: bool):
    """(config dict, family, generated tokenizer, HF config with its special ids) of ``name``."""
    d = config_dict(name, layers=layers, tiny=tiny)
    fam = FAMILIES[d["model_type"]]
    tok = synthetic_tokenizer(d["vocab_size"], bos=fam["bos"], eos=fam["eos"], pad=fam["pad"], extra=fam["extra"],
                              chat_template=fam["chat_template"])
    cfg = _hf_config(d, num_labels=1, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id)
    return d, fam, tok, cfg


def random_init_shapes(name: str, *, dtype: torch.dtype = torch.bfloat16, layers: int | None = None,
                       tiny: bool = False) -> LoadedModel:
    """``name``'s model as :func:`random_init_model` builds it, but on the meta device (shapes and dtype only: no
    memory, no weights drawn), with the same tokenizer and template: what a memory estimate made before any
    GPU is touched needs (``benchmarks/gpu_check.py`` plans its batches with the bench's own guard this way)."""
    from transformers import AutoModelForSequenceClassification

    from ..loading.loader import quiet_transformers

    d, fam, tok, cfg = _config_and_tokenizer(name, layers, tiny)
    with quiet_transformers(), torch.device("meta"), _no_default_init():
        model = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype, attn_implementation="eager")
    source = {"spec": f"random-init:{resolve(name)[0]}", "type": "random-init-shapes",
              "name": label(name, layers=layers, tiny=tiny), "config": d}
    return LoadedModel(model=model.eval(), tokenizer=tok, kind="classifier", source=source,
                       default_template=None)


def random_init_bench_models(names: str, *, layers: int | None = None, tiny: bool = False) -> list[BenchModel]:
    """``--random-init a,b``: one score-head benchmark configuration per name, on the family's chat template."""
    out = []
    for name in [s.strip() for s in names.split(",") if s.strip()]:
        canonical = resolve(name)[0]
        d = config_dict(name, layers=layers, tiny=tiny)
        if d["model_type"] not in SUPPORTED:  # the benchmark times the engine, which needs the fast path
            raise ValueError(f"{canonical} is a {d['model_type']} model, not on rmfast's fast path yet: rmfast bench "
                             f"measures the fast path (random_init_model({canonical!r}) builds it for the plain-HF path)")
        known = registry.find(canonical)
        what = f"{known.hub_id} ({known.base})" if known else canonical
        head = ("" if known is None or known.head == "score" else
                f"; its {known.head} head is built as a plain one-output score head (the backbone's work per "
                "candidate is the real model's, the custom head's is not measured)")
        dm = config_dims(d)
        note = (f"{what} architecture ({dm.layers} layers, hidden {dm.hidden}, vocab {dm.vocab:,}) with random "
                f"weights and a generated byte-level tokenizer: speed only, the scores mean nothing{head}")
        out.append(BenchModel(label(name, layers=layers, tiny=tiny), f"random-init:{canonical}", "score",
                              None, None, note))
    return out


def param_count(name: str, *, layers: int | None = None, tiny: bool = False, kind: str = "classifier") -> int:
    """Parameters of the model ``name``'s config builds (counted on the meta device: no memory).

    ``kind="classifier"``: what :func:`random_init_model` builds (a (hidden, 1) score head, no LM head);
    ``"causal_lm"``: the base causal LM (the count base models are published with).
    """
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from ..loading.loader import quiet_transformers

    d = config_dict(name, layers=layers, tiny=tiny)
    cls = AutoModelForSequenceClassification if kind == "classifier" else AutoModelForCausalLM
    with quiet_transformers(), torch.device("meta"):
        model = cls.from_config(_hf_config(d, num_labels=1, pad_token_id=0))
    # Tied LM heads share the embedding's tensor: count each tensor once.
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def cost_model_config(name: str, *, layers: int | None = None, tiny: bool = False) -> dict:
    """The config in :data:`rmfast.bench.flops.COST_MODELS`' form, for :func:`~rmfast.bench.flops.gpu_cost_model`."""
    d = config_dict(name, layers=layers, tiny=tiny)
    dm = config_dims(d)
    gemma = d["model_type"] == "gemma2"
    from .flops import model_dims  # each layer's sliding window, as the engine reads it (meta device: no memory)

    windows = model_dims(random_init_shapes(name, layers=layers, tiny=tiny).model, "score")["windows"]
    return {"label": label(name, layers=layers, tiny=tiny), "layers": dm.layers, "d": dm.hidden, "inter": dm.intermediate,
            "heads": dm.heads, "kv_heads": dm.kv_heads, "head_dim": dm.head_dim, "vocab": dm.vocab,
            "suffix": FAMILIES[d["model_type"]]["suffix"], "norms": 4 if gemma else 2,
            "windows": windows if any(w is not None for w in windows) else None}


def load_workload_model(cfg):
    """(LoadedModel, name, template) of a workload config (a :class:`rmfast.bench.models.ModelChoice` with
    ``dtype`` and ``device``): the loaded spec, or a random-init build."""
    if cfg.random_init:
        try:
            lm = random_init_model(cfg.random_init, device=cfg.device, dtype=cfg.dtype, layers=cfg.layers,
                                   tiny=cfg.tiny, seed=cfg.init_seed)
            name = label(cfg.random_init, layers=cfg.layers, tiny=cfg.tiny)
        except ValueError as e:
            raise UserError(str(e)) from None
    else:
        lm = load(cfg.model, dtype=cfg.dtype, device=cfg.device, random_head_seed=cfg.random_head_seed,
                  allow_pickle=cfg.allow_pickle)
        name = cfg.model
    return lm, cfg.name or name, cfg.template if cfg.template is not None else lm.default_template
