#!/usr/bin/env python3
"""Train the project's small Qwen3-MoE target from scratch on the training corpus (issue 5).

Reads   tools/train/out/corpus/{train,valid}.jsonl   (build_corpus.py)
        tools/train/out/tokenizer/                   (train_tokenizer.py)
Writes  tools/train/out/target_ckpt/state.pt         training state (model f32, AdamW, step, RNG), every
                                                     --ckpt-minutes, at the end, and on SIGINT/SIGTERM
        tools/train/out/target_log.jsonl             one JSON object per line: start/resume, train, valid, ckpt, export
        tools/train/out/target/                      the export: config.json, model.safetensors (bf16),
                                                     generation_config.json, tokenizer files
        tools/train/out/target_train_info.json       config, parameter counts, budget, final losses, throughput

The model is a transformers `Qwen3MoeForCausalLM` (every layer sparse, no shared expert) trained in f32 on
CPU. Documents (the corpus `text`, already rendered with the ChatML template) are shuffled with --seed,
joined with <|endoftext|> (id 0) between them and cut into --seq-len token sequences, so long CNN/DM
articles are chunked across sequences. The sequence order of each epoch is a permutation seeded by
(--seed, epoch), so the batch at step i depends only on i and a resumed run sees the same data.

Loss = next-token cross entropy over every position + --aux-coef * load-balancing loss. The balancing loss
is the Switch/Mixtral one that transformers uses (num_experts * sum_e f_e * P_e, f = fraction of top-k
slots routed to e, P = mean router probability), but computed per layer and averaged over layers; the
transformers helper concatenates all layers' router logits and so only balances experts' totals across
layers. Its value is top_k (4) at perfect balance.

Rerunning the same command resumes from state.pt. When the step budget is reached the script exports.
--export-only exports the latest checkpoint without training (use it after an interrupted run).
--bench N runs N steps from a fresh model, prints tokens/s and writes nothing.
"""

import argparse
import copy
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import read_jsonl
from training import (OUT, add_output_arguments, add_run_arguments, add_schedule_arguments, adamw, fresh_dir,
                      jsonable, load_state, log, lr_at, optimizer_step, process_info, resume, save_state_atomic,
                      set_threads_and_seed, stop_flag)

EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

# Chosen from the throughput measured on this machine at nice 19 (README "Target model"): ~1,600 tokens/s
# when the CPUs are free, 150-200 tokens/s while builds hold both cores; the first 12 minutes of a real run
# averaged ~290 tokens/s. 600 steps x 4,096 tokens = 2.46 M tokens (~1 epoch): ~26 min when idle, ~70 min at
# 587 tokens/s (a half-contended mix), longer under sustained builds.
DEFAULT_STEPS = 600


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", type=Path, default=OUT / "corpus")
    p.add_argument("--tokenizer", type=Path, default=OUT / "tokenizer")
    add_output_arguments(p, "target")
    # model
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--moe-intermediate", type=int, default=40,
                   help="expert SwiGLU width; 40 keeps the bf16 export at ~39 MB (128 would be ~108 MB)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    # optimisation
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="total optimizer steps (the budget)")
    p.add_argument("--seq-len", type=int, default=2048,
                   help="2048 so the model sees the positions of the bench's CNN/DM prompts (up to ~1,900 tokens)")
    p.add_argument("--batch", type=int, default=2, help="sequences per step")
    add_schedule_arguments(p, warmup=30, weight_decay=0.1, clip=1.0, min_lr_help="cosine decays to lr * this")
    p.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss weight (router_aux_loss_coef)")
    # bookkeeping
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-seqs", type=int, default=12, help="validation sequences of --seq-len per periodic eval")
    add_run_arguments(p, bench_help="time N steps of a fresh model, print tokens/s, write nothing")
    return p.parse_args()


def make_config(a):
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(
        vocab_size=4096, hidden_size=a.hidden, intermediate_size=2 * a.hidden,  # unused: every layer is MoE
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        hidden_act="silu", max_position_embeddings=4096, initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True,
        tie_word_embeddings=False, rope_theta=1e6, rope_scaling=None, attention_bias=False, use_sliding_window=False,
        attention_dropout=0.0, decoder_sparse_step=1, moe_intermediate_size=a.moe_intermediate,
        num_experts_per_tok=a.top_k, num_experts=a.experts, norm_topk_prob=True, output_router_logits=False,
        router_aux_loss_coef=a.aux_coef, mlp_only_layers=[],
        bos_token_id=None, eos_token_id=IM_END_ID, pad_token_id=EOT_ID,
    )


def param_counts(model, cfg):
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    active = total - expert + cfg.num_hidden_layers * cfg.num_experts_per_tok * per_expert
    return {"total": total, "experts": expert, "non_expert": total - expert, "per_expert": per_expert,
            "active_per_token": active, "bf16_bytes_estimate": 2 * total}


# ---------------------------------------------------------------- data

