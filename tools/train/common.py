"""What the scripts of tools/train/ share about their files (standard library only).

It owns reading a JSONL file, the ChatML rendering of a conversation (the corpus `text` and what
the tokenizer's chat template must give) and the options that name the Spec-Bench evaluation
prompts. It owns no model and no training step: training.py holds the steps that train_target.py
and train_drafter.py share.
"""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def read_jsonl(path):
    """The objects of a JSONL file, one per non-blank line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def render(messages):
    """Messages as the ChatML chat template renders them (no system message, no generation prompt)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def add_eval_arguments(ap):
    """--eval-summarization and --eval-math: the Spec-Bench evaluation prompts in data/spec_bench/."""
    ap.add_argument("--eval-summarization", type=Path, default=REPO / "data" / "spec_bench" / "summarization.jsonl")
    ap.add_argument("--eval-math", type=Path, default=REPO / "data" / "spec_bench" / "math_reasoning.jsonl")
