"""GCG's settings: :class:`GCGConfig`, every option with its default, checked in one place."""

from __future__ import annotations

import math

from dataclasses import dataclass

from ..errors import UserError

# --------------------------------------------------------------------------------------------
# configuration (the results are in rmfast.gcg.result)


@dataclass
class GCGConfig:
    """Every option of a GCG run, with its default.

    Attributes:
        length: response length in tokens (default 20). Ignored when ``init`` is given: the
            init text's token count (in template context) is the length.
        steps: optimization steps per restart (default 250).
        search_width: candidates sampled per step (default 512).
        topk: substitutions kept per position from the gradient (default 256).
        n_replace: positions replaced in each candidate (default 1).
        buffer_size: best distinct sequences kept; steps start from them (default 4).
        patience: steps without improvement that end a restart (default 50).
        restarts: independent restarts; the best over all is reported (default 1).
        seed: random seed; restart r uses seed + r (default 0).
        maximize: True to maximize the reward, False to minimize it (default True).
        allow_non_ascii: allow tokens whose text is not printable ASCII (default False).
        allow_special: allow special / added tokens (default False).
        retokenize_filter: drop candidates whose decoded text re-encodes (in template context)
            to different ids (default True).
        init: initial response text (default None: random allowed tokens, re-tokenization
            consistent, a different draw per restart). With ``init``, restart 0 starts from it
            and later restarts from random draws.
        init_strings: several initial responses (default None), all of one token length in
            context: restart 0 scores them all and starts from the best (its buffer holds the
            best ``buffer_size``), as the fork's list of initializations. Not with ``init``.
        greedy: candidates are the ``search_width`` best (position, token) pairs of the whole
            gradient matrix, one swap each, walking further down past already-seen ones (the
            fork's "faster" mode; needs n_replace 1; topk unused). Default False: random sampling.
        distance_penalty: w, adding ``w * ||E[cur_p] - E[v]||_2`` (embedding weight rows) to the loss
            gradient before choosing (default 0.0: none; the fork used 4.5 on its squared-error
            gradient, see :mod:`rmfast.gcg.select`).
        compat: None (default) or "authors": the gradient is the fork's, of ``(reward - 30)**2`` in
            both directions (its sign bug: minimizing still proposes reward-raising swaps).
        batch_size: rows per evaluation batch, or "auto" (default "auto": :mod:`rmfast.scoring.plan`'s rule).
        head: "auto" (default: score for classifiers, logprob for causal LMs), "score" or "logprob".
        head_index: which output of a multi-output score head (default 0).
        template: None (the tokenizer's chat template, default), a Jinja template or a plain
            format such as ``"User: {prompt}\\nAssistant: {response}"``.
        system: system message (default None).
        engine: how candidates are scored: "auto" (default: the shared-prompt engine "fast" where the
            architecture is supported, else "hf": full sequences through ``model(...)``), "fast" or "hf".
        compile: the fast engine's compiled CPU layer: "auto" (default: compiled on the CPU kinds where it was
            measured to pay, :data:`rmfast.scoring.decisions.COMPILE_CPU_KINDS`, else eager), "on" or "off".
        attention, kernels, projections: the rows' attention form, the fused kernels and the weight layout
            (default "auto"; as for ``rmfast scan``).
        The scoring options among these reach the plan as one value: :meth:`scoring`.
    """

    length: int = 20
    steps: int = 250
    search_width: int = 512
    topk: int = 256
    n_replace: int = 1
    buffer_size: int = 4
    patience: int = 50
    restarts: int = 1
    seed: int = 0
    maximize: bool = True
    allow_non_ascii: bool = False
    allow_special: bool = False
    retokenize_filter: bool = True
    init: str | None = None
    init_strings: list[str] | None = None
    greedy: bool = False
    distance_penalty: float = 0.0
    compat: str | None = None
    batch_size: int | str = "auto"
    head: str = "auto"
    head_index: int = 0
    template: str | None = None
    system: str | None = None
    engine: str = "auto"
    compile: str = "auto"
    attention: str = "auto"
    kernels: str = "auto"
    projections: str = "auto"

    def scoring(self):
        """The scoring options of this search (evaluation and gradient) as one value
        (:class:`rmfast.scoring.options.ScoringOptions`; validated there). ``compat`` is GCG's own (the fork's
        loss), not a scoring option."""
        from ..scoring.options import ScoringOptions  # here, not on import: `rmfast --help` reads the defaults

        return ScoringOptions(head=self.head, head_index=self.head_index, engine=self.engine, compile=self.compile,
                              batch_size=self.batch_size, attention=self.attention, kernels=self.kernels,
                              projections=self.projections)

    def validate(self) -> None:
        """Raise UserError (one line) for an impossible setting."""
        for name, flag in (("length", "--length"), ("steps", "--steps"), ("search_width", "--search-width"),
                           ("topk", "--topk"), ("n_replace", "--n-replace"), ("buffer_size", "--buffer-size"),
                           ("patience", "--patience"), ("restarts", "--restarts")):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{flag} must be an integer >= 1 (got {v!r})")
        self.scoring()  # the scoring options' one validation
        if self.init is not None and not self.init.strip():
            raise UserError("--init is empty; give a starting response text or leave it out")
        self._validate_fork_options()

    def _validate_fork_options(self) -> None:
        if self.init_strings is not None:
            if self.init is not None:
                raise UserError("--init and --init-strings both given; use one")
            if not self.init_strings or any(not isinstance(t, str) or not t.strip() for t in self.init_strings):
                raise UserError("--init-strings needs one or more non-empty response texts")
        if self.greedy and self.n_replace != 1:
            raise UserError(f"--greedy-candidates swaps one position per candidate; drop --n-replace {self.n_replace}")
        if (not isinstance(self.distance_penalty, (int, float)) or not math.isfinite(self.distance_penalty)
                or self.distance_penalty < 0):  # NaN compares false with everything: checked by name
            raise UserError(f"--distance-penalty must be a number >= 0 (got {self.distance_penalty!r})")
        if self.compat not in (None, "authors"):
            raise UserError(f"unknown --compat {self.compat!r} for gcg; use authors")
