"""Analyses of reward-model scans: the findings of both papers as tidy DataFrames.

Every analysis takes the tidy scan frame (model, prompt, token_id, text, score, rank;
see :mod:`rmfast.analysis.scans`) and returns a dataclass of tidy DataFrames plus a
ledger of the rows it dropped and why:

=================  ==========================================  ==========================
name (CLI)         function                                    papers' figure
=================  ==========================================  ==========================
distributions      :func:`distributions`                       A Fig. 1 (violins)
agreement          :func:`agreement`                           A Fig. 2 (tau, MDS, RSA)
sentiment          :func:`sentiment`                           A Fig. 3A–C (framing)
exposure           :func:`exposure`                            A Fig. 3D (mere exposure)
best-worst         :func:`best_worst`                          A Fig. 4
human              :func:`human_comparison`                    A Fig. 5 (EloEverything)
categories         :func:`categories`                          B (Big Two, MFD 2.0)
extremes           :func:`extremes`                            A/B top/bottom tables
=================  ==========================================  ==========================

scipy, matplotlib and statsmodels (the ``[analysis]`` extra) are imported only when an
analysis runs, so ``import rmfast.analysis`` is cheap.

Example (the EloEverything data: 10 reward models x 3 prompts x 7,530 items):
    >>> from rmfast.analysis import load_eloeverything, human_comparison
    >>> data = load_eloeverything("../shared/data/eloeverything")
    >>> corr = human_comparison(data.scans, data.human).correlations
    >>> corr.shape, round(float(corr["spearman_rho"].max()), 3)  # one row per model x prompt
    ((30, 7), 0.546)
"""

from __future__ import annotations

# Eager imports: these modules need only numpy/pandas at import time (scipy, matplotlib
# and statsmodels load inside the functions). Binding the functions after the imports
# keeps e.g. ``rmfast.analysis.distributions`` the function, not its module.
from .agreement import AgreementResult, agreement
from .best_worst import BestWorstResult, best_worst
from .categories import CategoryResult, categories, permutation_test
from .distributions import DistributionResult, distributions
from .eloeverything import HumanData, load_eloeverything, load_human_scores
from .exposure import ExposureResult, exposure
from .extremes import ExtremesResult, extremes
from .human import HumanResult, human_comparison
from .ledger import Ledger
from .lexicons import load_afinn, load_dictionary, load_frequencies, normalize_word
from .mds import mds
from .metadata import load_model_metadata, match_metadata
from .rbo import rbo
from .results import Result
from .rsa import rsa_test
from .scans import load_scans, select, validate_scans
from .sentiment import SentimentResult, sentiment
from .shared_vocab import shared_vocabulary

__all__ = [
    "AgreementResult", "BestWorstResult", "CategoryResult", "DistributionResult",
    "ExposureResult", "ExtremesResult", "HumanData", "HumanResult", "Ledger", "Result",
    "SentimentResult", "agreement", "best_worst", "categories", "distributions", "exposure",
    "extremes", "human_comparison", "load_afinn", "load_dictionary", "load_eloeverything",
    "load_frequencies", "load_human_scores", "load_model_metadata", "load_scans",
    "match_metadata", "mds", "normalize_word", "permutation_test", "rbo", "rsa_test",
    "select", "shared_vocabulary", "sentiment", "validate_scans",
]