def load_stream(path, tok, seed):
    """Token stream: documents in a seeded order, <|endoftext|> between them (and at the end)."""
    docs = read_jsonl(path)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(docs), generator=g).tolist()
    ids = tok([docs[i]["text"] for i in order], add_special_tokens=False)["input_ids"]
    stream = []
    for x in ids:
        stream.extend(x)
        stream.append(EOT_ID)
    return torch.tensor(stream, dtype=torch.long), len(docs)


def chunk(stream, seq_len):
    n = len(stream) // seq_len
    return stream[: n * seq_len].view(n, seq_len)


def batch_at(seqs, step, batch, seed):
    """Sequences of step `step`: global indices step*batch .. +batch over per-epoch seeded permutations."""
    n = seqs.shape[0]
    rows = []
    for gi in range(step * batch, (step + 1) * batch):
        epoch, i = divmod(gi, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000003 + epoch))
        rows.append(seqs[perm[i]])
    return torch.stack(rows)


# ---------------------------------------------------------------- loss

def balance_loss(router_logits, num_experts, top_k):
    """Mean over layers of num_experts * sum_e f_e * P_e (transformers' formula, per layer)."""
    losses = []
    for logits in router_logits:
        probs = F.softmax(logits.float(), dim=-1)                      # [tokens, E]
        _, sel = torch.topk(probs, top_k, dim=-1)
        mask = F.one_hot(sel, num_experts).float()                     # [tokens, k, E]
        f = mask.mean(dim=0)                                           # [k, E]
        P = probs.mean(dim=0)                                          # [E]
        losses.append((f * P.unsqueeze(0)).sum() * num_experts)
    return torch.stack(losses).mean()


def forward_loss(model, x, cfg, aux_coef, want_aux=True):
    out = model(input_ids=x, output_router_logits=want_aux, use_cache=False)
    logits = out.logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    aux = balance_loss(out.router_logits, cfg.num_experts, cfg.num_experts_per_tok) if want_aux else torch.zeros(())
    return ce + aux_coef * aux, ce, aux


@torch.no_grad()
def evaluate(model, vseqs, cfg):
    model.eval()
    tot, n = 0.0, 0
    for i in range(vseqs.shape[0]):
        _, ce, _ = forward_loss(model, vseqs[i:i + 1], cfg, 0.0, want_aux=False)
        tot += ce.item() * (vseqs.shape[1] - 1)
        n += vseqs.shape[1] - 1
    model.train()
    return tot / n


# ---------------------------------------------------------------- state

def save_state(path, model, opt, step, tokens, train_seconds, a):
    save_state_atomic(path, {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                             "train_seconds": train_seconds, "args": jsonable(a), "torch_rng": torch.get_rng_state()})


def export(model, cfg, a, counts, extra):
    from transformers import GenerationConfig
    d = fresh_dir(a.export_dir)
    m = copy.deepcopy(model).to(torch.bfloat16)  # the training model stays f32
    m.config.output_router_logits = False
    m.config.use_cache = True
    m.save_pretrained(d, safe_serialization=True)
    GenerationConfig(eos_token_id=IM_END_ID, pad_token_id=EOT_ID, do_sample=False).save_pretrained(d)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(a.tokenizer / name, d / name)
    sizes = {p.name: p.stat().st_size for p in sorted(d.iterdir())}
    # Round trip: the directory must load unchanged with the Auto classes, with exactly the bf16 weights.
    # (Logits are compared with the f32 model only as information: model.to(bf16) also casts the rotary
    # inv_freq buffer to bf16, which from_pretrained does not, so the two bf16 models are not bit-identical.)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    re = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    want = m.state_dict()
    got = re.state_dict()
    same = set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    x = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}],
                                              add_generation_prompt=True)])
    model.eval()
    with torch.no_grad():
        l32 = model(x).logits.float()
        l16 = re(x).logits.float()
    model.train()
    diff = (l16 - l32).abs().max().item()
    agree = (l16.argmax(-1) == l32.argmax(-1)).float().mean().item()
    del m, re
    rec = {"type": "export", "dir": str(d), "bytes": sizes, "total_bytes": sum(sizes.values()),
           "reload_weights_identical": same, "bf16_vs_f32_max_abs_logit_diff": round(diff, 4),
           "bf16_vs_f32_argmax_agree": round(agree, 4), "tokenizer_len": len(tok), "eos_token_id": tok.eos_token_id, **extra}
    log(a, rec)
    info = {"config": cfg.to_dict(), "params": counts, "args": jsonable(a), "export": rec}
    a.info.write_text(json.dumps(info, indent=1) + "\n")
    if not same:
        sys.exit("export check failed: reloaded weights differ")


# ---------------------------------------------------------------- main

