"""Issue 24 part 5: what the hidden states show on the embedded models and the training demo.

    PYTHONPATH=src python examples/train_reward_model.py --out DATA/train --steps 24 --save-steps 6 \\
        --train-pairs 96 --vocab-ids 0:256 --vocab-view all          # the training run (LoRA checkpoints)
    PYTHONPATH=src python examples/representation_findings.py --data DATA --run DATA/train/run

Steps (``--steps``, default all of them, in order):

- ``prepare``: ``checkpoint-0`` beside the run's checkpoints (the untrained LoRA adapter: B = 0, so
  the merged model *is* the base LM, with the run's seeded fresh score head), and the candidate id
  files: A, 4,096 SmolLM2 ids drawn (seed 0) from its word-like, de-duplicated vocabulary; B, 4,096
  decoded strings drawn (seed 0) from those that are a single word-like token in both SmolLM2 and
  Gemma 3 270M (each tokenizer's word-like, de-duplicated view), as one id file per model.
- ``scan_a``, ``scan_b``: ``rmfast scan`` with ``--states all --states-dtype float32 --dtype float32``: every
  checkpoint on the A ids (the chat template, the trained score head's position); SmolLM2 and
  Gemma 3 on the B ids with a seeded random score head and one plain template, so that both
  states sit on the response token itself.
- ``similarity_a``: per layer, each checkpoint against checkpoint-0 (the diagonal; 10 bootstrap
  replicates and 9 permutations for the last), and the last checkpoint's full layer × layer matrix.
- ``scores_a``: Spearman of each checkpoint's rewards with checkpoint-0's.
- ``base_self_a``: the base against itself, layer × layer (how much its own layers differ).
- ``lora_a``: per decoder layer, ‖ΔW‖_F / ‖W‖_F of each checkpoint's merged LoRA update.
- ``similarity_b``: the full SmolLM2 × Gemma matrix, and a permutation test (shuffled matching,
  19) with bootstrap intervals (20) on depth-matched pairs.
- ``surface_b``: the depth-matched pairs again with seven surface features of the strings
  regressed out of both sides, and each side's similarity with those features.
- ``figures``: PNGs into ``--figures`` and the markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
GREATEST = "What, in one word, is the greatest thing ever?"
PLAIN = "User: {prompt}\\nAssistant: {response}"  # as the CLI takes it (\n unescaped)
MODELS_B = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}
# depth-matched pairs for the permutation test: fractions 0, 1/4, 1/2, 3/4 of the stack, then the ends
SLIM = ["layer_a", "layer_b", "n", "d_a", "d_b", "cka", "cka_debiased", "rv", "rv2", "rv_null_mean"]  # full matrices
PAIRS_B = [("0", "0"), ("8", "4"), ("15", "9"), ("23", "13"), ("last", "last"), ("last_normed", "last_normed")]


def _checkpoints(run: Path) -> list[tuple[int, Path]]:
    out = [(int(m.group(1)), p) for p in run.iterdir() if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return sorted(out)


def prepare(args) -> None:
    from rmfast.loading.loader import load
    from rmfast.scoring.candidates import decoded, vocab_ids, vocab_size

    ck0 = args.run / "checkpoint-0"
    if not (ck0 / "adapter_config.json").exists():
        spec = importlib.util.spec_from_file_location("train_rm", REPO / "examples" / "train_reward_model.py")
        train_rm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(train_rm)
        model, tok = train_rm.build_model("smollm2-135m-instruct", 0, 8)  # the run's seed and rank
        model.save_pretrained(ck0)
        tok.save_pretrained(ck0)
    args.data.mkdir(parents=True, exist_ok=True)
    views = {}
    for key, alias in MODELS_B.items():
        lm = load(alias, dtype="float32", device="cpu")
        ids, _ = vocab_ids(lm.tokenizer, vocab_size(lm.model, lm.tokenizer), exclude_special=True, wordlike=True,
                           dedup=True)
        views[key] = pd.Series(ids, index=decoded(lm.tokenizer, ids))
    rng = np.random.default_rng(0)
    a = np.sort(rng.choice(views["smollm2"].to_numpy(), size=args.n, replace=False))
    np.savetxt(args.data / "ids_A_smollm2.txt", a, fmt="%d")
    shared = sorted(set(views["smollm2"].index) & set(views["gemma3"].index))
    pick = [shared[i] for i in np.sort(rng.choice(len(shared), size=min(args.n, len(shared)), replace=False))]
    for key, v in views.items():
        np.savetxt(args.data / f"ids_B_{key}.txt", np.sort(v[pick].to_numpy()), fmt="%d")
    info = {"n_wordlike": {k: len(v) for k, v in views.items()}, "n_shared": len(shared), "n_B": len(pick),
            "n_A": len(a), "examples_B": pick[:: max(1, len(pick) // 20)]}
    (args.data / "prepare.json").write_text(json.dumps(info, indent=1, ensure_ascii=False))
    print(json.dumps(info, ensure_ascii=False), file=sys.stderr)


def _scan(argv: list[str], timings: dict, name: str) -> None:
    from rmfast.cli import main as cli

    t0 = time.perf_counter()
    rc = cli(["scan", *argv, "--dtype", "float32", "--compile", "off", "--states", "all", "--states-dtype", "float32",
              "--prompt", GREATEST, "--no-progress", "--overwrite", "--top", "0"])
    if rc:
        raise SystemExit(f"scan {name} failed (rc {rc})")
    timings[name] = round(time.perf_counter() - t0, 1)


def _save_timings(path: Path, timings: dict) -> None:
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **timings}, indent=1))
    print(json.dumps(timings), file=sys.stderr)


def scan_a(args) -> None:
    timings: dict = {}
    for step, ck in _checkpoints(args.run):
        if (args.data / "A" / f"checkpoint-{step}.states" / "manifest.json").exists():
            continue  # scanned already (a rerun after more checkpoints)
        _scan([str(ck), "--token-ids", str(args.data / "ids_A_smollm2.txt"),
               "--out", str(args.data / "A" / f"checkpoint-{step}.parquet")], timings, f"A/checkpoint-{step}")
    _save_timings(args.data / "scan_timings.json", timings)


def scan_b(args) -> None:
    timings: dict = {}
    for key, alias in MODELS_B.items():
        _scan([alias, "--random-head-seed", "0", "--template", PLAIN, "--token-ids", str(args.data / f"ids_B_{key}.txt"),
               "--out", str(args.data / "B" / f"{key}.parquet")], timings, f"B/{key}")
    _save_timings(args.data / "scan_timings.json", timings)


def _diagonal(a, b, layers, **kw) -> pd.DataFrame:
    from rmfast.analysis.representations.similarity import similarity

    return pd.concat([similarity(a, b, layers_a=[x], layers_b=[x], **kw).pairs for x in layers], ignore_index=True)


def similarity_a(args) -> None:
    from rmfast.analysis.representations.similarity import similarity
    from rmfast.states import open_states

    out, timings = args.results, {}
    out.mkdir(parents=True, exist_ok=True)
    A = args.data / "A"
    steps = [s for s, _ in _checkpoints(args.run)]
    base = open_states(A / "checkpoint-0.parquet")
    layers = [x for x in base.layers if x != "0"]  # layer 0 is the template's last token: one row for all
    rows = []
    for s in steps[1:]:
        t0 = time.perf_counter()
        last = s == steps[-1]
        kw = dict(bootstrap=10, permutations=9) if last else dict(bootstrap=0, permutations=0)
        d = _diagonal(base, A / f"checkpoint-{s}.parquet", layers, **kw).assign(step=s)
        rows.append(d)
        timings[f"A diagonal checkpoint-{s}"] = round(time.perf_counter() - t0, 1)
    pd.concat(rows, ignore_index=True).to_csv(out / "training_diagonal.csv", index=False)
    t0 = time.perf_counter()
    full = similarity(base, A / f"checkpoint-{steps[-1]}.parquet", layers_a=layers, layers_b=layers, bootstrap=0,
                      permutations=0)
    full.pairs[SLIM].round(6).to_csv(out / f"training_full_checkpoint-{steps[-1]}.csv", index=False)
    timings[f"A full checkpoint-{steps[-1]}"] = round(time.perf_counter() - t0, 1)
    _save_timings(out / "timings.json", timings)


def scores_a(args) -> None:
    """Spearman of each checkpoint's rewards with checkpoint-0's over the A candidates."""
    A = args.data / "A"
    s0 = pd.read_parquet(A / "checkpoint-0.parquet").set_index("token_id")["score"]
    rows = [{"step": s, "spearman_with_checkpoint_0": float(s0.corr(
        pd.read_parquet(A / f"checkpoint-{s}.parquet").set_index("token_id")["score"].reindex(s0.index),
        method="spearman"))} for s, _ in _checkpoints(args.run)]
    pd.DataFrame(rows).round(4).to_csv(args.results / "training_score_spearman.csv", index=False)


def base_self_a(args) -> None:
    """The base against itself, layer × layer: how different its own layers are (calibration for A)."""
    from rmfast.analysis.representations.similarity import similarity
    from rmfast.states import open_states

    base = open_states(args.data / "A" / "checkpoint-0.parquet")
    layers = [x for x in base.layers if x != "0"]
    t0 = time.perf_counter()
    res = similarity(base, base, layers_a=layers, layers_b=layers, bootstrap=0, permutations=0)
    res.pairs[SLIM].round(6).to_csv(args.results / "training_base_self.csv", index=False)
    _save_timings(args.results / "timings.json", {"A base self": round(time.perf_counter() - t0, 1)})


def lora_a(args) -> None:
    """Per layer, the size of each checkpoint's merged LoRA update: ‖ΔW‖_F / ‖W‖_F over the layer's
    seven projections (ΔW = α/r · B·A), from the adapter files and the base's weights."""
    import torch
    from safetensors.torch import load_file

    rows = []
    for step, ck in _checkpoints(args.run):
        cfg = json.loads((ck / "adapter_config.json").read_text())
        base = load_file(Path(cfg["base_model_name_or_path"]) / "model.safetensors")
        ad, scale = load_file(ck / "adapter_model.safetensors"), cfg["lora_alpha"] / cfg["r"]
        per: dict = {}
        for k in ad:
            if not k.endswith("lora_A.weight"):
                continue
            name = k.split("base_model.model.")[1].replace(".lora_A.weight", ".weight")
            dw = scale * ad[k.replace("lora_A", "lora_B")].double() @ ad[k].double()
            w = base[name].double()
            layer = int(name.split(".")[2])
            d2, w2 = per.get(layer, (0.0, 0.0))
            per[layer] = (d2 + float(torch.sum(dw * dw)), w2 + float(torch.sum(w * w)))
        rows += [{"step": step, "layer": layer + 1, "rel_update": (d2 / w2) ** 0.5} for layer, (d2, w2) in per.items()]
    pd.DataFrame(rows).round(6).to_csv(args.results / "training_lora_update.csv", index=False)


