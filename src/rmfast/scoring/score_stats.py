"""What one :meth:`rmfast.scoring.scorer.RewardScorer.score` call did: :class:`ScoreStats` (``scorer.last_stats``);
:class:`ResponseLabels`, its responses' places, named on demand (a warning's labels)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ScoreStats:
    """What one :meth:`RewardScorer.score` call did.

    Attributes:
        n_conversations, n_responses: the input's size.
        n_prompts: distinct conversations (each encoded once); ``prompts_from_cache`` of them reused a
            plan from an earlier call.
        n_rows: distinct (conversation, response) rows scored (duplicates are scored once).
        n_batches: forward passes over candidate rows; ``padded_rows``: rows added to fill a batch (0:
            batches hold exactly their rows); ``padded_tokens``: pad tokens of ragged batches (rows of
            similar lengths right-padded to the batch's longest, :func:`rmfast.scoring.batching.length_buckets`); ``packed_batches``:
            batches whose rows ran packed back to back instead (any lengths, no pad token: the fast
            engine's cascade form).
        response_tokens, prompt_tokens: tokens of the rows (response + suffix) and of the call's distinct prompts
            (encoded now or taken from the cache: ``prompt_passes`` says how many were encoded).
        resumed_rows: rows taken from a checkpoint rather than scored.
        n_nonfinite: input responses whose score came out NaN or infinite (returned as NaN; warned about).
        prompt_passes: prompts encoded by this call (each distinct conversation at most once; those
            from the cache not at all).
        wall_s: seconds for the call.
        attention: the attention form the rows ran in (:func:`rmfast.scoring.plan.choose_attention`: e.g.
            "cascade" on CUDA, "cpu-flash" on an eager CPU; "hf" on the plain-HF path; "" if nothing ran).
        decisions: every decision of the plan the rows ran under, with its reason
            (:attr:`rmfast.scoring.plan.ScoringPlan.decisions`; empty if nothing ran).
    """

    n_conversations: int = 0
    n_responses: int = 0
    n_prompts: int = 0
    prompts_from_cache: int = 0
    n_rows: int = 0
    n_batches: int = 0
    padded_rows: int = 0
    response_tokens: int = 0
    prompt_tokens: int = 0
    resumed_rows: int = 0
    wall_s: float = 0.0
    padded_tokens: int = 0
    packed_batches: int = 0
    prompt_passes: int = 0
    n_nonfinite: int = 0
    attention: str = ""
    decisions: dict = field(default_factory=dict)

    @property
    def padding_waste(self) -> float:
        """Fraction of the row tokens run that were padding."""
        return self.padded_tokens / max(1, self.response_tokens + self.padded_tokens)


class ResponseLabels:
    """``labels[k]`` of the k-th input response (row-major): conversation i response j, made on demand."""

    def __init__(self, shape: list[int]):
        self.starts = np.cumsum([0] + list(shape))  # (n_conversations + 1,)

    def __getitem__(self, k: int) -> "_Where":
        i = int(np.searchsorted(self.starts, k, side="right")) - 1
        return _Where(i, k - int(self.starts[i]))


@dataclass(frozen=True)
class _Where:
    """A response's place in a call (not a str: a warning quotes texts, not places)."""

    conversation: int
    response: int

    def __str__(self) -> str:
        return f"conversation {self.conversation} response {self.response}"
