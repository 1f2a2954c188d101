"""A plain ``rmfast scan`` runs functions in at most 25 rmfast files (issue 34; 20 until the padding probe left
``scoring/batching.py`` for a file of its own, ``scoring/padding.py``, when batching passed 650 lines; 21 until the
output's lock left ``io.py`` for ``locks.py``, when io passed 650 lines; 22 until the end of turn read the tokenizer's
special flags from ``template_tail``'s per-tokenizer table of added tokens, its one place, rather than list them again;
23 until the model folder's checks left ``loading/loader.py`` for ``loading/folder_checks.py``, one definition for the
one-device and the ``--device-map`` load, which had skipped them all; 24 until the model's scoring mode, eval mode and no
caller's autocast for the length of a call, became ``scoring/model_mode.py``, one definition for every entry point:
only RewardScorer had set eval mode, and a scan on the plain-HF engine scored with dropout).

Its path is a few modules, each one concept, and it calls into no module of a feature it does not use: the
bf16 audit (``--audit 0``, or an fp32 scan), ``--device-map``, torchrun's ranks, adapter checkpoints, a GGUF
conversion the cache already holds. Measured, never listed: cProfile around the command's own ``run``
(:func:`rmfast.cli.scan.run`), with every rmfast module imported first, so that import-time code (module
bodies, class bodies) is not counted as the scan's path.
"""

from __future__ import annotations

import cProfile
import importlib
import pkgutil
import pstats
from collections import defaultdict
from pathlib import Path

import rmfast

MAX_FILES = 25
PACKAGE = Path(rmfast.__file__).resolve().parent


def _import_every_module() -> None:
    for m in pkgutil.walk_packages(rmfast.__path__, "rmfast."):
        if m.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(m.name)
        except Exception:  # noqa: BLE001 - an optional dependency (triton, an analysis extra) absent here
            pass


def _functions_by_file(profile: cProfile.Profile) -> dict[str, list[tuple[str, int]]]:
    """rmfast file (relative to the package) -> [(function, calls)] of the functions that ran."""
    by_file = defaultdict(list)
    for (filename, _line, name), stat in pstats.Stats(profile).stats.items():
        try:
            rel = Path(filename).resolve().relative_to(PACKAGE)
        except ValueError:  # not rmfast's (torch, transformers, the standard library, "<string>")
            continue
        if name != "<module>":
            by_file[rel.with_suffix("").as_posix()].append((name, stat[1]))
    return dict(by_file)


def test_a_plain_scan_runs_functions_in_at_most_24_files(smollm2, tmp_path, monkeypatch, capsys):
    """The issue's command: SmolLM2 (embedded; converted once by the fixture, which skips where its package is
    absent), 64 token ids, float32, no audit."""
    from rmfast.cli import build_parser
    from rmfast.cli import scan as scan_cmd
    from rmfast.cli.common import run_command

    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    _import_every_module()
    out = tmp_path / "scan.parquet"
    argv = ["scan", "smollm2-135m-instruct", "--token-ids", "0:64", "--dtype", "float32", "--audit", "0",
            "--out", str(out), "--overwrite", "--no-progress", "--top", "0"]
    profile = cProfile.Profile()

    def profiled(args):
        profile.enable()
        try:
            return scan_cmd.run(args)
        finally:
            profile.disable()

    assert run_command(profiled, build_parser().parse_args(argv)) == 0, capsys.readouterr().err
    assert out.is_file()
    by_file = _functions_by_file(profile)
    shown = "\n".join(f"  {f}: {', '.join(n for n, _ in sorted(fns, key=lambda x: -x[1])[:8])}"
                      for f, fns in sorted(by_file.items()))
    assert len(by_file) <= MAX_FILES, f"{len(by_file)} rmfast files ran functions (at most {MAX_FILES}):\n{shown}"
    assert {"cli/scan", "scoring/pipeline", "fast/engine"} <= set(by_file), shown  # it measured the scan