def similarity_b(args) -> None:
    from rmfast.analysis.representations.similarity import similarity

    out, timings = args.results, {}
    out.mkdir(parents=True, exist_ok=True)
    B = args.data / "B"
    t0 = time.perf_counter()
    res = similarity(B / "smollm2.parquet", B / "gemma3.parquet", bootstrap=0, permutations=0)
    res.pairs[SLIM].round(6).to_csv(out / "smollm2_gemma3_full.csv", index=False)
    res.alignment.to_csv(out / "smollm2_gemma3_alignment.csv", index=False)
    timings["B full"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    tested = [similarity(B / "smollm2.parquet", B / "gemma3.parquet", layers_a=[x], layers_b=[y], bootstrap=20,
                         permutations=19, seed=0).pairs for x, y in PAIRS_B]
    pd.concat(tested, ignore_index=True).to_csv(out / "smollm2_gemma3_tested.csv", index=False)
    timings["B tested pairs"] = round(time.perf_counter() - t0, 1)
    _save_timings(out / "timings.json", timings)


def _surface(texts: np.ndarray, ids_a: np.ndarray, ids_b: np.ndarray) -> np.ndarray:
    """(n, 7) surface features of each string: leading space, capitalised, all caps, non-ASCII,
    log length, and log token id in each vocabulary (BPE merge order, a frequency proxy)."""
    core = [t[1:] if t.startswith(" ") else t for t in texts]
    return np.column_stack([[t.startswith(" ") for t in texts], [c[:1].isupper() for c in core],
                            [len(c) > 1 and c.isupper() for c in core], [not c.isascii() for c in core],
                            np.log([len(c) for c in core]), np.log1p(ids_a), np.log1p(ids_b)]).astype(float)


def _residual(X: np.ndarray, F: np.ndarray) -> np.ndarray:
    """X with its least-squares fit on [1, F] removed (column by column)."""
    G = np.column_stack([np.ones(len(F)), F])
    return X - G @ np.linalg.lstsq(G, X, rcond=None)[0]


def surface_b(args) -> None:
    """How much of the SmolLM2-Gemma similarity trivial surface features carry: each layer against
    the features, and the depth-matched pairs again after the features are regressed out of both."""
    from rmfast.analysis.representations.similarity import align, measures
    from rmfast.states import open_states

    a, b = open_states(args.data / "B" / "smollm2.parquet"), open_states(args.data / "B" / "gemma3.parquet")
    al = align([a, b], "text")
    ra, rb = al.rows
    F = _surface(a.texts()[ra], a.keys[ra], b.keys[rb])
    rows = []
    for x, y in PAIRS_B:
        X, Y = a.take(x, ra).astype(np.float64), b.take(y, rb).astype(np.float64)
        raw, res = measures(X, Y), measures(_residual(X, F), _residual(Y, F))
        fx, fy = measures(X, F), measures(Y, F)
        rows.append({"layer_a": x, "layer_b": y, "n": al.n, "rv2": raw.rv2, "rv2_residual": res.rv2,
                     "cka_debiased": raw.cka_debiased, "cka_debiased_residual": res.cka_debiased,
                     "rv2_a_surface": fx.rv2, "rv2_b_surface": fy.rv2})
    pd.DataFrame(rows).round(6).to_csv(args.results / "smollm2_gemma3_surface.csv", index=False)
    print(pd.DataFrame(rows).round(3).to_string(), file=sys.stderr)


def _order(names) -> list[str]:
    num = sorted(int(x) for x in names if x.isdigit())
    return [str(x) for x in num] + [x for x in ("last", "last_normed") if x in set(names)]


def _matrix(pairs: pd.DataFrame, m: str) -> pd.DataFrame:
    mat = pairs.pivot(index="layer_a", columns="layer_b", values=m)
    return mat.loc[_order(mat.index), _order(mat.columns)]


def _heatmap(ax, mat: pd.DataFrame, title: str, xlabel: str, ylabel: str):
    im = ax.imshow(mat.to_numpy(float), vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
    step = max(1, len(mat.columns) // 10)
    ax.set_xticks(range(0, len(mat.columns), step), [c[:6] for c in mat.columns[::step]], fontsize=7)
    step = max(1, len(mat.index) // 10)
    ax.set_yticks(range(0, len(mat.index), step), [c[:6] for c in mat.index[::step]], fontsize=7)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return im


def figures(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r, figs = args.results, args.figures
    figs.mkdir(parents=True, exist_ok=True)
    diag = pd.read_csv(r / "training_diagonal.csv", dtype={"layer_a": str, "layer_b": str})
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, m in zip(axes, ("rv2", "cka_debiased")):
        for s, g in diag.groupby("step"):
            g = g.set_index("layer_a").loc[_order(g["layer_a"])]
            ax.plot(range(len(g)), g[m], marker=".", label=f"checkpoint-{s}")
        ax.set_xticks(range(0, len(g), 4), [x[:6] for x in g.index[::4]], fontsize=7)
        ax.set(title=f"{m}: checkpoint vs base, same layer", xlabel="layer")
    axes[0].set_ylabel("similarity")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(figs / "representations_training_layers.png", dpi=90)
    full_csv = sorted(r.glob("training_full_checkpoint-*.csv"))[-1]
    read = lambda f: pd.read_csv(f, dtype={"layer_a": str, "layer_b": str})  # noqa: E731
    mats = [(_matrix(read(r / "training_base_self.csv"), "rv2"), "base vs base (RV2)", "base layer", "base layer"),
            (_matrix(read(full_csv), "rv2"), f"{full_csv.stem.split('_')[-1]} vs base (RV2)", "checkpoint layer",
             "base layer"),
            (_matrix(read(r / "smollm2_gemma3_full.csv"), "rv2"), "SmolLM2 vs Gemma 3 (RV2)", "Gemma 3 270M layer",
             "SmolLM2-135M layer")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.9), layout="constrained")
    for ax, (mat, title, xl, yl) in zip(axes, mats):
        im = _heatmap(ax, mat, title, xl, yl)
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(figs / "representations_matrices.png", dpi=90)
    tables(r)


def _md(df: pd.DataFrame, index: bool = True) -> str:
    """A markdown table (no tabulate dependency)."""
    df = df.reset_index() if index else df
    cells = [[str(c) for c in df.columns]] + [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
                                               for row in df.itertuples(index=False)]
    lines = ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join([lines[0], "|" + "---|" * len(df.columns), *lines[1:]])


def tables(r: Path) -> None:
    """The markdown tables of docs/representations.md, from the CSVs."""
    diag = pd.read_csv(r / "training_diagonal.csv", dtype={"layer_a": str})
    for m in ("rv2", "cka_debiased", "cka"):
        t = diag.pivot(index="layer_a", columns="step", values=m)
        print(f"\nA {m}: layer x step\n" + _md(t.loc[_order(t.index)].round(4)))
    last = diag[diag["step"] == diag["step"].max()].set_index("layer_a")
    cols = ["rv2", "rv2_lo", "rv2_hi", "p_rv2", "cka_debiased", "cka", "rv_null_mean"]
    print("\nA last checkpoint\n" + _md(last.loc[_order(last.index), cols].round(4)))
    full = pd.read_csv(r / "smollm2_gemma3_full.csv", dtype={"layer_a": str, "layer_b": str})
    for m in ("rv2", "cka_debiased", "cka"):
        mat = _matrix(full, m)
        print(f"\nB {m}: per SmolLM2 layer, the best Gemma layer\n"
              + _md(pd.DataFrame({"gemma_layer": mat.idxmax(axis=1), m: mat.max(axis=1)}).round(4)))
    tested = pd.read_csv(r / "smollm2_gemma3_tested.csv", dtype={"layer_a": str, "layer_b": str})
    cols = ["layer_a", "layer_b", "n", "rv2", "rv2_lo", "rv2_hi", "p_rv2", "cka_debiased", "cka_debiased_lo",
            "cka_debiased_hi", "p_cka_debiased", "cka", "rv_null_mean", "p_cka"]
    print("\nB tested\n" + _md(tested[cols].round(4), index=False))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder for id files, scans and states (large)")
    p.add_argument("--run", type=Path, required=True, help="the training run's folder (checkpoint-N/)")
    p.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results" / "representations")
    p.add_argument("--figures", type=Path, default=REPO / "docs" / "figures")
    p.add_argument("--n", type=int, default=4096, help="candidates per set (default 4096)")
    p.add_argument("--steps", default="prepare,scan_a,scan_b,similarity_a,scores_a,base_self_a,lora_a,similarity_b,surface_b,figures")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    fns = {"prepare": prepare, "scan_a": scan_a, "scan_b": scan_b, "similarity_a": similarity_a, "similarity_b": similarity_b, "base_self_a": base_self_a, "scores_a": scores_a, "lora_a": lora_a, "surface_b": surface_b, "figures": figures}
    for s in args.steps.split(","):
        fns[s](args)


if __name__ == "__main__":
    main()
