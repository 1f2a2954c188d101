"""verl's custom reward function, backed by ``rmfast serve``: ``compute_score`` posts the sample to the server's
``/v1/score`` and returns its score.

In the trainer's config (docs/serving.md)::

    custom_reward_function:
      path: /path/to/site-packages/rmfast/integrations/verl.py   # python -c "import rmfast.integrations.verl as v; print(v.__file__)"
      name: compute_score
      reward_kwargs:
        url: http://127.0.0.1:8000

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`` per sample.
``compute_score`` is an ``async def``, for verl's reward loop, which awaits one (and sends many at once);
``compute_score_sync`` is the same for a reward manager that calls it plainly (``NaiveRewardManager``), or by hand. The reward model needs the prompt the response answers: it is read from
``extra_info["prompt"]`` (a string or chat messages; another key with ``reward_kwargs`` ``prompt_key``), or given as
``prompt=``. A sample without it is refused in one line, never scored against another field: verl's own gsm8k data
keeps a ``question`` in ``extra_info`` without the instruction the policy's prompt adds (0.876 against 1.098 for one
response, in a walkthrough). The server
gathers the samples of a GRPO group, however verl interleaves them, and encodes their prompt once.

For verl's own reward-model worker that calls a vLLM server's ``/classify`` with the text already in the RM's
template, point it at ``rmfast serve`` instead: the route and its JSON are vLLM's.
"""

from __future__ import annotations

import os

from ..errors import UserError
from ..scoring.candidates import TooLong
from .remote import API_KEY_ENV, BodyTooLarge, Retries, ServerAnswer, _headers, httpx_module

#: where the server is, when ``reward_kwargs`` do not say (``url``)
URL_ENV = "RMFAST_URL"


def _too_long(e, too_long_score):
    """A response the server refuses as too long (413): ``too_long_score`` where given (said in one warning), else the
    server's one line, naming the option. verl needs a number for every sample, so the default stops the step."""
    import warnings

    if too_long_score is None:
        raise ServerAnswer(f"{e.cli_message()}; to score such a response instead of stopping, give reward_kwargs "
                        "too_long_score (a number), or raise the server's limit") from None
    if too_long_score not in _SAID_TOO_LONG:  # once a process and value, not once per response's length
        _SAID_TOO_LONG.add(too_long_score)
        warnings.warn(f"rmfast verl reward: a response longer than the reward model reads is given too_long_score "
                      f"{too_long_score} (said once; the first: {e.cli_message()})", UserWarning, stacklevel=3)
    return too_long_score


_SAID_TOO_LONG: set = set()  # the too_long_score values said so far (_too_long)


def _check_too_long_score(x) -> float | None:
    """``too_long_score`` as a finite float (checked before the first request: "low" had raised a bare ValueError
    mid-step, and NaN went to verl as a reward), or None."""
    import math

    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v):
        raise UserError(f"rmfast verl reward: too_long_score {x!r}: give a finite number (or none: such a response "
                        "then stops the step with the server's error)")
    return v


#: extra_info keys that hold a question, not necessarily the prompt the policy saw: named in the error, never read
#: (verl's own gsm8k preprocessing keeps the question there without the instruction the policy's prompt adds)
NOT_THE_PROMPT = ("question", "raw_prompt", "problem")


def _prompt_of(extra_info, prompt, prompt_key: str = "prompt"):
    """The prompt the sample answers: ``prompt=``, else ``extra_info[prompt_key]`` (a string or chat messages)."""
    if prompt is not None:
        return prompt
    info = extra_info if hasattr(extra_info, "get") else {}
    v = info.get(prompt_key)
    if isinstance(v, str) and v:
        return v
    if v is not None and not isinstance(v, (str, bytes, dict)) and hasattr(v, "__len__") and len(v):
        # chat messages: a list, a tuple, or the numpy array of dicts a Parquet list column gives through pandas
        if all(hasattr(m, "keys") for m in v):
            return [dict(m) for m in v]
        bad = next(m for m in v if not hasattr(m, "keys"))
        raise UserError(f"rmfast verl reward: extra_info[{prompt_key!r}] is a sequence holding a {type(bad).__name__} "
                        f"({str(bad)[:40]!r}), not chat messages: give a string, or messages as "
                        "[{'role': 'user', 'content': ...}]")
    other = [k for k in NOT_THE_PROMPT if k != prompt_key and info.get(k)]
    hint = (f" (it has {other[0]!r}, which may not be the prompt the policy saw: verl's own gsm8k data keeps the "
            f"question there without the instruction; if it is that prompt, set reward_kwargs prompt_key: {other[0]})"
            if other else "")
    raise UserError(f"rmfast verl reward: no prompt for this sample: extra_info has no {prompt_key!r}{hint}; put the "
                    "policy's prompt in the dataset's extra_info['prompt'] (a string or chat messages), or pass prompt=")


