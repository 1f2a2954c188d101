"""Train SmolLM2-135M-Instruct as a reward model on EloEverything pairs and watch it with rmfast.

    PYTHONPATH=src python examples/train_reward_model.py --out runs/elo-rm          # the demo (minutes)
    PYTHONPATH=src python examples/train_reward_model.py --out /tmp/smoke --smoke   # two steps (minutes on a 2-core CPU)
    make train-demo

What it does (all offline; needs ``pip install 'rmfast[train]'``):

1. **Pairs** (:func:`make_pairs`). EloEverything's items (``--elo``, one CSV: name, elo_score) are
   split at random (``--seed``) into training items and held-out items (``--holdout`` of them).
   A pair is two distinct items of one side drawn uniformly at random whose Elo differs by at
   least ``--min-gap`` points (closer pairs are mostly rating noise); the higher-Elo item is
   *chosen*. ``--train-pairs`` pairs come from training items only and ``--eval-pairs`` from
   held-out items only, so no evaluated item was ever seen in training.
2. **Model**. The embedded SmolLM2-135M-Instruct (rmfast's converted float32 folder), loaded as a
   one-label sequence classifier whose fresh ``score`` head is drawn from ``--seed``
   (``rmfast.load(..., random_head_seed=seed)``), trained with TRL's ``RewardTrainer`` and a LoRA
   adapter (``--lora-r`` on every attention and MLP projection; the score head trained in full).
   Each pair is the prompt (``--prompt``, as a user turn in the model's chat template) with the
   item as the assistant's answer, tokenised exactly as rmfast scores it (the template's own
   tokenisation; the reward read at the final token).
3. **X-rays** (:class:`rmfast.integrations.trl.XrayCallback`) at step 0 and every checkpoint
   (``--save-steps``): a vocabulary slice (``--vocab-ids``, ``--vocab-view``), the Big Two nouns (``--dictionary``)
   with their Agency/Communion medians and gap, and the held-out items (their scores give the
   held-out pairwise accuracy). Results under ``OUT/xray/``; the run's LoRA checkpoints under
   ``OUT/run/checkpoint-N``.
4. **Checkpoint sweep + trajectory**: ``rmfast sweep`` over ``OUT/run`` (each LoRA checkpoint
   merged onto its base) with the Big Two nouns, then ``rmfast analyze trajectory`` into
   ``OUT/trajectory/``. ``OUT/report.json`` gathers the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
GREATEST = "What, in one word, is the greatest thing ever?"


def make_pairs(items: pd.DataFrame, n: int, *, min_gap: float, seed: int) -> pd.DataFrame:
    """``n`` distinct pairs of distinct items whose Elo differs by >= ``min_gap``; chosen = higher Elo.

    >>> it = pd.DataFrame({"name": list("abcd"), "elo_score": [1000, 1100, 1200, 1300]})
    >>> p = make_pairs(it, 3, min_gap=150, seed=0)
    >>> bool((p["chosen_elo"] - p["rejected_elo"] >= 150).all()), len(p)
    (True, 3)
    """
    rng = np.random.default_rng(seed)
    names, elo = items["name"].to_numpy(), items["elo_score"].to_numpy(float)
    seen, rows = set(), []
    for _ in range(200 * n):  # rejection sampling; bounded so an impossible request ends
        i, j = rng.choice(len(names), size=2, replace=False)
        if abs(elo[i] - elo[j]) < min_gap or (min(i, j), max(i, j)) in seen:
            continue
        seen.add((min(i, j), max(i, j)))
        c, r = (i, j) if elo[i] > elo[j] else (j, i)
        rows.append((names[c], names[r], elo[c], elo[r]))
        if len(rows) == n:
            break
    if len(rows) < n:
        raise SystemExit(f"only {len(rows)} of {n} pairs with an Elo gap >= {min_gap}: lower --min-gap or the count")
    return pd.DataFrame(rows, columns=["chosen", "rejected", "chosen_elo", "rejected_elo"])


def split_items(csv: Path, holdout: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """EloEverything items (name, elo_score; duplicates and blanks dropped) split at random."""
    df = pd.read_csv(csv, usecols=["name", "elo_score"]).dropna()
    df = df[df["name"].astype(str).str.strip() != ""].drop_duplicates("name", keep=False)
    perm = np.random.default_rng(seed).permutation(len(df))
    k = int(round(holdout * len(df)))
    return df.iloc[perm[k:]].reset_index(drop=True), df.iloc[perm[:k]].reset_index(drop=True)


def tokenize_pairs(pairs: pd.DataFrame, tok, prompt: str):
    """A TRL preference dataset, pre-tokenised: chosen_ids / rejected_ids as the chat template gives them."""
    from datasets import Dataset

    def ids(answer):
        msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(answer)}]
        return list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False))

    return Dataset.from_dict({"chosen_ids": [ids(a) for a in pairs["chosen"]],
                              "rejected_ids": [ids(a) for a in pairs["rejected"]]})


def pair_accuracy(scores: pd.Series, pairs: pd.DataFrame) -> float:
    """Fraction of pairs whose chosen item scores higher (ties count as wrong)."""
    return float((pairs["chosen"].map(scores).to_numpy() > pairs["rejected"].map(scores).to_numpy()).mean())


def build_model(spec: str, seed: int, lora_r: int):
    import torch
    from peft import LoraConfig, get_peft_model

    from rmfast.loading.loader import load

    torch.manual_seed(seed)
    lm = load(spec, dtype="float32", device="cpu", random_head_seed=seed)
    model = lm.model.requires_grad_(True)
    cfg = LoraConfig(task_type="SEQ_CLS", r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(model, cfg), lm.tokenizer


def xray_callbacks(args, tok, held_out: pd.DataFrame):
    from rmfast.analysis.data.lexicons import load_dictionary
    from rmfast.integrations.trl import XrayCallback, XrayConfig
    from rmfast.scoring.candidate_files import read_candidates
    from rmfast.scoring.pipeline import Selection

    dic = load_dictionary(args.dictionary)
    word = args.vocab_view == "wordlike"
    vocab = Selection(token_ids=args.vocab_ids, exclude_special=word, wordlike=word, dedup=word)
    common = dict(prompts={"greatest": args.prompt}, name="elo-rm", every_n_steps=None, k=10)
    return {
        "vocab": XrayCallback(XrayConfig(selection=vocab, out=args.out / "xray" / "vocab", dictionary=dic, **common)),
        # the nouns as the sweep reads them (sweep_and_trajectory: the file's column, its order): the same batches,
        # so the sweep of the checkpoints equals these in-training scans bit for bit
        "big2": XrayCallback(XrayConfig(selection=Selection(texts=read_candidates(args.dictionary, "token_decoded").texts),
                                        out=args.out / "xray" / "big2", dictionary=dic, **common)),
        "heldout": XrayCallback(XrayConfig(selection=Selection(texts=held_out["name"].astype(str).tolist()),
                                           out=args.out / "xray" / "heldout", **common)),
    }


def train(args) -> dict:
    import torch
    from trl import RewardConfig, RewardTrainer

    torch.set_num_threads(args.threads)
    train_items, held = split_items(args.elo, args.holdout, args.seed)
    train_pairs = make_pairs(train_items, args.train_pairs, min_gap=args.min_gap, seed=args.seed + 1)
    eval_pairs = make_pairs(held, args.eval_pairs, min_gap=args.min_gap, seed=args.seed + 2)
    model, tok = build_model(args.model, args.seed, args.lora_r)
    used = sorted(set(eval_pairs["chosen"]) | set(eval_pairs["rejected"]))
    cbs = xray_callbacks(args, tok, pd.DataFrame({"name": used}))
    cfg = RewardConfig(output_dir=str(args.out / "run"), per_device_train_batch_size=args.batch, max_steps=args.steps,
                       learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, logging_steps=args.log_steps,
                       save_strategy="steps", save_steps=args.save_steps, save_only_model=True, report_to=[],
                       seed=args.seed, data_seed=args.seed, use_cpu=True, dataloader_num_workers=0,
                       disable_tqdm=True, max_length=None)
    trainer = RewardTrainer(model=model, args=cfg, train_dataset=tokenize_pairs(train_pairs, tok, args.prompt),
                            processing_class=tok, callbacks=list(cbs.values()))
    for cb in cbs.values():
        cb.trainer = trainer
        cb.xray(trainer.model, tok, 0)  # the fresh head, before any step: the trajectory's first point
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    return {"train_pairs": train_pairs, "eval_pairs": eval_pairs, "callbacks": cbs, "train_s": train_s,
            "log_history": trainer.state.log_history, "n_train_items": len(train_items), "n_heldout_items": len(held)}


def sweep_and_trajectory(args) -> dict:
    """``rmfast sweep`` over the run's LoRA checkpoints (Big Two nouns), then ``analyze trajectory``."""
    from rmfast.cli import main as cli

    cfg = args.out / "sweep.yaml"
    cfg.write_text(json.dumps({"out": str(args.out / "store"), "defaults": {"dtype": "float32", "compile": "off"},
                               "models": [{"model": str(args.out / "run"), "name": "elo-rm"}],
                               "prompts": {"greatest": args.prompt},
                               "candidates": {"big2": {"file": str(args.dictionary), "column": "token_decoded"}}}))
    t0 = time.perf_counter()
    rc = cli(["sweep", str(cfg), "--no-progress"])
    sweep_s = time.perf_counter() - t0
    rc2 = cli(["analyze", "trajectory", str(args.out / "store" / "parts"), "--dictionary", str(args.dictionary),
               "--out", str(args.out / "trajectory"), "--overwrite"])  # its own folder: a rerun replaces it
    return {"sweep_rc": rc, "trajectory_rc": rc2, "sweep_s": round(sweep_s, 1)}


