"""Analyses of reward-model scans: the findings of both papers as tidy DataFrames.

Every analysis takes the tidy scan frame (model, prompt, token_id, text, score, rank;
see :mod:`rmfast.analysis.data.scans`) and returns a dataclass of tidy DataFrames plus a
ledger of the rows it dropped and why. The analyses (:mod:`rmfast.analysis.registry`, one line each):

<the registry's table>

A new analysis is one module and one line in the registry. The modules, by role (each layer imports only
the ones below it: pyproject.toml's import-linter contract):

* :mod:`.report` (``rmfast report``) and :mod:`.reproduce` (``rmfast reproduce``);
* :mod:`.paper_a`, :mod:`.paper_b` (each paper's analyses, published data, figures and reproduction) and
  :mod:`.representations` (hidden-state similarity, the reward lens);
* :mod:`.render` (figures, the report's HTML pieces) and :mod:`.stats` (the statistics both papers use);
* :mod:`.data` (scans, lexicons, metadata, framing, the shared vocabulary, the ledger and result shapes).

scipy, matplotlib and statsmodels (the ``[analysis]`` extra) are imported only when an
analysis runs, and the names below on first use, so ``import rmfast.analysis`` is cheap (no pandas).

Example (the EloEverything data: 10 reward models x 3 prompts x 7,530 items):
    >>> from rmfast.analysis import load_eloeverything, human_comparison
    >>> data = load_eloeverything("../shared/data/eloeverything")
    >>> corr = human_comparison(data.scans, data.human).correlations
    >>> corr.shape, round(float(corr["spearman_rho"].max()), 3)  # one row per model x prompt
    ((30, 7), 0.546)
"""

from __future__ import annotations

from . import registry as _registry

if __doc__:  # None under python -OO
    __doc__ = __doc__.replace("<the registry's table>", _registry.table())

# The public API, imported on first use (PEP 562): ``import rmfast.analysis`` (and the registry, which
# the CLI's parser reads) imports neither pandas nor any analysis. name -> its module.
_API = {
    "agreement": "paper_a.agreement", "AgreementResult": "paper_a.agreement",
    "best_worst": "paper_a.best_worst", "BestWorstResult": "paper_a.best_worst",
    "categories": "paper_b.categories", "CategoryResult": "paper_b.categories",
    "permutation_test": "paper_b.categories",
    "distributions": "paper_a.distributions", "DistributionResult": "paper_a.distributions",
    "HumanData": "paper_a.eloeverything", "load_eloeverything": "paper_a.eloeverything",
    "load_human_scores": "paper_a.eloeverything",
    "exposure": "paper_a.exposure", "ExposureResult": "paper_a.exposure",
    "extremes": "paper_a.extremes", "ExtremesResult": "paper_a.extremes",
    "human_comparison": "paper_a.human", "HumanResult": "paper_a.human",
    "sentiment": "paper_a.sentiment", "SentimentResult": "paper_a.sentiment",
    "Ledger": "data.ledger", "Result": "data.results",
    "load_afinn": "data.lexicons", "load_dictionary": "data.lexicons", "load_frequencies": "data.lexicons",
    "normalize_word": "data.lexicons",
    "load_model_metadata": "data.metadata", "match_metadata": "data.metadata",
    "load_scans": "data.scans", "select": "data.scans", "validate_scans": "data.scans",
    "shared_vocabulary": "data.shared_vocab",
    "mds": "stats.mds", "rbo": "stats.rbo", "rsa_test": "stats.rsa",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    import importlib

    if name in _API:
        value = getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
