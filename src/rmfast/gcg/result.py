"""What a GCG search returns (:class:`GCGResult`, :class:`RandomSearchResult`), its JSON and its plot.

:func:`rmfast.gcg.run` and :func:`rmfast.gcg.random_search` build them; both are importable from
:mod:`rmfast.gcg`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GCGResult", "GCGInterrupted", "RandomSearchResult", "search_timing"]


def search_timing(s, wall: float, setup_s: float) -> dict:
    """A search's (:class:`rmfast.gcg.search._Search`) times: wall and set-up, per step, the gradient / filter /
    evaluation split, and the evaluation outside the steps (each restart's start), so that the parts add up."""
    n_steps = len(s.step_times)
    probe = s.plan.pad_probe_s  # a one-off measurement inside the first short evaluation, not the search's rate
    t_eval = max(s.t_eval - probe, 0.0)
    return {
        "wall_s": round(wall, 3),
        "setup_s": round(setup_s, 3),
        "prompt_encode_s": round(s.prefix_s, 4),
        "steps": n_steps,
        "per_step_s": round(sum(s.step_times) / n_steps, 4) if n_steps else None,
        "gradient_s": round(s.t_grad, 3),
        "sample_filter_s": round(s.t_filter, 3),
        "evaluate_s": round(t_eval, 3),
        "evaluate_in_steps_s": round(min(max(s.t_eval_steps, 0.0), t_eval), 3),
        "evaluated_per_s": round(s.n_eval / t_eval, 1) if t_eval > 0 else None,
        "pad_probe_s": round(probe, 3),
        "step_s": [round(x, 4) for x in s.step_times],
        "unfinished_step_s": round(s.unfinished_step_s, 3),
    }


@dataclass
class GCGResult:
    """What a GCG run found.

    Attributes:
        best_ids, best_text, best_score: the best response over all restarts (engine score, or
            full-sequence score with evaluator "full").
        best_score_reference: the same ids rescored by the plain-HF reference path.
        trajectory: best score after each step of the best restart (index 0: the initial response).
        restarts: per restart: best ids/text/score, trajectory, evaluations, steps run, stop reason.
        n_evaluated: candidates scored in total (initial responses included).
        n_skipped_duplicate, n_rejected_retokenize: candidates skipped before evaluation.
        n_nonfinite: candidates whose score came out NaN or +-inf (kept out of the buffer; never the best).
        config: the GCGConfig as a dict. manifest: model, prompt, template, head, dtype, device, versions.
        timing: wall_s, setup_s, per_step_s and the gradient / filter / evaluation split.
        baseline: None, or what a baseline of the same budget found (``rmfast gcg --baseline random``:
            method, n_evaluated, best_ids, best_text, best_score, wall_s).
        interrupted: True where Ctrl-C stopped the search: the best so far (the restart it stopped in says
            "interrupted"; restarts after it never ran).
    """

    best_ids: list[int]
    best_text: str
    best_score: float
    best_score_reference: float | None
    trajectory: list[float]
    restarts: list[dict]
    n_evaluated: int
    n_skipped_duplicate: int
    n_rejected_retokenize: int
    config: dict
    n_nonfinite: int = 0
    manifest: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    baseline: dict | None = None
    interrupted: bool = False

    def to_dict(self) -> dict:
        """The result as plain dicts and lists (JSON-ready)."""
        return dataclasses.asdict(self)

    def to_json(self, path: str | os.PathLike, overwrite: bool = True) -> Path:
        """Write the result as JSON, atomically."""
        from ..io import check_output, write_json

        p = check_output(path, overwrite)
        write_json(p, self.to_dict())
        return p

    def plot(self, path: str | os.PathLike) -> Path:
        """Best score per step, one line per restart (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..io import atomic_write
        from ..scoring.results import model_label

        fig, ax = plt.subplots(figsize=(7, 4))
        for i, r in enumerate(self.restarts):
            ax.plot(range(len(r["trajectory"])), r["trajectory"], lw=1.5, label=f"restart {i}")
        direction = "maximize" if self.config.get("maximize", True) else "minimize"
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers (a short run had 0.25s)
        ax.set_xlabel("step")
        ax.set_ylabel(f"best reward ({self.manifest.get('head', '?')} head)")
        ax.set_title(f"GCG {direction}: {model_label(self.manifest)}  best {self.best_score:.4f}", fontsize=10)
        if len(self.restarts) > 1:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        p = Path(path)
        atomic_write(p, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
        plt.close(fig)
        return p


@dataclass
class RandomSearchResult:
    """Best of ``n_evaluated`` random responses (same allowed tokens and filter as GCG)."""

    best_ids: list[int]
    best_score: float
    n_evaluated: int
    scores: list[float]
    best_text: str = ""  # the text that renders to best_ids in the template (else their decoded text)


class GCGInterrupted(KeyboardInterrupt):
    """A search stopped by Ctrl-C (SIGINT) once something was scored: ``result`` is what it had found
    (``result.interrupted`` is True; the restart it stopped in says ``stopped: "interrupted"``). ``rmfast gcg``
    writes it; ``--init`` with its best text goes on from there."""

    def __init__(self, result: GCGResult):
        super().__init__("gcg interrupted")
        self.result = result
