"""CLI: the scan command end to end, and every bad input -> one line, exit 2, no traceback."""

import argparse
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch


import rounding as R
import tiny_models as T
from cli_run import interrupt_scoring_at, one_line_error, run




@pytest.fixture(params=["llama", "qwen3", "phi3"])
def rm_dir(request, tiny_dir, tmp_path_factory, smol_tokenizer):
    """A tiny reward model of each architecture saved as a normal HF folder (llama: ``tiny_dir``)."""
    if request.param == "llama":
        return tiny_dir
    d = tmp_path_factory.mktemp(f"tiny-{request.param}")
    T.tiny(request.param, num_labels=1, pad_token_id=smol_tokenizer.pad_token_id).save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    return d


def test_scan_writes_parquet_and_manifest(rm_dir, tmp_path, capsys):
    tiny_dir = rm_dir
    out = tmp_path / "r.parquet"
    rc, so, se = run(["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "100:400", "--out", str(out),
                      "--top", "5", "--no-progress"], capsys)
    assert rc == 0, se
    df = pd.read_parquet(out)
    assert list(df.columns) == ["token_id", "token", "text", "score", "rank"]
    assert df["token_id"].dtype == "int64" and df["score"].dtype == "float32"
    assert len(df) == 300 and df["rank"].min() == 1
    man = pd.read_json(str(out) + ".json", typ="series")
    assert man["head"] == "score" and man["engine"] == "fast" and man["n_candidates"] == 300
    assert "top 5" in so and "bottom 5" in so
    # the existing output is refused without --overwrite, and left untouched
    before = out.read_bytes()
    rc, _, se = run(["scan", str(tiny_dir), "--token-ids", "0:10", "--out", str(out)], capsys)
    assert one_line_error(rc, se) and "--overwrite" in se
    assert out.read_bytes() == before


@pytest.mark.compiles
def test_scan_compile_on_matches_off(tiny_dir, tmp_path, capsys):
    prompt = "What, in one word, is the greatest thing ever?"
    res = {}
    for mode in ("off", "on"):
        out = tmp_path / f"{mode}.parquet"
        rc, so, se = run(["scan", str(tiny_dir), "--prompt", prompt, "--dtype", "float32", "--token-ids", "100:700", "--batch-size", "256",
                          "--compile", mode, "--out", str(out), "--no-progress", "--top", "0"], capsys)
        assert rc == 0, se
        man = pd.read_json(str(out) + ".json", typ="series")
        assert bool(man["compiled"]) == (mode == "on")
        assert ("(compiled)" in so) == (mode == "on")
        res[mode] = pd.read_parquet(out)["score"].to_numpy()
    # fp32 in another order (inductor fuses and re-blocks the sums): equal to rounding, 2E against float64
    from rmfast.loading.loader import load
    from rmfast.scoring.pipeline import scan

    lm = load(str(tiny_dir), dtype="float32", device="cpu")
    ref = scan(lm.model.double(), lm.tokenizer, prompt, token_ids="100:700", progress=False).scores
    R.assert_agree_to_rounding(res["off"], res["on"], ref)


def test_compile_is_decided_without_the_job_size(monkeypatch):
    """auto compiles on the CPU kinds where it was measured to pay and nowhere else, whatever the job's
    size; on compiles on CPU; on where it cannot apply (the plain-HF engine) says so and runs eagerly."""
    from types import SimpleNamespace

    from rmfast import cpu as cpu_mod
    from rmfast.errors import UserError
    from rmfast.scoring.plan import choose_compile

    cpu = torch.device("cpu")
    monkeypatch.delenv("RMFAST_COMPILE", raising=False)
    for kind, expected in (("AVX-512 BF16", False), ("AVX2-only", False), ("AMX", True)):
        monkeypatch.setattr(cpu_mod, "cpu_info", lambda kind=kind: SimpleNamespace(kind=kind))
        decided, why = choose_compile("auto", cpu, "fast")
        assert decided is expected and kind in why
    long_prompt = SimpleNamespace(blockdiag_overhead=lambda: 0.9)  # many heads, a long prompt
    assert choose_compile("auto", cpu, "fast", long_prompt)[0] is False
    monkeypatch.setenv("RMFAST_COMPILE", "0")
    assert choose_compile("auto", cpu, "fast")[0] is False
    assert choose_compile("off", cpu, "fast")[0] is False
    assert choose_compile("on", cpu, "fast")[0] is True and choose_compile(True, cpu, "fast")[0] is True
    with pytest.warns(UserWarning, match="plain Hugging Face path"):
        assert choose_compile("on", cpu, "hf")[0] is False
    with pytest.raises(UserError, match="compile"):
        choose_compile("sometimes", cpu, "fast")