def report(args, run: dict, sweep: dict) -> dict:
    from rmfast.analysis.data.scans import load_scans

    held = load_scans(args.out / "xray" / "heldout")
    acc = {}
    for model, g in held.groupby("model"):
        step = int(model.rsplit("-", 1)[1])
        acc[step] = round(pair_accuracy(g.set_index("text")["score"], run["eval_pairs"]), 4)
    steps = {}
    for name in ("vocab", "big2"):
        for h in run["callbacks"][name].history:
            s = steps.setdefault(h["step"], {})
            s[f"{name}_top"] = h["top"]["greatest"][:10]
            s[f"{name}_bottom"] = h["bottom"]["greatest"][:5]
            s[f"{name}_gap_communion_minus_agency"] = h["scalars"].get("rmfast/greatest/gap/Communion_minus_Agency")
            s[f"{name}_xray_s"] = h["xray_s"]
    for h in run["callbacks"]["heldout"].history:
        steps.setdefault(h["step"], {})["heldout_xray_s"] = h["xray_s"]
    losses = [(e["step"], round(e["loss"], 4)) for e in run["log_history"] if "loss" in e]
    out = {"args": {k: str(v) for k, v in vars(args).items()}, "n_train_items": run["n_train_items"],
           "n_heldout_items": run["n_heldout_items"], "train_s": round(run["train_s"], 1), "train_loss": losses,
           "heldout_pair_accuracy": {k: acc[k] for k in sorted(acc)}, "steps": {k: steps[k] for k in sorted(steps)}, **sweep}
    (args.out / "report.json").write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output folder (run/, xray/, store/, trajectory/, report.json)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="base model (default: the embedded SmolLM2)")
    p.add_argument("--elo", type=Path, default=DATA / "eloeverything" / "What, in one word, is the greatest thing ever.csv",
                   help="EloEverything CSV (name, elo_score)")
    p.add_argument("--dictionary", type=Path, default=DATA / "lexicons" / "big2_nouns.csv",
                   help="category dictionary (default: the Big Two nouns)")
    p.add_argument("--prompt", default=GREATEST, help="the user turn of every pair and x-ray (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="item split, pair sampling, head and LoRA init (default 0)")
    p.add_argument("--holdout", type=float, default=0.2, help="fraction of items held out (default 0.2)")
    p.add_argument("--min-gap", type=float, default=100.0, help="least Elo difference in a pair (default 100)")
    p.add_argument("--train-pairs", type=int, default=64, help="training pairs (default 64: one pass at 16 steps of 4)")
    p.add_argument("--eval-pairs", type=int, default=150, help="held-out pairs (default 150)")
    p.add_argument("--steps", type=int, default=16, help="optimizer steps (default 16)")
    p.add_argument("--batch", type=int, default=4, help="pairs per step (default 4)")
    p.add_argument("--lr", type=float, default=5e-4, help="learning rate, constant (default 5e-4)")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--save-steps", type=int, default=8, help="checkpoint (and x-ray) every N steps (default 8)")
    p.add_argument("--log-steps", type=int, default=2, help="log the training loss every N steps (default 2)")
    p.add_argument("--vocab-ids", default="0:2000", help="vocabulary x-ray: the id range (default 0:2000: SmolLM2's "
                                                         "most frequent merges; a CPU-sized slice of the 49,152)")
    p.add_argument("--vocab-view", choices=("wordlike", "all"), default="wordlike",
                   help="wordlike: only whole-word tokens, deduplicated (the papers' view); all: every id (default wordlike)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--smoke", action="store_true", help="two steps on 16 pairs, tiny x-rays: checks the pipeline (a few minutes on a 2-core CPU, the first run also measuring its padding once)")
    args = p.parse_args(argv)
    if args.smoke:
        args.train_pairs, args.eval_pairs, args.steps, args.batch, args.save_steps = 16, 16, 2, 4, 1
        args.log_steps, args.vocab_ids, args.vocab_view = 1, "0:256", "all"
    return args


def main(argv=None) -> dict:
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("rmfast.xray").setLevel(logging.INFO)  # one line per x-ray
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run = train(args)
    out = report(args, run, sweep_and_trajectory(args))
    print(json.dumps({k: out[k] for k in ("train_s", "heldout_pair_accuracy", "sweep_s")}), file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
