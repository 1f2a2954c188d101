"""Sweeps: many models × prompts × candidate sets into one resumable results store.

:mod:`.config` reads and checks the YAML, :mod:`.runner` scores the parts, :mod:`.store` keeps them
(atomic parts, locks, the manifest), :mod:`.dist` splits work over torchrun ranks.
"""

# imported when first used (PEP 562): ``from rmfast.sweep import dist`` (the CLI's scan) needs neither
_EXPORTS = {"CandSet": "config", "ModelCfg": "config", "SweepConfig": "config", "load_config": "config",
            "with_base": "config", "with_states": "config", "assign": "runner", "frame_from_scan": "runner",
            "frame_from_texts": "runner", "model_content": "runner", "run_sweep": "runner", "summarize": "runner"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    import importlib

    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
