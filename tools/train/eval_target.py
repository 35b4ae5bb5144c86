#!/usr/bin/env python3
"""Evaluate the exported target (issue 5): held-out perplexity, greedy samples, router statistics.

Reads   tools/train/out/target/                 (train_target.py export; loaded with the Auto classes, as shipped)
        tools/train/out/corpus/valid.jsonl      (350 held-out documents: 300 GSM8K, 50 CNN/DM)
        data/spec_bench/{math_reasoning,summarization}.jsonl
Writes  tools/train/out/target_eval.json

The bf16 weights are loaded as f32 (an exact upcast) and run in f32 on CPU.
- Perplexity: every validation document is scored on its own from position 0 (no packing, no <|endoftext|>
  before it), over all predicted tokens ("all") and over the assistant answer only ("assistant": the tokens after
  `<|im_start|>assistant\\n`, including the closing <|im_end|> and newline). Reported per source and overall,
  token-weighted.
- Samples: greedy continuations (stop at <|im_end|>) of one Spec-Bench math_reasoning and one summarization
  prompt, rendered with the tokenizer's chat template and add_generation_prompt=True, next to the reference.
- Router: over all validation tokens, per layer, how often each expert is in the top-k; the entropy of that
  load distribution (nats, and divided by ln(num_experts): 1 = perfectly even), the fraction of experts ever
  chosen, the fraction chosen at least 10% of the even share, and the busiest expert's load / the even share.
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import read_jsonl

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = HERE / "out"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=OUT / "target")
    p.add_argument("--valid", type=Path, default=OUT / "corpus" / "valid.jsonl")
    p.add_argument("--spec-bench", type=Path, default=REPO / "data" / "spec_bench")
    p.add_argument("--out", type=Path, default=OUT / "target_eval.json")
    p.add_argument("--gsm8k-id", type=int, default=401, help="math_reasoning question_id for the sample")
    p.add_argument("--cnn-id", type=int, default=241, help="summarization question_id for the sample")
    p.add_argument("--gsm8k-new-tokens", type=int, default=160)
    p.add_argument("--cnn-new-tokens", type=int, default=120)
    p.add_argument("--max-docs", type=int, default=0, help="score only the first N documents of each source (0 = all)")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args()


def router_summary(counts, num_experts):
    res = []
    for layer, c in enumerate(counts):
        p = c / c.sum()
        nz = p[p > 0]
        ent = float(-(nz * nz.log()).sum())
        res.append({"layer": layer, "entropy_nats": round(ent, 4), "entropy_norm": round(ent / math.log(num_experts), 4),
                    "frac_used": round(float((c > 0).float().mean()), 4),
                    "frac_used_ge_10pct_of_even": round(float((p >= 0.1 / num_experts).float().mean()), 4),
                    "max_load_over_even": round(float(p.max() * num_experts), 3),
                    "min_load_over_even": round(float(p.min() * num_experts), 3)})
    return res


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    cfg = model.config
    E, K = cfg.num_experts, cfg.num_experts_per_tok
    result = {"model": str(a.model), "config": {k: getattr(cfg, k) for k in (
        "hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")},
        "params": sum(p.numel() for p in model.parameters())}
    train_info = a.model.parent / "target_train_info.json"
    if train_info.exists():
        ex = json.loads(train_info.read_text()).get("export", {})
        result["trained"] = {k: ex.get(k) for k in ("step", "tokens", "complete", "train_s", "mean_tok_per_s")}

    # ---------------------------------------------------------------- perplexity + router counts
    docs = read_jsonl(a.valid)
    by_src = {}
    for d in docs:
        by_src.setdefault(d["source"], []).append(d)
    counts = {src: torch.zeros(cfg.num_hidden_layers, E) for src in by_src}
    ppl = {}
    totals = {"all": [0.0, 0], "assistant": [0.0, 0]}
    long_positions = 0
    with torch.no_grad():
        for src, ds in by_src.items():
            if a.max_docs:
                ds = ds[: a.max_docs]
            acc = {"all": [0.0, 0], "assistant": [0.0, 0]}
            for d in ds:
                ids = tok(d["text"], add_special_tokens=False)["input_ids"]
                prefix = tok.apply_chat_template(d["messages"][:1], add_generation_prompt=True, tokenize=True)
                assert ids[: len(prefix)] == prefix, d["id"]
                long_positions += max(0, len(ids) - 2048)
                x = torch.tensor([ids])
                out = model(input_ids=x, output_router_logits=True, use_cache=False)
                nll = F.cross_entropy(out.logits[0, :-1].float(), x[0, 1:], reduction="none")
                acc["all"][0] += nll.sum().item()
                acc["all"][1] += nll.numel()
                asst = nll[len(prefix) - 1:]  # predictions of tokens at positions >= len(prefix)
                acc["assistant"][0] += asst.sum().item()
                acc["assistant"][1] += asst.numel()
                for layer, rl in enumerate(out.router_logits):
                    sel = torch.topk(F.softmax(rl.float(), dim=-1), K, dim=-1).indices
                    counts[src][layer] += torch.bincount(sel.reshape(-1), minlength=E).float()
            ppl[src] = {"docs": len(ds)}
            for k, (s, n) in acc.items():
                ppl[src][k] = {"tokens": n, "nll": round(s / n, 4), "ppl": round(math.exp(s / n), 3)}
                totals[k][0] += s
                totals[k][1] += n
    ppl["all"] = {k: {"tokens": n, "nll": round(s / n, 4), "ppl": round(math.exp(s / n), 3)} for k, (s, n) in totals.items()}
    ppl["tokens_past_position_2048"] = long_positions
    result["perplexity"] = ppl
    result["perplexity_s"] = round(time.time() - t0, 1)

    all_counts = sum(counts.values())
    result["router"] = {"tokens_scored": int(all_counts[0].sum().item() // K), "overall": router_summary(all_counts, E),
                        "by_source": {src: router_summary(c, E) for src, c in counts.items()},
                        "frac_experts_ever_used_all_layers": round(float((all_counts > 0).float().mean()), 4),
                        "mean_entropy_norm": round(sum(r["entropy_norm"] for r in router_summary(all_counts, E))
                                                   / cfg.num_hidden_layers, 4)}

    # ---------------------------------------------------------------- greedy samples
    samples = []
    for fname, qid, n_new in (("math_reasoning.jsonl", a.gsm8k_id, a.gsm8k_new_tokens),
                              ("summarization.jsonl", a.cnn_id, a.cnn_new_tokens)):
        q = next(r for r in read_jsonl(a.spec_bench / fname) if r["question_id"] == qid)
        prompt = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                         tokenize=True)
        ts = time.time()
        with torch.no_grad():
            gen = model.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        new = gen[0, len(prompt):].tolist()
        samples.append({"category": q["category"], "question_id": qid, "prompt_tokens": len(prompt),
                        "prompt_tail": q["turns"][0][-300:], "new_tokens": len(new),
                        "stopped_at_eos": bool(new and new[-1] == tok.eos_token_id),
                        "continuation": tok.decode(new, skip_special_tokens=False),
                        "reference": q["reference"][0], "generate_s": round(time.time() - ts, 1)})
    result["samples"] = samples
    result["total_s"] = round(time.time() - t0, 1)
    a.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({"perplexity": {k: v for k, v in ppl.items()}, "router_mean_entropy_norm":
                      result["router"]["mean_entropy_norm"], "frac_experts_ever_used":
                      result["router"]["frac_experts_ever_used_all_layers"]}, indent=1))
    for s in samples:
        print(f"--- {s['category']} {s['question_id']} ({s['prompt_tokens']} prompt tokens)\n{s['continuation']}")


if __name__ == "__main__":
    main()
