"""A TRL ``reward_funcs`` entry for GRPO backed by :class:`rmfast.scoring.scorer.RewardScorer`.

TRL calls each reward function as ``f(prompts=..., completions=..., completion_ids=..., **columns)``
and wants one float per completion. GRPO repeats every prompt ``num_generations`` times, so a batch
holds a few prompts with many completions each: exactly the shape the scorer encodes once per
prompt. Both of TRL's dataset formats are taken:

- plain: ``prompts`` are strings (the user turn), ``completions`` strings;
- conversational: ``prompts`` are lists of chat messages ending with the user's, ``completions`` are
  lists holding one assistant message (``[{"role": "assistant", "content": "..."}]``).

The rule, one for every completion: **a completion never stops training**. An empty completion gets
None (nothing to score; TRL skips it); a completion that merges with the template around it when
tokenized in context (e.g. one that starts with whitespace) is scored as the template renders it
(``compat="decode-retokenize"`` for every call, whatever the scorer's own ``compat``: a scorer passed in
keeps its strict mode for its other callers). What stops training is the reward model, not a
completion: a score that comes out NaN or infinite (a numeric overflow in the reward model, e.g.
float16 past 65,504) stops training with one line (:class:`rmfast.errors.UserError`) by default:
TRL sums its reward functions with ``nansum``, so beside other reward functions a NaN from this one would
count as 0. ``nonfinite="warn"`` goes on instead, with one warning per call and None for those completions
(TRL 1.16: a completion that every reward function gives None is unscorable and gets advantage 0; beside
other reward functions, this one's None counts as 0).

A completion longer than the reward model takes (its positions, with the prompt and the template around it, or
the scorer's ``max_tokens``) gets None too, with one warning per call: a score of a truncated completion would not
be the reward model's score of what the policy wrote.

A completion of several messages (a tool call and its result, then the answer) or an assistant message
without text content gets None too, with one warning per call: the scorer scores one assistant turn of
text, and a score of part of it would not be the reward model's. A thinking policy's message with its reasoning
beside the answer (``reasoning_content``, as TRL's ``parse_response`` gives it) is scored by its answer, with one
note per call.

Example:
    >>> from trl import GRPOConfig, GRPOTrainer  # doctest: +SKIP
    >>> reward = rmfast_reward("Skywork/Skywork-Reward-V2-Qwen3-0.6B", dtype="bfloat16")  # doctest: +SKIP
    >>> trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=GRPOConfig(...), train_dataset=ds)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import warnings

from ..errors import UserError
from ..scoring.batching import nonfinite_line
from ..scoring.candidates import TooLong
from ..scoring.scorer import RewardScorer, as_conversation, as_list
from ..template import lone_surrogate
from .remote import RemoteScorer, is_url

#: what the adapter does with a NaN or infinite score (the module doc's rule)
NONFINITE = ("raise", "warn")


#: a thinking policy's reasoning beside its answer (TRL's parse_response: ``reasoning_content``): the reward model
#: scores the answer, as it scores an assistant message without reasoning (said once per call)
REASONING = ("reasoning_content", "reasoning", "thinking")


def _completion_text(c, k: int) -> str | None:
    """A completion as text: a string, or a conversational completion (one assistant message of text). None
    for one the scorer cannot score whole: several messages (tool calls), or no text content."""
    if isinstance(c, str):
        return c
    msgs = list(c) if isinstance(c, (list, tuple)) else None
    if not msgs or not all(hasattr(m, "get") for m in msgs):
        raise UserError(f"completion {k}: expected a string or a list with one assistant message "
                        "[{'role': 'assistant', 'content': ...}]")
    if msgs[0].get("role", "assistant") != "assistant":
        raise UserError(f"completion {k}: the completion's message must be the assistant's, got {msgs[0].get('role')!r}")
    m = msgs[0]
    # fields besides the text and its reasoning; an empty tool_calls or name leaves one message of text
    extra = [f for f, v in m.items() if f not in ("role", "content", *REASONING) and (v or f not in ("tool_calls", "name"))]
    if len(msgs) != 1 or not isinstance(m.get("content"), str) or extra:
        return None
    return m["content"]


def _reasons(c) -> bool:
    return isinstance(c, (list, tuple)) and len(c) == 1 and hasattr(c[0], "get") and any(c[0].get(k) for k in REASONING)


class GRPOReward:
    """``reward(prompts, completions, **kwargs) -> list[float]``: TRL's reward function signature.

    Completions are grouped by their prompt (equal prompts share one encoding), scored by ``scorer``,
    and returned in TRL's order. ``__name__`` is what TRL logs the reward under (default "rmfast").
    ``nonfinite``: "raise" (default) or "warn", for a NaN or infinite score (the module doc's rule).
    """

    def __init__(self, scorer: RewardScorer, name: str = "rmfast", nonfinite: str = "raise"):
        if nonfinite not in NONFINITE:
            raise UserError(f"nonfinite={nonfinite!r}: give one of {', '.join(NONFINITE)}")
        self.scorer = scorer
        self.__name__ = name
        self.nonfinite = nonfinite

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        prompts = as_list(prompts, "prompts", "prompts (strings or lists of chat messages)")
        completions = as_list(completions, "completions", "completions (strings or lists with one assistant message)")
        if len(prompts) != len(completions):
            raise UserError(f"{len(prompts)} prompts but {len(completions)} completions")
        convs, lists, where = [], [], []  # distinct prompts, their completions, (prompt, slot) per input
        seen: dict = {}
        whole = invalid = 0  # completions that are not one assistant message of text; that are not valid text
        for k, (p, c) in enumerate(zip(prompts, completions)):
            conv = as_conversation(p, f"prompt {k}")
            i = seen.setdefault(conv, len(convs))
            if i == len(convs):
                convs.append(conv)
                lists.append([])
            where.append((i, len(lists[i])))
            text = _completion_text(c, k)
            if text is None:
                whole += 1
            elif lone_surrogate(text) is not None:  # no tokenizer takes it; training goes on
                invalid += 1
                text = None
            lists[i].append(text or "")  # scored as an empty one: None
        if n := sum(map(_reasons, completions)):
            warnings.warn(f"rmfast: note: {self.__name__} reward: {n} of {len(completions)} completions carry reasoning "
                          "(reasoning_content); the reward model scores their content, the answer, as it scores an "
                          "assistant message without reasoning", stacklevel=2)
        if whole:
            warnings.warn(f"rmfast: warning: {self.__name__} reward: {whole} of {len(completions)} completions hold "
                          "several messages (tool calls) or no text; given as None (the scorer scores one assistant "
                          "message of text)", stacklevel=2)
        if invalid:
            warnings.warn(f"rmfast: warning: {self.__name__} reward: {invalid} of {len(completions)} completions are "
                          "not valid text (a lone surrogate: bytes that are not UTF-8); given as None", stacklevel=2)
        # an empty completion (a policy can sample one) has nothing to score: None, which TRL skips
        # (its rewards are summed with nansum) rather than a made-up number
        keep = [[t for t in ts if t.strip()] for ts in lists]
        self._check_prompts(convs, where)
        try:
            by_conv = self._score(convs, keep)
        except TooLong:  # rare: the lengths are measured only then, and the long ones left out
            long = self.scorer.too_long(convs, keep, compat="decode-retokenize")
            n_long = sum(map(sum, long))
            keep = [[t for t, x in zip(ts, xs) if not x] for ts, xs in zip(keep, long)]
            warnings.warn(f"rmfast: warning: {self.__name__} reward: {n_long} of {len(completions)} completions are "
                          "longer than the reward model's positions (with the prompt and template) or max_tokens; given "
                          "as None (a completion never stops training; cap the policy's max_completion_length to "
                          "score them)", stacklevel=2)
            by_conv = self._score(convs, keep)
        pos = [{t: k for k, t in enumerate(ts)} for ts in keep]  # a text left out (empty, too long): None
        out = [by_conv[i][pos[i][lists[i][j]]] if lists[i][j] in pos[i] else None for i, j in where]
        bad = [k for k, r in enumerate(out) if r is not None and not math.isfinite(r)]
        if bad:
            model = getattr(self.scorer, "model", None)  # a server's (RemoteScorer): not known here
            line = nonfinite_line(len(out), bad, range(len(out)), "completions",
                                  "load the reward model with dtype='float32' or 'bfloat16'",
                                  dtype=None if model is None else next(model.parameters()).dtype)
            if self.nonfinite == "raise":
                raise UserError(f"{self.__name__} reward: {line}; TRL would sum a NaN reward as 0 and train on "
                                "it (pass nonfinite='warn' to go on with None for them)")
            warnings.warn(f"rmfast: warning: {self.__name__} reward: {line}; given as None", stacklevel=2)
            bad_set = set(bad)
            out = [None if k in bad_set else r for k, r in enumerate(out)]
        return out

    def _check_prompts(self, convs, where) -> None:
        """A prompt the scorer refuses (already rendered, empty), named by its place in TRL's batch (a local scorer;
        a server names the conversation in its own reply). Too long is not refused here: its completions get None."""
        check = getattr(self.scorer, "template_for", None)
        for i, conv in enumerate(convs if check is not None else ()):
            try:
                check(conv)
            except TooLong:
                pass
            except UserError as e:
                k = next(k for k, (c, _) in enumerate(where) if c == i)
                raise UserError(f"{self.__name__} reward: prompt {k} (of {len(where)}): {e.cli_message()}") from None

    def _score(self, convs, keep) -> list[list[float]]:
        """Scores of the completions ``keep`` (one list per prompt of ``convs``, [] where none is left), same shape."""
        scores = self.scorer.score([c for c, ts in zip(convs, keep) if ts], [ts for ts in keep if ts],
                                   nonfinite="count",  # reported by the caller, per the module doc's rule
                                   compat="decode-retokenize")  # a completion never stops training
        it = iter(scores)
        return [next(it) if ts else [] for ts in keep]


def rmfast_reward(model, *, name: str = "rmfast", nonfinite: str = "raise", **scorer_kw) -> GRPOReward:
    """A GRPO reward function for ``model`` (anything :class:`RewardScorer` takes: an alias, folder, hub
    id, LoadedModel, a (model, tokenizer) pair, or a RewardScorer itself). Empty completions get None
    (TRL skips it); a NaN or infinite score raises (``nonfinite="raise"``) or warns and gives None
    (``"warn"``), the module doc's rule; a completion that merges with the template is scored as the
    template renders it (``compat="decode-retokenize"`` on every call, a scorer passed in included), never
    refused mid-training. ``model`` an address (``"http://host:port"``): the scores come from ``rmfast serve`` there
    (:class:`rmfast.integrations.remote.RemoteScorer`; ``api_key=``, ``timeout_s=``, ``retries=``), not a local model;
    a non-finite score is then the server's error (it never answers one), which stops training."""
    if is_url(model):
        return GRPOReward(RemoteScorer(model, **scorer_kw), name, nonfinite)
    if isinstance(model, RewardScorer) and scorer_kw:  # a scorer is made already: its options are its own
        raise UserError(f"rmfast_reward: {', '.join(sorted(scorer_kw))} apply when rmfast_reward makes the scorer; "
                        "this RewardScorer is made already: pass them to RewardScorer(...) instead")
    scorer = model if isinstance(model, RewardScorer) else RewardScorer(model, **scorer_kw)
    return GRPOReward(scorer, name, nonfinite)


__all__ = ["GRPOReward", "rmfast_reward"]
