#!/usr/bin/env python3
"""Prompts for fitting the route predictor (issue 5): a seeded mix of GSM8K questions and CNN/DM
articles from the training corpus (fit) and from the held-out validation split (accuracy).

Reads   tools/train/out/corpus/{train,valid}.jsonl   (build_corpus.py)
Writes  tools/train/out/predictor/{train,held_out}.jsonl   lines {"question": user turn}

CNN/DM articles are cut to their first --article-chars characters (at a word boundary) and keep
the "Summarize: " instruction, so the prompt still ends with the assistant header and the
target's continuation is a summary, as at bench time.

    tools/.venv/bin/python tools/train/predictor_prompts.py
"""

import argparse
import json
import random
from pathlib import Path

from common import read_jsonl

OUT = Path(__file__).resolve().parent / "out"


def pick(path: Path, gsm8k: int, cnn: int, chars: int, rng: random.Random):
    docs = read_jsonl(path)
    by = {"gsm8k": [], "cnn_dm": []}
    for d in docs:
        by[d["source"]].append(d)
    chosen = rng.sample(by["gsm8k"], gsm8k) + rng.sample(by["cnn_dm"], cnn)
    rng.shuffle(chosen)
    out = []
    for d in chosen:
        user = next(m["content"] for m in d["messages"] if m["role"] == "user")
        if d["source"] == "cnn_dm" and len(user) > chars:
            user = user[:chars].rsplit(" ", 1)[0]
        out.append({"id": d["id"], "source": d["source"], "question": user})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-gsm8k", type=int, default=48)
    ap.add_argument("--train-cnn", type=int, default=16)
    ap.add_argument("--held-gsm8k", type=int, default=12)
    ap.add_argument("--held-cnn", type=int, default=4)
    ap.add_argument("--article-chars", type=int, default=1200)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    (OUT / "predictor").mkdir(parents=True, exist_ok=True)
    for name, src, g, c in [("train", "train", a.train_gsm8k, a.train_cnn),
                            ("held_out", "valid", a.held_gsm8k, a.held_cnn)]:
        rows = pick(OUT / "corpus" / f"{src}.jsonl", g, c, a.article_chars, rng)
        path = OUT / "predictor" / f"{name}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)
        print(path, len(rows), "prompts")


if __name__ == "__main__":
    main()