def test_token_id_file_and_exclude_special(tiny_dir, tmp_path, capsys, smol_tokenizer):
    ids = tmp_path / "ids.txt"
    ids.write_text("# some ids\n5\n0\n2\n500\n1000\n500\n")
    out = tmp_path / "s.parquet"
    rc, _, se = run(["scan", str(tiny_dir), "--token-ids", str(ids), "--exclude-special", "--out", str(out),
                     "--no-progress", "--top", "0"], capsys)
    assert rc == 0, se
    got = pd.read_parquet(out)["token_id"].tolist()
    special = set(smol_tokenizer.all_special_ids) | set(smol_tokenizer.added_tokens_decoder)
    assert got == sorted({5, 0, 2, 500, 1000} - special) and 500 in got


@pytest.mark.parametrize("case", ["missing-folder", "unknown-hub", "empty-prompt", "no-chat-template", "bad-template",
                                  "range", "bad-id-file", "id-out-of-range", "unwritable", "bad-dtype"])
def test_bad_input(case, tiny_dir, tmp_path, capsys):
    out = str(tmp_path / "o.parquet")
    base = ["scan", str(tiny_dir), "--out", out, "--no-progress"]
    if case == "missing-folder":
        argv = ["scan", str(tmp_path / "nope"), "--out", out]
    elif case == "unknown-hub":
        argv = ["scan", "nobody/no-such-model", "--out", out]
    elif case == "empty-prompt":
        argv = base + ["--prompt", ""]
    elif case == "no-chat-template":
        d = tmp_path / "nochat"
        import shutil
        shutil.copytree(tiny_dir, d)
        cfgp = d / "tokenizer_config.json"
        import json
        cfg = json.loads(cfgp.read_text()); cfg.pop("chat_template", None); cfgp.write_text(json.dumps(cfg))
        for f in ("chat_template.jinja", "chat_template.json"):
            (d / f).unlink(missing_ok=True)
        argv = ["scan", str(d), "--out", out]
    elif case == "bad-template":
        argv = base + ["--template", "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"]
    elif case == "range":
        argv = base + ["--token-ids", "10:abc"]
    elif case == "bad-id-file":
        f = tmp_path / "ids.txt"; f.write_text("1\ntwo\n")
        argv = base + ["--token-ids", str(f)]
    elif case == "id-out-of-range":
        f = tmp_path / "ids.txt"; f.write_text("1\n999999\n")
        argv = base + ["--token-ids", str(f)]
    elif case == "unwritable":
        ro = tmp_path / "ro"; ro.mkdir(); os.chmod(ro, 0o500)
        argv = base[:-3] + ["--out", str(ro / "sub" / "x.parquet")]
        if os.geteuid() == 0:  # root ignores permissions: use a path under a file instead
            (tmp_path / "afile").write_text("x")
            argv = base[:-3] + ["--out", str(tmp_path / "afile" / "x.parquet")]
    elif case == "bad-dtype":
        argv = base + ["--dtype", "int7"]
    rc, so, se = run(argv, capsys)
    assert one_line_error(rc, se), (rc, se)
    assert not os.path.exists(out)


