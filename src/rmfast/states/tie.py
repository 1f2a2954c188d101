"""Which scan a states folder belongs to (``rmfast-states/1``, :mod:`rmfast.states`).

A states folder is written beside its scan Parquet (``scan.parquet`` -> ``scan.states/``), after the
Parquet and its manifest (:func:`rmfast.scoring.pipeline.finish_states`). Its manifest's ``scan``
names that write: the pair's write id (:func:`rmfast.io.write_pair`) and :data:`TIE_FIELDS` (model
provenance with its content hash, prompt, candidate count). A folder beside a scan of another write
(a scan rerun over the same ``--out``, another model's states copied in) is refused by
:func:`check_scan_tie`, which :func:`rmfast.states.open_states` calls for every reader (similarity,
report, explore). States written without a scan file (the Python API) carry no write id and are
compared on the fields instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..io import WRITE_ID, parquet_write_id, read_manifest


#: what a states folder written without its scan's write id is compared on (scan manifest vs states manifest)
TIE_FIELDS = ("model", "prompt", "n_candidates")


def scan_tie(manifest: dict) -> dict:
    """What ties a states folder to its scan, from the scan's manifest: its write id (once the pair is
    written, :func:`rmfast.io.write_pair`) and :data:`TIE_FIELDS` (model content and name, prompt,
    candidate count)."""
    out = {k: manifest[k] for k in TIE_FIELDS if k in manifest}
    if manifest.get(WRITE_ID):
        out[WRITE_ID] = manifest[WRITE_ID]
    return out


def check_scan_tie(man: dict, folder: Path, scan_path: Path) -> None:
    """Refuse a states folder that is not its scan's: another write of the scan (a scan rerun over the
    same --out), another model's or prompt's states copied beside it."""
    tie = man.get("scan") if isinstance(man.get("scan"), dict) else {}
    fix = (f"the states are not from this scan: rerun the scan with --states (and --overwrite), or move {folder} "
           "away from it")
    if tie.get(WRITE_ID):
        try:
            pid = parquet_write_id(scan_path)
        except Exception as e:  # pyarrow raises many types for a file that is not Parquet
            raise UserError(f"cannot read {scan_path} as Parquet ({type(e).__name__}); rerun the job that writes it") from None
        if pid != tie[WRITE_ID]:
            raise UserError(f"{folder} belongs to the scan written as {tie[WRITE_ID]}, but {scan_path.name} is "
                            f"write {pid}; {fix}")
        return
    scan = read_manifest(scan_path, required=False) or {}
    for k in TIE_FIELDS:
        if k in tie and k in scan and not _same(k, tie[k], scan[k]):
            raise UserError(f"{folder}: its {k} is not {scan_path.name}'s ({str(tie[k])[:60]!r} vs "
                            f"{str(scan[k])[:60]!r}); {fix}")


#: what names a model's content in the loader's provenance (:func:`rmfast.loading.loader.load`'s ``source``)
MODEL_IDS = ("content_sha256", "sha256", "revision", "name")


def _same(field: str, a, b) -> bool:
    """Do two manifests agree on ``field``? A model is compared on what names its content (and name) where
    both record it; one given as a bare name (the API's ``scan={"model": "rm"}``) by name."""
    if field == "model":
        if isinstance(a, dict) and isinstance(b, dict):
            return all(a[k] == b[k] for k in MODEL_IDS if a.get(k) is not None and b.get(k) is not None)
        name = lambda m: m.get("name") if isinstance(m, dict) else m  # noqa: E731
        return str(name(a)) == str(name(b))
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
