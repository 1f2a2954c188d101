"""Known reward models: the papers' ten and RewardBench 2's open leaders, with the architectures they are built on.

One data module, read by everything that names a model by alias: :func:`rmfast.loading.loader.load` (an alias
resolves to its hub id and pinned revision in the local Hugging Face cache), ``rmfast models`` (the
table), and :mod:`rmfast.bench.random_init` (``--random-init ALIAS``: the real configuration with
random weights).

* :data:`BASES`: the published architectures (the base models' ``config.json`` fields the layers read:
  hidden size, layers, heads, kv heads, head dim, intermediate size, vocabulary, rope settings; Gemma 2's
  softcaps, sliding window and ``query_pre_attn_scalar``; Qwen3's q/k norms are part of its model type)
  and the parameter count each base causal LM is published with.
* :data:`MODELS`: the reward models. Each names its base; the configuration is the base's (the
  checkpoints' own ``config.json`` files were not available here: a fine-tune that added a pad token has
  one more vocabulary row, 4,096 parameters at 8B, which no throughput number notices).
* :data:`HEADS`: how each head kind reads its score.

Pinned revisions are the ones the papers' configuration files record (``paper_a_reward_models.yaml``);
the others are ``None`` (the cache's ``main``). Nothing here is invented: a field not known is ``None``.

    >>> from rmfast.loading.registry import find
    >>> m = find("F-Lla-8B-v0.1")
    >>> m.hub_id, m.head, m.vocab_size, m.base
    ('RLHFlow/ArmoRM-Llama3-8B-v0.1', 'armorm', 128256, 'llama-3-8b')
    >>> find("skywork/skywork-reward-v2-qwen3-0.6b").alias     # hub ids and their names resolve too
    'S-Qwe-0.6B-V2'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dims import model_dims

__all__ = ["BaseModel", "RewardModel", "BASES", "MODELS", "HEADS", "find", "names", "config_of", "count_params",
           "how_to_get"]


@dataclass(frozen=True)
class BaseModel:
    """A published architecture: the base model's hub id, its config, its published parameter count."""

    name: str  # rmfast's name, also a --random-init name: "llama-3.1-8b"
    hub_id: str  # the base model the config is from
    config: dict  # the config.json fields the architecture reads (model_type first)
    params: str  # the causal LM's parameter count in billions, as published (its digits are its precision)
    params_source: str  # where that count is published
    non_embedding_params: str | None = None  # where the publisher also gives it (Qwen3 model cards)


@dataclass(frozen=True)
class RewardModel:
    """One known reward model. ``params_b`` is the checkpoint's count as published (None: not checked here)."""

    alias: str  # the papers' short name (developer - base - size - version)
    hub_id: str
    base: str  # key of BASES: the architecture and its configuration
    head: str  # key of HEADS: how the score is read
    hf_class: str | None  # config.json "architectures"[0], where known
    source: str  # why it is here: the paper and its RewardBench rank, or the leaderboard
    revision: str | None = None  # pinned commit (only where the papers' files record one)
    params_b: float | None = None
    template: str = ""  # template notes
    replica_test: str | None = None  # "tests/<file>.py::<test>" verifying it on a faithful replica
    config_overrides: dict = field(default_factory=dict)

    @property
    def model_type(self) -> str:
        return BASES[self.base].config["model_type"]

    @property
    def vocab_size(self) -> int:
        return model_dims(self.config()).vocab

    @property
    def score_read(self) -> str:
        return HEADS[self.head]

    @property
    def n_params(self) -> int:
        """Parameters of the backbone with a one-output score head, from the config (a custom head's own
        few million are not counted: ArmoRM's gating MLP and regression layer are 6.4M, 0.09%)."""
        return count_params(self.config())

    def config(self) -> dict:
        """The full configuration (a copy): the base's, with this checkpoint's overrides."""
        return _copy({**BASES[self.base].config, **self.config_overrides})


def _copy(d: dict) -> dict:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}


# ----------------------------------------------------------------------------- architectures

