"""rmfast's own code says ``dtype``, never ``torch_dtype`` (issue 37 item 14): transformers 5 renamed it, and
reading or setting ``config.torch_dtype`` logs "`torch_dtype` is deprecated! Use `dtype` instead!" (once
per process, through ``logger.warning_once``, even where rmfast has lowered transformers' verbosity, in
which case the message is spent silently). Loading a model and a bf16 scan's fp32 audit call it nowhere,
and raise no FutureWarning or DeprecationWarning about it."""

from __future__ import annotations

import json
import logging
import shutil
import warnings

import transformers

from cli_run import run


def test_load_and_bf16_audit_never_touch_torch_dtype(tiny_dir, tmp_path, monkeypatch, capsys):
    model = tmp_path / "rm"
    shutil.copytree(tiny_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.pop("dtype", None)  # a config.json that names no dtype: the loader looks for one
    cfg.pop("torch_dtype", None)
    (model / "config.json").write_text(json.dumps(cfg))
    said = []  # every warning_once call, shown or not (the real one is cached per message, and maybe silenced)
    monkeypatch.setattr(logging.Logger, "warning_once", lambda self, msg="", *a, **k: said.append(str(msg)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, _, se = run(["scan", model, "--dtype", "bfloat16", "--token-ids", "0:64", "--audit", "32",
                         "--no-progress", "--top", "0", "--out", tmp_path / "s.parquet"], capsys)
    assert rc == 0, se
    man = json.loads((tmp_path / "s.parquet.json").read_text())
    assert man["bf16_audit"]["n"] >= 32 and man["bf16_audit"]["fp32_on"], man  # the fp32 copy was made and used
    assert not [m for m in said if "torch_dtype" in m], said
    assert not [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
                and "torch_dtype" in str(w.message)]
    assert "torch_dtype" not in se
    assert int(transformers.__version__.split(".")[0]) >= 5  # what the message is about (pyproject: >=5)