def test_no_traceback_in_a_real_process(tmp_path):
    """The real entry point: exit status 2 and a single line on stderr."""
    p = subprocess.run([sys.executable, "-m", "rmfast", "scan", str(tmp_path / "missing")], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and p.stderr.startswith("rmfast: error"), p.stderr


@pytest.mark.compiles
def test_every_option_on_every_input(tiny_dir, tmp_path, capsys):
    """Text candidates and vocabulary views take --compile and an escaped --template like a plain scan."""
    cands = tmp_path / "c.txt"
    cands.write_text("love\nthe universe\nhope\n")
    out = tmp_path / "texts.parquet"
    rc, so, se = run(["scan", str(tiny_dir), "--dtype", "float32", "--candidates", str(cands), "--compile", "on",
                      "--template", "User: {prompt}\\nAssistant: {response}", "--out", str(out), "--no-progress"], capsys)
    assert rc == 0, se
    man = pd.read_json(str(out) + ".json", typ="series")
    assert bool(man["compiled"]) and "(compiled)" in so
    # the one-off compile is announced before and timed after (it takes seconds to a minute)
    assert se.count("rmfast: compiling the decoder layer") == 1 and se.count("rmfast: compiled in ") == 1, se
    assert man["template"]["format"] == "User: {prompt}\nAssistant: {response}"  # unescaped, as on every path
    out2 = tmp_path / "words.parquet"
    rc, so, se = run(["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "0:3000", "--wordlike", "--compile", "off",
                      "--template", "User: {prompt}\\nAssistant: {response}", "--out", str(out2), "--no-progress"], capsys)
    assert rc == 0, se
    man = pd.read_json(str(out2) + ".json", typ="series")
    assert not man["compiled"] and man["vocab_view"]["wordlike"] and 0 < man["n_candidates"] < 3000
    assert man["template"]["format"] == "User: {prompt}\nAssistant: {response}"


@pytest.mark.compiles
def test_scan_resume_is_bit_identical(tiny_dir, tmp_path, monkeypatch, capsys):
    """A compiled scan killed after two batches and rerun gives exactly the numbers of an uninterrupted
    one (its last batch, 1000 = 7 x 128 + 104 rows, padded to the compiled shape in both)."""
    from rmfast.scoring import batching

    args = ["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "0:1000", "--batch-size", "128",
            "--compile", "on", "--no-progress", "--top", "0"]
    rc, so, se = run(args + ["--out", str(tmp_path / "whole.parquet")], capsys)
    assert rc == 0 and pd.read_json(str(tmp_path / "whole.parquet.json"), typ="series")["compiled"], se
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    restore = interrupt_scoring_at(monkeypatch, 3)
    out = tmp_path / "resumed.parquet"
    rc, _, se = run(args + ["--out", str(out)], capsys)
    assert rc == 130 and f"resume from its checkpoint {out}.partial.npz (256 of 1,000 scored)" in se, se
    assert (tmp_path / "resumed.parquet.partial.npz").exists() and not out.exists()
    restore()
    rc, so, se = run(args + ["--out", str(out)], capsys)
    assert rc == 0, se
    assert pd.read_json(str(out) + ".json", typ="series")["resumed_candidates"] == 256
    # the summary says what this run scored and what came from the checkpoint
    assert "744 candidates scored by this run in " in so and "; 256 more from the checkpoint, 1000 in all" in so, so
    whole = pd.read_parquet(tmp_path / "whole.parquet")["score"].to_numpy()
    np.testing.assert_array_equal(pd.read_parquet(out)["score"].to_numpy(), whole)
    assert not (tmp_path / "resumed.parquet.partial.npz").exists()


def test_a_rerun_on_another_path_starts_afresh(tiny_dir, tmp_path, monkeypatch, capsys):
    """A scan interrupted with --attention block-diagonal and rerun with the default form does not resume the old
    rows (they would equal neither run): the checkpoint's run fields hold the path's decisions, and the rerun says
    why it starts afresh; its scores are the uninterrupted default run's, bit for bit."""
    from rmfast.scoring import batching

    args = ["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "0:512", "--batch-size", "64",
            "--no-progress", "--top", "0"]
    assert run(args + ["--out", str(tmp_path / "clean.parquet")], capsys)[0] == 0
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    restore = interrupt_scoring_at(monkeypatch, 5)
    out = tmp_path / "resumed.parquet"
    assert run(args + ["--attention", "block-diagonal", "--out", str(out)], capsys)[0] == 130
    restore()
    with pytest.warns(UserWarning, match=r"not resuming .*another path \(attention: block-diagonal -> cpu-flash"):
        rc, _, se = run(args + ["--out", str(out)], capsys)
    assert rc == 0, se
    assert pd.read_json(str(out) + ".json", typ="series")["resumed_candidates"] == 0
    np.testing.assert_array_equal(pd.read_parquet(out)["score"].to_numpy(),
                                  pd.read_parquet(tmp_path / "clean.parquet")["score"].to_numpy())


@pytest.mark.parametrize("argv, says", [
    (["--token-ids", "10:5"], "needs A < B"),
    (["--template", "User: {prompt}\\nAssistant:"], "no {response} placeholder"),
    (["--batch-size", "lots"], "not a positive integer"),
    (["--batch-size", "2.5"], "not a positive integer"),
])
def test_errors_name_the_problem(argv, says, tiny_dir, tmp_path, capsys):
    rc, _, se = run(["scan", str(tiny_dir), "--out", str(tmp_path / "x.parquet"), "--no-progress"] + argv, capsys)
    assert one_line_error(rc, se) and says in se, se
    assert not (tmp_path / "x.parquet").exists()


def test_candidates_without_column_lists_every_column(tiny_dir, tmp_path, capsys):
    table = tmp_path / "items.csv"
    cols = [f"c{i}" for i in range(14)]
    table.write_text(",".join(cols) + "\n" + ",".join("x" for _ in cols) + "\n")
    rc, _, se = run(["scan", str(tiny_dir), "--candidates", str(table), "--out", str(tmp_path / "x.parquet")], capsys)
    assert one_line_error(rc, se) and "14 columns" in se and all(repr(c) in se for c in cols)


def test_default_template_is_said(tmp_path, capsys, smol_tokenizer):
    """A model whose tokenizer has no chat template gets the plain default, said in one line."""
    from rmfast.cli.common import template_arg
    from types import SimpleNamespace

    lm = SimpleNamespace(default_template="User: {prompt}\nAssistant: {response}")
    assert template_arg(SimpleNamespace(template=None, model="gemma3-270m"), lm) == lm.default_template
    assert "has no chat template; using --template" in capsys.readouterr().err
    assert template_arg(SimpleNamespace(template="A {prompt} B {response}", model="m"), lm) == "A {prompt} B {response}"
    assert capsys.readouterr().err == ""


def test_disk_full_keeps_the_scores(tiny_dir, tmp_path, monkeypatch, capsys):
    """Writing the output fails (ENOSPC): one line, the scores stay in the checkpoint, and the rerun
    writes them without scoring again."""
    import errno

    import pyarrow.parquet as pq

    from rmfast.fast.engine import Engine

    out = tmp_path / "full.parquet"
    args = ["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "0:300", "--out", str(out), "--no-progress"]
    real_write = pq.write_table

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    rc, _, se = run(args, capsys)
    assert one_line_error(rc, se) and "No space left" in se and "rerun" in se
    assert (tmp_path / "full.parquet.partial.npz").exists() and not out.exists()
    monkeypatch.setattr(pq, "write_table", real_write)
    monkeypatch.setattr(Engine, "score", lambda self, r: pytest.fail("rescored after a failed write"))
    rc, _, se = run(args, capsys)
    assert rc == 0, se
    assert pd.read_json(str(out) + ".json", typ="series")["resumed_candidates"] == 300
    assert len(pd.read_parquet(out)) == 300 and not (tmp_path / "full.parquet.partial.npz").exists()


def test_second_job_on_one_output_stops_at_once(tiny_dir, tmp_path, capsys):
    from filelock import FileLock

    out = tmp_path / "busy.parquet"
    with FileLock(str(out) + ".lock"):  # another job holds the output
        rc, _, se = run(["scan", str(tiny_dir), "--token-ids", "0:10", "--out", str(out), "--no-progress"], capsys)
    assert one_line_error(rc, se) and "another rmfast job is writing" in se
    assert not out.exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc (a folder no file can be made in)")
def test_an_output_whose_lock_cannot_be_made_is_not_called_busy(tiny_dir, capsys):
    """filelock reads a lock file it cannot create as one another job holds: the error names the real cause."""
    rc, _, se = run(["scan", str(tiny_dir), "--token-ids", "0:10", "--out", "/proc/rmfast-x.parquet",
                     "--no-progress"], capsys)
    assert one_line_error(rc, se) and "cannot write /proc/rmfast-x.parquet" in se and "another rmfast job" not in se, se


def test_ctrl_c_says_what_a_rerun_does_and_only_what_a_job_said(capsys):
    """Ctrl-C: exit 130 and one line; "resume" only where a job said a rerun resumes (a scan's checkpoint, a
    sweep's store), never for a command with nothing to resume. A closed pipe (`rmfast models | head`): 141, no
    traceback."""
    from rmfast.cli.common import run_command
    from rmfast.io import say_on_interrupt

    def interrupted(_args):
        raise KeyboardInterrupt

    say_on_interrupt("rerun the same command to resume from its checkpoint x.partial.npz")  # an earlier job's
    assert run_command(interrupted, None) == 130
    assert capsys.readouterr().err == "rmfast: interrupted\n"  # a command starts with nothing to resume

    def after_a_checkpoint(_args):
        say_on_interrupt("rerun the same command to resume from its checkpoint y.partial.npz (5 of 9 scored)")
        raise KeyboardInterrupt

    assert run_command(after_a_checkpoint, None) == 130
    assert capsys.readouterr().err == ("rmfast: interrupted; rerun the same command to resume from its checkpoint "
                                       "y.partial.npz (5 of 9 scored)\n")

    def reader_gone(_args):
        raise BrokenPipeError(32, "Broken pipe")

    assert run_command(reader_gone, None) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("n, want, unwanted", [(3, ["all 3, best first"], ["bottom", "top 5"]),
                                               (7, ["top 5", "bottom 2"], ["bottom 5"]),
                                               (12, ["top 5", "bottom 5"], ["all"])])
def test_the_top_and_bottom_tables_never_show_a_row_twice(n, want, unwanted, capsys):
    from rmfast.cli.common import print_tables
    from rmfast.scoring.results import ScanResult

    res = ScanResult(np.arange(n), np.linspace(1, -1, n).astype(np.float32), [f"t{i}" for i in range(n)],
                     [f"w{i}" for i in range(n)], {"head": "score", "model": {"name": "m"},
                                                     "score_meaning": "the reward, higher = better"})
    print_tables(res, 5)
    so = capsys.readouterr().out
    assert all(w in so for w in want) and not any(u in so for u in unwanted), so
    assert so.rstrip().endswith("score: the reward, higher = better")  # what the numbers are, under them
    assert sum(so.count(f"'w{i}'") for i in range(n)) == min(n, 10)  # each row at most once


def test_the_scan_line_says_the_padding_measurement_before_the_rates(capsys):
    """"300 candidates in 52.6 s (22.19 cand/s; 5.702 cand/s with the one-off padding measurement, 39.1 s of it"
    did not divide (the time held the measurement, the first rate did not); a walkthrough. The time is now said with
    what of it the measurement took, then each rate named."""
    from types import SimpleNamespace

    from rmfast.cli.scan import _print_summary

    m = {"n_candidates": 300, "scan_s": 52.6, "wall_s": 55.0, "candidates_per_s": 22.19, "pad_probe_s": 39.1,
         "candidates_per_s_with_pad_probe": 5.702, "engine": "fast", "dtype": "float32", "device": "cpu",
         "tokens_per_row": 3, "batch_size": 1365}
    _print_summary(SimpleNamespace(manifest=m), 0, "x.parquet", 1)
    assert ("300 candidates in 52.6 s, 39.1 s of it a one-off padding measurement (22.19 cand/s without it, 5.702 "
            "with it; fast engine, float32, cpu, batch 1365); total 55.0 s") in capsys.readouterr().out


def test_two_prompts_never_share_a_default_output(tmp_path, monkeypatch):
    """A default --out is cut from the prompt: "...greatest thing ever?" and "...greatest thing of all?" shared one
    name, and every prompt of CJK or Cyrillic letters was "x"; the second run's "already exists; pass --overwrite"
    would destroy the first's result (a walkthrough). A name another prompt's result holds gets a hash of this
    prompt; letters the slug drops are named by a hash."""
    import json
    from pathlib import Path

    from rmfast.cli.common import default_output
    from rmfast.io import slug

    monkeypatch.chdir(tmp_path)
    a, b = "What, in one word, is the greatest thing ever?", "What, in one word, is the greatest thing of all?"
    assert slug(a) == slug(b)
    first = default_output("rm", a, ".parquet")
    Path(first).parent.mkdir()
    Path(first).write_bytes(b"x")
    Path(first + ".json").write_text(json.dumps({"prompt": a}))
    assert default_output("rm", a, ".parquet") == first  # its own: the same name (a rerun, a resume)
    second = default_output("rm", b, ".parquet")
    assert second != first and second.startswith(first.removesuffix(".parquet") + "-")
    g = default_output("gcg__rm", a, "__max.json")  # GCG's JSON holds its prompt in its manifest
    Path(g).write_text(json.dumps({"manifest": {"prompt": a}}))
    assert default_output("gcg__rm", a, "__max.json") == g != default_output("gcg__rm", b, "__max.json")
    assert len({slug("日本語は？"), slug("Что лучше всего?"), slug("?")}) == 3


def test_sigterm_saves_the_checkpoint_as_ctrl_c_does(tiny_dir, tmp_path, monkeypatch, capsys):
    """SIGTERM (timeout, docker stop, a scheduler's preemption) killed a scan with no line and lost the work since
    the last periodic save, where Ctrl-C saves it. Now it is taken as Ctrl-C: the checkpoint saved, one line, 143;
    the rerun resumes and ends with the uninterrupted scores."""
    import os
    import signal

    from rmfast.fast.engine import Engine
    from rmfast.scoring import batching

    args = ["scan", str(tiny_dir), "--dtype", "float32", "--token-ids", "0:512", "--batch-size", "64",
            "--no-progress", "--top", "0"]
    assert run(args + ["--out", str(tmp_path / "whole.parquet")], capsys)[0] == 0
    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_S", 3600.0)  # no periodic save: only the signal's
    real, calls = Engine.score, {"n": 0}

    def terminated_at_the_third(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **kw)

    monkeypatch.setattr(Engine, "score", terminated_at_the_third)
    out, before = tmp_path / "t.parquet", signal.getsignal(signal.SIGTERM)
    rc, _, se = run(args + ["--out", str(out)], capsys)
    assert rc == 143 and "rmfast: stopped by SIGTERM; rerun the same command to resume from its checkpoint" in se, se
    assert "Traceback" not in se and (tmp_path / "t.parquet.partial.npz").exists() and not out.exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone with it
    monkeypatch.setattr(Engine, "score", real)
    rc, so, se = run(args + ["--out", str(out)], capsys)
    assert rc == 0 and "more from the checkpoint" in so, se
    np.testing.assert_array_equal(pd.read_parquet(out)["score"].to_numpy(),
                                  pd.read_parquet(tmp_path / "whole.parquet")["score"].to_numpy())


def test_a_cache_that_takes_no_write_names_its_setting(capsys, tmp_path, monkeypatch):
    """A read-only RMFAST_CACHE said "Read-only file system: <path> (free space, fix the permissions, or choose
    another path)": no setting named. It names RMFAST_CACHE (or --cache-dir) now; a write elsewhere is as before."""
    import errno

    from rmfast.cli.common import run_command

    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path / "cache"))

    def convert(path):
        def run(args):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return run

    assert run_command(convert(tmp_path / "cache" / "converted" / "x"), argparse.Namespace()) == 2
    err = capsys.readouterr().err
    assert f"in the rmfast cache {tmp_path / 'cache'}: set RMFAST_CACHE (or --cache-dir) to a writable folder" in err
    assert "free space" not in err  # a read-only file system is not full
    assert run_command(convert(tmp_path / "c2" / "y"), argparse.Namespace(cache_dir=str(tmp_path / "c2"))) == 2
    assert "set --cache-dir to a writable folder" in capsys.readouterr().err
    assert run_command(convert(tmp_path / "out.parquet"), argparse.Namespace()) == 2
    assert "(fix the permissions, or choose another path)" in capsys.readouterr().err