# The base models' config.json on the hub (fields the architecture reads).
_LLAMA3 = dict(model_type="llama", hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
               rope_theta=500000.0, attention_bias=False, mlp_bias=False, vocab_size=128256,
               hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_LLAMA32_ROPE = {**_LLAMA31_ROPE, "factor": 32.0}
_LLAMA31 = {**_LLAMA3, "max_position_embeddings": 131072, "rope_scaling": _LLAMA31_ROPE}
_GEMMA2 = dict(model_type="gemma2", hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
               rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096, attn_logit_softcapping=50.0,
               final_logit_softcapping=30.0, attention_bias=False, tie_word_embeddings=True, vocab_size=256000)
_QWEN3 = dict(model_type="qwen3", hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
              rope_theta=1000000.0, attention_bias=False, use_sliding_window=False, sliding_window=None,
              vocab_size=151936, head_dim=128, num_key_value_heads=8)

_HUB = "the hub's parameter listing (safetensors)"
_QWEN_CARD = "the Qwen3 model card (total and non-embedding)"

BASES: dict[str, BaseModel] = {b.name: b for b in [
    BaseModel("llama-3-8b", "meta-llama/Meta-Llama-3-8B", _LLAMA3, "8.03", _HUB),
    BaseModel("llama-3.1-8b", "meta-llama/Llama-3.1-8B", _LLAMA31, "8.03", _HUB),
    BaseModel("llama-3.2-1b", "meta-llama/Llama-3.2-1B",
              {**_LLAMA31, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rope_scaling": _LLAMA32_ROPE,
               "tie_word_embeddings": True}, "1.24", _HUB),
    BaseModel("llama-3.2-3b", "meta-llama/Llama-3.2-3B",
              {**_LLAMA31, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
               "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "rope_scaling": _LLAMA32_ROPE,
               "tie_word_embeddings": True}, "3.21", _HUB),
    BaseModel("gemma-2-2b", "google/gemma-2-2b",
              {**_GEMMA2, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256},
              "2.61", _HUB),
    BaseModel("gemma-2-9b", "google/gemma-2-9b",
              {**_GEMMA2, "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
               "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "query_pre_attn_scalar": 256},
              "9.24", _HUB),
    BaseModel("gemma-2-27b", "google/gemma-2-27b",
              {**_GEMMA2, "hidden_size": 4608, "intermediate_size": 36864, "num_hidden_layers": 46,
               "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
               "query_pre_attn_scalar": 144},  # hidden / heads, not head_dim
              "27.2", _HUB),
    BaseModel("qwen3-0.6b", "Qwen/Qwen3-0.6B",
              {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
               "num_attention_heads": 16, "tie_word_embeddings": True}, "0.6", _QWEN_CARD, "0.44"),
    BaseModel("qwen3-1.7b", "Qwen/Qwen3-1.7B",
              {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
               "num_attention_heads": 16, "tie_word_embeddings": True}, "1.7", _QWEN_CARD, "1.4"),
    BaseModel("qwen3-4b", "Qwen/Qwen3-4B",
              {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
               "num_attention_heads": 32, "tie_word_embeddings": True}, "4.0", _QWEN_CARD, "3.6"),
    BaseModel("qwen3-8b", "Qwen/Qwen3-8B",
              {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
               "num_attention_heads": 32, "tie_word_embeddings": False}, "8.2", _QWEN_CARD, "6.95"),
]}

# ----------------------------------------------------------------------------- heads

#: Head kind -> how the score is read (the facts rmfast must reproduce; the kinds the fast path scores
#: are listed in rmfast.loading.support.FAST_HEADS).
HEADS: dict[str, str] = {
    "score": "*ForSequenceClassification, one label: logits[:, 0], the `score` linear layer on the final token's "
             "hidden state",
    "armorm": "LlamaForRewardModelWithGating: score = sum_k gate_k * (regression(h_last) @ reward_transform_matrix)_k; "
              "gate = softmax(MLP(h_gate) / temperature) * logit_scale, h_gate at the last occurrence of "
              "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n (the end of the user turn); "
              "19 objectives; outputs.score",
    "qrm": "quantile regression heads + the ArmoRM-style gating: score = sum_k gate_k * (mean over quantiles of "
           "regression(h_last) @ reward_transform_matrix)_k (gating MLP with BatchNorm); outputs.score",
    "urm": "multi-output head on the final token (5 HelpSteer2 attributes with uncertainty, gated in fp16); "
           "the papers read outputs.logits[:, 0]",
}

# ----------------------------------------------------------------------------- reward models

_LLAMA3_TMPL = ("the tokenizer's Llama 3 chat template: ...<|start_header_id|>assistant<|end_header_id|>\\n\\n"
                "{response}<|eot_id|> (1 template token after a one-token response)")
_LLAMA31_TMPL = _LLAMA3_TMPL + "; Llama 3.1 templates add a system header with dates, see the tokenizer"
_GEMMA2_TMPL = ("the tokenizer's Gemma 2 chat template: <start_of_turn>model\\n{response}<end_of_turn>\\n "
                "(2 template tokens after the response); no system role")
_QWEN3_TMPL = ("the tokenizer's Qwen3 ChatML template: <|im_start|>assistant\\n{response}<|im_end|>\\n; Qwen3's "
               "template can put an empty <think></think> block before the final assistant turn, see the tokenizer")
_PAPERS = "papers A/B (RewardBench rank {})"
#: The replica test of the plain score-head checkpoints: transformers' own class for the checkpoint (the
#: real weight names) from the registry config shrunk with its features kept, saved as a folder, scanned by
#: the CLI over the full (shrunk) vocabulary, equal to the full-sequence reference to fp32 rounding.
_SCORE_REPLICA = "tests/test_registry.py::test_score_head_replica"
_RB2 = "RewardBench 2 open leader (Skywork-Reward-V2)"
#: The custom heads' replica test: a replica laid out like the real checkpoint (config keys, architectures,
#: safetensors names; the real Llama 3 tokenizer for the Llama ones) scanned by the CLI, equal to an
#: independent re-implementation of the original full-sequence forward (tests/custom_rm_replicas.py).
_CUSTOM_REPLICA = "tests/test_custom_heads.py::test_cli_scan_of_a_replica"

MODELS: dict[str, RewardModel] = {m.alias: m for m in [
    # The papers' ten (paper_a_reward_models.yaml; METHODS.md for the classes and score reads).
    RewardModel("N-Gem-27B", "nicolinho/QRM-Gemma-2-27B", "gemma-2-27b", "qrm", None, _PAPERS.format(2),
                revision="eef8d852e886240e308a57b61d69f0e58489f0ed", template=_GEMMA2_TMPL +
                "; gates on <end_of_turn>\\n<start_of_turn>model\\n",
                replica_test=_CUSTOM_REPLICA),
    RewardModel("S-Gem-27B-v0.2", "Skywork/Skywork-Reward-Gemma-2-27B-v0.2", "gemma-2-27b", "score",
                "Gemma2ForSequenceClassification", _PAPERS.format(3), params_b=27.2, template=_GEMMA2_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Gem-27B", "Skywork/Skywork-Reward-Gemma-2-27B", "gemma-2-27b", "score",
                "Gemma2ForSequenceClassification", _PAPERS.format(5), template=_GEMMA2_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Lla-8B-v0.2", "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "llama-3.1-8b", "score",
                "LlamaForSequenceClassification", _PAPERS.format(10), params_b=7.5, template=_LLAMA31_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("N-Lla-8B", "nicolinho/QRM-Llama3.1-8B", "llama-3.1-8b", "qrm", "LlamaForRewardModelWithGating",
                _PAPERS.format(11), revision="74280eebb9580bfecff5d0b2edb81f7d6186a204", template=_LLAMA31_TMPL,
                replica_test=_CUSTOM_REPLICA),
    RewardModel("L-Lla-8B", "LxzGordon/URM-LLaMa-3.1-8B", "llama-3.1-8b", "urm", None, _PAPERS.format(12),
                template=_LLAMA31_TMPL,
                replica_test=_CUSTOM_REPLICA),
    RewardModel("R-Lla-8B", "Ray2333/GRM-Llama3-8B-rewardmodel-ft", "llama-3-8b", "score",
                "LlamaForSequenceClassification", _PAPERS.format(17), template=_LLAMA3_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("R-Lla-3B", "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft", "llama-3.2-3b", "score",
                "LlamaForSequenceClassification", _PAPERS.format(19), template=_LLAMA31_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("F-Lla-8B-v0.1", "RLHFlow/ArmoRM-Llama3-8B-v0.1", "llama-3-8b", "armorm",
                "LlamaForRewardModelWithGating", _PAPERS.format(20),
                revision="39aadadd6d1b66ab358f0b4ce8899624c35c7434", params_b=7.51, template=_LLAMA3_TMPL,
                replica_test=_CUSTOM_REPLICA),
    RewardModel("R-Gem-2B", "Ray2333/GRM-gemma2-2B-rewardmodel-ft", "gemma-2-2b", "score",
                "Gemma2ForSequenceClassification", _PAPERS.format(31), template=_GEMMA2_TMPL,
                replica_test=_SCORE_REPLICA),
    # RewardBench 2's open leaders: Skywork-Reward-V2 (eight models; base models per its model card).
    RewardModel("S-Lla-8B-V2", "Skywork/Skywork-Reward-V2-Llama-3.1-8B", "llama-3.1-8b", "score",
                "LlamaForSequenceClassification", _RB2, template=_LLAMA31_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Lla-8B-V2-40M", "Skywork/Skywork-Reward-V2-Llama-3.1-8B-40M", "llama-3.1-8b", "score",
                "LlamaForSequenceClassification", _RB2, template=_LLAMA31_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Lla-1B-V2", "Skywork/Skywork-Reward-V2-Llama-3.2-1B", "llama-3.2-1b", "score",
                "LlamaForSequenceClassification", _RB2, template=_LLAMA31_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Lla-3B-V2", "Skywork/Skywork-Reward-V2-Llama-3.2-3B", "llama-3.2-3b", "score",
                "LlamaForSequenceClassification", _RB2, template=_LLAMA31_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Qwe-0.6B-V2", "Skywork/Skywork-Reward-V2-Qwen3-0.6B", "qwen3-0.6b", "score",
                "Qwen3ForSequenceClassification", _RB2, template=_QWEN3_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Qwe-1.7B-V2", "Skywork/Skywork-Reward-V2-Qwen3-1.7B", "qwen3-1.7b", "score",
                "Qwen3ForSequenceClassification", _RB2, template=_QWEN3_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Qwe-4B-V2", "Skywork/Skywork-Reward-V2-Qwen3-4B", "qwen3-4b", "score",
                "Qwen3ForSequenceClassification", _RB2, template=_QWEN3_TMPL,
                replica_test=_SCORE_REPLICA),
    RewardModel("S-Qwe-8B-V2", "Skywork/Skywork-Reward-V2-Qwen3-8B", "qwen3-8b", "score",
                "Qwen3ForSequenceClassification", _RB2, template=_QWEN3_TMPL,
                replica_test=_SCORE_REPLICA),
]}


def find(name: str) -> RewardModel | None:
    """The known reward model called ``name``: its alias, hub id, or the hub id's model name (any case)."""
    key = str(name).strip().lower()
    for m in MODELS.values():
        if key in (m.alias.lower(), m.hub_id.lower(), m.hub_id.split("/")[-1].lower()):
            return m
    return None


def names() -> list[str]:
    """The aliases, in table order (the papers' ten by RewardBench rank, then the leaders)."""
    return list(MODELS)


def config_of(name: str) -> tuple[str, dict]:
    """(canonical name, a copy of the full config) of a base architecture (:data:`BASES`) or a known
    reward model (alias, hub id or hub name); ValueError naming the choices otherwise."""
    key = str(name).strip()
    if key in BASES:
        return key, _copy(BASES[key].config)
    known = find(key)
    if known is None:
        raise ValueError(f"unknown model {name!r}: pass an alias of `rmfast models` (e.g. {names()[0]}) "
                         f"or a base architecture ({', '.join(BASES)})")
    return known.alias, known.config()


def count_params(config: dict, kind: str = "classifier") -> int:
    """Parameters of a Llama / Gemma 2 / Qwen3 decoder of ``config``, counted from the config (no torch, no
    model): embedding, per layer q/k/v/o + gate/up/down + norms (Gemma 2: 4 per layer; Qwen3: 2 + the q/k
    norms over head_dim), final norm, and the head: ``"classifier"`` a (hidden, 1) score head,
    ``"causal_lm"`` the LM head unless tied. tests/test_registry.py checks it against the parameters of
    the model transformers builds from the same config.

        >>> count_params(BASES["llama-3.1-8b"].config, "causal_lm")
        8030261248
    """
    c = config
    if c.get("attention_bias") or c.get("mlp_bias"):
        raise ValueError("count_params counts bias-free layers only")
    dm = model_dims(c)
    d, v, hd = dm.hidden, dm.vocab, dm.head_dim
    q, kv = dm.q_width, dm.kv_width
    norms = {"gemma2": 4 * d, "qwen3": 2 * d + 2 * hd}.get(c["model_type"], 2 * d)
    layer = 2 * d * q + 2 * d * kv + 3 * d * dm.intermediate + norms
    head = d if kind == "classifier" else (0 if c.get("tie_word_embeddings") else v * d)
    return v * d + dm.layers * layer + d + head


def short_revision(revision: str | None) -> str | None:
    """A pinned commit's first 12 hex digits (enough to tell commits apart, short enough for a table or a
    message); None where none is pinned."""
    return revision[:12] if revision else None


def how_to_get(m: RewardModel) -> str:
    """One line: how to put ``m`` in this machine's Hugging Face cache."""
    rev = f" --revision {m.revision}" if m.revision else ""
    return (f"'{m.alias}' is {m.hub_id}{'@' + short_revision(m.revision) if m.revision else ''}, not in the local Hugging Face "
            f"cache: on a machine with the hub run `hf download {m.hub_id}{rev}`, then copy its cache "
            f"(~/.cache/huggingface/hub, or $HF_HUB_CACHE) here or pass the downloaded folder")