def main():
    a = parse_args()
    set_threads_and_seed(a)
    from transformers import AutoTokenizer, Qwen3MoeForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

    cfg = make_config(a)
    model = Qwen3MoeForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32)
    counts = param_counts(model, cfg)
    state_path = a.ckpt_dir / "state.pt"
    state = load_state(state_path, a.bench)
    if state is not None:
        model.load_state_dict(state["model"])

    if a.export_only:
        if state is None:
            sys.exit(f"--export-only: no checkpoint at {state_path}")
        export(model, cfg, a, counts, {"step": state["step"], "tokens": state["tokens"], "complete":
                                       state["step"] >= a.steps, "train_s": round(state["train_seconds"], 1),
                                       "mean_tok_per_s": round(state["tokens"] / max(state["train_seconds"], 1e-9), 1)})
        return

    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    assert len(tok) == cfg.vocab_size and tok.convert_tokens_to_ids("<|im_end|>") == IM_END_ID
    t0 = time.time()
    tstream, ndocs = load_stream(a.corpus / "train.jsonl", tok, a.seed)
    vstream, _ = load_stream(a.corpus / "valid.jsonl", tok, a.seed)
    seqs = chunk(tstream, a.seq_len)
    vseqs = chunk(vstream, a.seq_len)[: a.eval_seqs]
    tokens_per_step = a.batch * a.seq_len

    opt = adamw(model, a, fused=False)
    step, tokens, train_seconds = resume(opt, state)
    log(a, {"type": "resume" if state else ("bench" if a.bench else "start"), "step": step, "steps": a.steps,
            "params": counts, "train_docs": ndocs, "train_tokens": len(tstream), "train_seqs": seqs.shape[0],
            "seq_len": a.seq_len, "tokens_per_step": tokens_per_step, "epochs_planned":
            round(a.steps * a.batch / seqs.shape[0], 3), "eval_tokens": vseqs.numel(), "data_s": round(time.time() - t0, 1),
            **process_info()})

    stop = stop_flag()

    if a.bench:
        a.steps = max(a.steps, a.bench)
    end = a.bench if a.bench else a.steps
    if not a.bench:
        a.ckpt_dir.mkdir(parents=True, exist_ok=True)
    model.train()
    last_ckpt = time.time()
    win_t, win_tok, win_loss, win_ce, win_aux, win_n = time.time(), 0, 0.0, 0.0, 0.0, 0
    bench_times = []
    while step < end and not stop["flag"]:
        ts = time.time()
        x = batch_at(seqs, step, a.batch, a.seed)
        loss, ce, aux = forward_loss(model, x, cfg, a.aux_coef)
        gnorm = optimizer_step(model, opt, loss, lr_at(step, a), a.clip)
        step += 1
        tokens += tokens_per_step
        dt = time.time() - ts
        train_seconds += dt
        bench_times.append(dt)
        win_tok += tokens_per_step
        win_loss, win_ce, win_aux, win_n = win_loss + loss.item(), win_ce + ce.item(), win_aux + aux.item(), win_n + 1
        if step % a.log_every == 0 or step == end or a.bench:
            now = time.time()
            log(a, {"type": "train", "step": step, "loss": round(win_loss / win_n, 4), "ce": round(win_ce / win_n, 4),
                    "aux": round(win_aux / win_n, 4), "lr": round(lr_at(step - 1, a), 6), "grad_norm": round(gnorm, 3),
                    "tokens": tokens, "tok_per_s": round(win_tok / (now - win_t), 1), "train_s": round(train_seconds, 1)})
            win_t, win_tok, win_loss, win_ce, win_aux, win_n = now, 0, 0.0, 0.0, 0.0, 0
        if not a.bench and (step % a.eval_every == 0 or step == end):
            te = time.time()
            v = evaluate(model, vseqs, cfg)
            log(a, {"type": "valid", "step": step, "loss": round(v, 4), "ppl": round(math.exp(v), 3),
                    "eval_s": round(time.time() - te, 1)})
        if not a.bench and (time.time() - last_ckpt > 60 * a.ckpt_minutes or step == end):
            save_state(state_path, model, opt, step, tokens, train_seconds, a)
            last_ckpt = time.time()
            log(a, {"type": "ckpt", "step": step, "path": str(state_path)})

    if a.bench:
        steady = bench_times[1:] or bench_times
        tps = tokens_per_step * len(steady) / sum(steady)
        print(json.dumps({"bench_steps": len(bench_times), "s_per_step": round(sum(steady) / len(steady), 2),
                          "tok_per_s": round(tps, 1), "minutes_for_default_budget":
                          round(DEFAULT_STEPS * tokens_per_step / tps / 60, 1)}))
        return
    if stop["flag"] and step < end:
        save_state(state_path, model, opt, step, tokens, train_seconds, a)
        log(a, {"type": "ckpt", "step": step, "path": str(state_path), "reason": "signal"})
        return
    export(model, cfg, a, counts, {"step": step, "tokens": tokens, "complete": True,
                                   "train_s": round(train_seconds, 1),
                                   "mean_tok_per_s": round(tokens / max(train_seconds, 1e-9), 1)})


if __name__ == "__main__":
    main()