def test_a_file_size_limit_at_a_write_is_one_line(capsys, tmp_path):
    """`ulimit -f` (EFBIG) at a checkpoint save was six chained tracebacks; it is the full disk's one line now."""
    import errno

    from rmfast.cli.common import run_command

    from rmfast.io import atomic_write

    def save(args):
        raise OSError(errno.EFBIG, "File too large", "u.parquet.partial.npz")

    assert run_command(save, argparse.Namespace()) == 2
    err = capsys.readouterr().err
    assert err.startswith("rmfast: error: File too large: u.parquet.partial.npz") and "Traceback" not in err
    assert "`ulimit -f`" in err and "free space" not in err  # the fix for a size limit, not a full disk's

    def write(tmp):  # a write() past the limit names no file: the line named none
        raise OSError(errno.EFBIG, "File too large")

    assert run_command(lambda args: atomic_write(tmp_path / "v.parquet.partial.npz", write), argparse.Namespace()) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rmfast: error: File too large: {tmp_path / 'v.parquet.partial.npz'} (raise"), err


def test_a_subset_scan_has_its_own_default_output():
    """`--token-ids 0:50` defaulted to the whole vocabulary's file name (a later full scan found it and refused, or a
    reader took it for the full scan): the selection is in the name, as the help's [__<candidates>] says."""
    from rmfast.cli.common import default_output
    from rmfast.io import slug
    from rmfast.scoring.pipeline import Selection

    prompt = "What, in one word, is the greatest thing ever?"
    names = {default_output("rm", prompt, f"__{slug(t)}.parquet" if (t := sel.tag()) else ".parquet")
             for sel in (Selection(), Selection(token_ids="0:50"), Selection(token_ids=":50"), Selection(token_ids="50:"),
                         Selection(wordlike=True), Selection(token_ids="0:50", wordlike=True), Selection(token_ids=[1, 5]))}
    assert len(names) == 6, names  # ":50" is "0:50"
    assert "results/rm__what-in-one-word-is-the-greatest-thing__ids-0-50.parquet" in names
    assert "results/rm__what-in-one-word-is-the-greatest-thing.parquet" in names  # the full scan's name is as it was
    # names that words alone made alike (a cut part, both compat modes, one file name in two folders) differ by a hash
    long = dict(token_ids="0:20000", exclude_special=True, wordlike=True)
    tags = {Selection(**long, dedup=True).tag(), Selection(**long).tag(), Selection(**long, compat="authors").tag(),
            Selection(**long, compat="decode-retokenize").tag()}
    assert len(tags) == 4 and all(len(t) <= 40 for t in tags), tags
    assert Selection(compat="authors").tag() != Selection(compat="decode-retokenize").tag()


def test_one_file_name_in_two_folders_names_two_outputs(tmp_path):
    from rmfast.scoring.pipeline import Selection

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "picked.txt").write_text("1\n2\n")
    a, b = (Selection(token_ids=str(tmp_path / d / "picked.txt")).tag() for d in ("a", "b"))
    assert a != b and a.startswith("picked-") and b.startswith("picked-")
    texts = [Selection(texts=["x"], texts_info={"path": str(tmp_path / "a" / "picked.txt"), "column": c}, compat=m).tag()
             for c, m in ((None, None), ("name", None), (None, "authors"))]
    assert len(set(texts)) == 3, texts

