"""Agreement of one model with itself across prompts: Kendall tau-b between prompts (paper A
Fig. A6, EloEverything).

Per model, every pair of prompts is joined on the scored text (de-duplicated within model ×
prompt, as :mod:`..data.shared_vocab` does) and rank-correlated. Paper A's script aligned the
prompts' CSV rows by position (its three files list the items in one order); joining on the
text gives the same pairs there and stays right for inputs in any order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data import deps
from ..data.ledger import Ledger
from ..data.results import Result
from ..data.scans import select, validate_scans
from ..data.shared_vocab import dedupe_text
from ..stats.rank_stats import note_underflow


@dataclass(kw_only=True)
class PromptAgreementResult(Result):
    """Tables:

    pairs: model, prompt_a, prompt_b, n, kendall_tau_b, kendall_p  (unordered prompt pairs)
    """

    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)

    def matrix(self, model: str) -> pd.DataFrame:
        """Prompt × prompt Kendall tau-b matrix of one model (diagonal 1).

        >>> d = pd.DataFrame({"model": "m", "prompt": np.repeat(["p", "q"], 4),
        ...                   "text": list("abcd") * 2, "score": [1.0, 2, 3, 4, 4, 3, 2, 1]})
        >>> prompt_agreement(d).matrix("m")
             p    q
        p  1.0 -1.0
        q -1.0  1.0
        """
        sub = self.pairs[self.pairs["model"] == model]
        if sub.empty:
            raise UserError(f"model {model!r} not in the results; have "
                            f"{list(pd.unique(self.pairs['model']))}")
        ps = list(dict.fromkeys(list(sub["prompt_a"]) + list(sub["prompt_b"])))
        mat = pd.DataFrame(np.eye(len(ps)), index=ps, columns=ps)
        for a, b, v in sub[["prompt_a", "prompt_b", "kendall_tau_b"]].itertuples(index=False):
            mat.loc[a, b] = mat.loc[b, a] = v
        return mat


def prompt_agreement(df: pd.DataFrame, *, models=None, prompts=None) -> PromptAgreementResult:
    """Kendall tau-b between every two prompts of each model, on the texts both scored."""
    stats = deps.stats()
    ledger = Ledger()
    df = dedupe_text(select(validate_scans(df, ledger=ledger), models=models, prompts=prompts),
                     ledger)
    rows = []
    for m in pd.unique(df["model"]):
        wide = df[df["model"] == m].pivot(index="text", columns="prompt", values="score")
        ps = [p for p in pd.unique(df["prompt"]) if p in wide.columns]
        if len(ps) < 2:
            ledger.note(f"model {m!r} has {len(ps)} prompt(s); no prompt pair to compare")
            continue
        for i, a in enumerate(ps):
            for b in ps[i + 1:]:
                both = wide[[a, b]].dropna()
                if len(both) < 3:  # 2 texts give tau = +-1 with p = 1 (agreement and human refuse below 3 too)
                    ledger.note(f"model {m!r}: prompts {a!r} and {b!r} share {len(both)} scored text(s); fewer than "
                                "3: no rank correlation")
                    continue
                kt = stats.kendalltau(both[a], both[b], variant="b")
                rows.append({"model": m, "prompt_a": a, "prompt_b": b, "n": len(both),
                             "kendall_tau_b": float(kt.statistic), "kendall_p": float(kt.pvalue)})
    if not rows:
        raise UserError("no model has two prompts sharing at least 3 scored texts; prompt agreement needs scans of "
                        "one model under at least two prompts, of the same candidates")
    res = PromptAgreementResult(pairs=pd.DataFrame(rows))
    note_underflow(res.pairs, ["kendall_p"], ledger)
    res.take_ledger(ledger)
    return res