def _setup(extra_info, prompt, solution_str, url, prompt_key: str = "prompt"):
    """(the server's address, the /v1/score body) of one sample."""
    url = (url or os.environ.get(URL_ENV) or "").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"rmfast verl reward: give the server as reward_kwargs url: http://host:port (or ${URL_ENV})")
    # compat: a sampled response never stops training (one that merges with the template, an empty one: scored)
    return url, {"conversations": [{"prompt": _prompt_of(extra_info, prompt, prompt_key), "responses": [solution_str]}],
                 "compat": "decode-retokenize"}


async def compute_score(data_source=None, solution_str: str = "", ground_truth=None, extra_info=None, *,
                        url: str | None = None, api_key: str | None = None, prompt=None, timeout_s: float = 180.0,
                        retries: int | None = None, prompt_key: str = "prompt", too_long_score: float | None = None,
                        **_ignored) -> float:
    """The reward model's score of ``solution_str`` as the answer to the sample's prompt (module doc), for verl's
    reward loop, which awaits it. A server error is one UserError naming it (a non-finite score is one: never a
    silent 0); an empty response is scored as an empty assistant turn; one longer than the server reads is
    ``too_long_score`` where given (with a warning), else that error. :func:`compute_score_sync` is the same for a
    caller that does not await."""
    import asyncio

    httpx = httpx_module()
    too_long_score = _check_too_long_score(too_long_score)
    url, body = _setup(extra_info, prompt, solution_str, url, prompt_key)
    tries = Retries(url, retries, timeout_s)
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for wait in tries.waits():
            await asyncio.sleep(wait)
            try:
                r = await client.post(f"{url}/v1/score", json=body, headers=_headers(api_key), timeout=tries.timeout())
            except httpx.HTTPError as e:
                r = e
            try:
                if tries.answer(r) is not None:
                    return float(r.json()["scores"][0][0])
            except (TooLong, BodyTooLarge) as e:  # one sample a request: past the body cap is too long too
                return _too_long(e, too_long_score)
    raise tries.gave_up()


def compute_score_sync(data_source=None, solution_str: str = "", ground_truth=None, extra_info=None, *,
                       url: str | None = None, api_key: str | None = None, prompt=None, timeout_s: float = 180.0,
                       retries: int | None = None, prompt_key: str = "prompt", too_long_score: float | None = None,
                       **_ignored) -> float:
    """:func:`compute_score` for a caller that does not await: verl's ``NaiveRewardManager``
    (``custom_reward_function.name: compute_score_sync``), a notebook."""
    import time

    httpx = httpx_module()
    too_long_score = _check_too_long_score(too_long_score)
    url, body = _setup(extra_info, prompt, solution_str, url, prompt_key)
    tries = Retries(url, retries, timeout_s)
    with httpx.Client(timeout=timeout_s) as client:
        for wait in tries.waits():
            time.sleep(wait)
            try:
                r = client.post(f"{url}/v1/score", json=body, headers=_headers(api_key), timeout=tries.timeout())
            except httpx.HTTPError as e:
                r = e
            try:
                if tries.answer(r) is not None:
                    return float(r.json()["scores"][0][0])
            except (TooLong, BodyTooLarge) as e:  # one sample a request: past the body cap is too long too
                return _too_long(e, too_long_score)
    raise tries.gave_up()


__all__ = ["compute_score", "compute_score_sync", "API_KEY_ENV", "URL_ENV"]
