"""Sweeps: many models × prompts × candidate sets into one resumable results store.

:mod:`.config` reads and checks the YAML, :mod:`.runner` scores the parts, :mod:`.store` keeps them
(atomic parts, locks, the manifest), :mod:`.dist` splits work over torchrun ranks.
"""

from .config import CandSet, ModelCfg, SweepConfig, load_config, with_base, with_states
from .runner import assign, frame_from_scan, frame_from_texts, model_content, run_sweep, summarize

__all__ = ["CandSet", "ModelCfg", "SweepConfig", "load_config", "with_base", "with_states", "assign", "frame_from_scan",
           "frame_from_texts", "model_content", "run_sweep", "summarize"]
