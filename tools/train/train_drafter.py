#!/usr/bin/env python3
"""Train the EAGLE-3 drafter of the shipped target by self-distillation (issue 5).

Reads   tools/train/out/target/                      the exported target (train_target.py), run frozen in f32
        tools/train/out/corpus/{train,valid}.jsonl   (build_corpus.py)
Writes  tools/train/out/drafter_ckpt/state.pt        training state (drafter f32, AdamW, step, RNG), every
                                                     --ckpt-minutes, at the end and on SIGINT/SIGTERM
        tools/train/out/drafter_ckpt/eval_set.pt     the held-out evaluation set (target greedy continuations)
        tools/train/out/drafter_log.jsonl            one JSON object per line: start/resume, train, valid, ckpt, export
        tools/train/out/drafter/                     the export: config.json + model.safetensors in the published
                                                     EAGLE-3 layout (LlamaForCausalLMEagle3)
        tools/train/out/drafter_train_info.json      config, parameter counts, arguments, export record

Model (shared/reference/eagle3-qwen3moe.md §1; the same computation as the functional `Eagle3Drafter` of
tools/fixtures/make_eagle3_fixture.py, re-written here as a batched nn.Module for training and checked
against that reference at export):

    h   = fc(concat(f_low, f_mid, f_high))           f_* = target residual stream entering layers 2, N/2, N-3
    x   = concat(RMSNorm_in(embed(tok)), RMSNorm_hidden(h))       [2H], embedding first
    h2  = h + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))       GQA, RoPE (the target's theta), no qk-norm
    h3  = h2 + down(silu(gate(RMSNorm_post(h2))) * up(RMSNorm_post(h2)))
    logits = lm_head(norm(h3))                         over the draft vocabulary; h3 is fed back to the next step

The token embedding is the target's `model.embed_tokens.weight`, frozen, and is not saved.

Data: the corpus `text` of the training documents in a seeded order, <|endoftext|> between them, cut into
--seq-len token chunks (one token of overlap gives the label of the last position). For each batch the frozen
target (f32, loaded from the bf16 export, i.e. exactly the weights the engine runs) gives the three feature
tensors (HF hidden_states[2], [N//2], [N-3]) and its logits. Drafter index t pairs feature f_t with token
x_{t+1} and is trained towards the target's distribution at t+1 (its prediction of x_{t+2}).

Training-time test (EAGLE-3, SafeAILab/EAGLE eagle/traineagle3/cnets.py): the drafter is unrolled --ttt steps.
Step i feeds, at index t, the previous step's output h3 (no fc) and the token x_{t+1+i}, at RoPE position t+i.
Its attention sees the step-0 keys of indices <= t (causal) plus its own keys of steps 1..i at index t only,
which is what a depth-i tree node sees at inference (the committed prefix plus its ancestors). Loss of step i =
soft cross entropy to the target's softmax restricted to the draft vocabulary at position t+1+i, weight
--decay**i; positions whose target argmax is outside the draft vocabulary are masked; assistant tokens weigh 1,
prompt tokens --prompt-weight (default 0, as EAGLE-3). Step 0 runs on every index (its keys are the context of
all later steps); steps > 0 run only on the indices that carry loss, and chunks with fewer than --min-assistant
assistant tokens are skipped. AdamW, linear warmup + cosine.

Evaluation (every --eval-every steps and at the end): --eval-gsm8k GSM8K and --eval-cnn CNN/DM prompts from
valid.jsonl, continued greedily by the target (--eval-new-tokens, cached in eval_set.pt). On that text the
target's argmax is the next token, so teacher forcing is exact: per step top-1 agreement and the mean
committed tokens per position of a greedy top-1 *chain* of depth --ttt (1 + the number of leading steps whose
draft argmax equals the target's), per source.

Rerunning the same command resumes from state.pt; at the end of the budget the script exports.
--export-only exports the latest checkpoint. --bench N times N steps and writes nothing.
"""

import argparse
import copy
import hashlib
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import REPO, read_jsonl
from training import (OUT, add_output_arguments, add_run_arguments, add_schedule_arguments, adamw, fresh_dir,
                      jsonable, load_state, log, lr_at, optimizer_step, process_info, resume, save_state_atomic,
                      set_threads_and_seed, stop_flag)

EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
ASSISTANT_TAG = "<|im_start|>assistant\n"

# Budget from the throughput measured on this machine (README "Drafter"): ~1,980 tokens/s (2.07 s per step of
# 4 x 1,024 tokens) with the CPUs free, so 1,000 steps = 4.1 M tokens (~1.8 passes over the 2,231 chunks that hold
# assistant tokens) take ~35 min; under a concurrent cargo build it was 5-10x slower.
DEFAULT_STEPS = 1000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=Path, default=OUT / "target", help="exported target (HF dir, bf16)")
    p.add_argument("--corpus", type=Path, default=OUT / "corpus")
    add_output_arguments(p, "drafter")
    # drafter
    p.add_argument("--draft-vocab", type=int, default=4096,
                   help="draft vocabulary: the most frequent target ids in the training responses "
                        "(4096 = the whole target vocabulary; d2t/t2d are still written)")
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--lm-head-init", choices=["target", "random"], default="target",
                   help="start lm_head and norm from the target's rows for the draft vocabulary")
    p.add_argument("--export-dtype", choices=["bf16", "f32"], default="bf16")
    # training
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="total optimizer steps (the budget)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4, help="chunks per step")
    p.add_argument("--ttt", type=int, default=5,
                   help="training-time-test unroll length (the engine's default tree has 5 levels)")
    p.add_argument("--decay", type=float, default=0.8, help="loss weight of unroll step i is decay**i")
    p.add_argument("--prompt-weight", type=float, default=0.0,
                   help="loss weight of positions predicting a prompt (non-assistant) token; assistant tokens weigh 1. "
                        "With 0 (as EAGLE-3) the unroll steps > 0 only run on the positions that carry loss")
    p.add_argument("--min-assistant", type=int, default=16,
                   help="with --prompt-weight 0, skip chunks with fewer assistant tokens than this")
    add_schedule_arguments(p, warmup=50, weight_decay=0.01, clip=0.5)
    # evaluation / bookkeeping
    p.add_argument("--eval-gsm8k", type=int, default=12)
    p.add_argument("--eval-cnn", type=int, default=4)
    p.add_argument("--eval-new-tokens", type=int, default=96)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=5)
    add_run_arguments(p, bench_help="time N steps, print tokens/s, write nothing")
    return p.parse_args(argv)


# ---------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, H, nh, nkv, hd, theta):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, x, pos):
        """x [..., T, hd] with pos [T], or x [M, heads, hd] with pos [M]."""
        f = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((f, f), dim=-1)
        if x.dim() == 3:
            emb = emb[:, None, :]
        return x * emb.cos() + rotate_half(x) * emb.sin()

    def qkv(self, x):
        rep = self.nh // self.nkv
        q = self.q_proj(x).unflatten(-1, (self.nh, self.hd))
        k = self.k_proj(x).unflatten(-1, (self.nkv, self.hd)).repeat_interleave(rep, dim=-2)
        v = self.v_proj(x).unflatten(-1, (self.nkv, self.hd)).repeat_interleave(rep, dim=-2)
        return q, k, v

    def causal(self, x, pos):
        """Step 0: plain causal attention over all T indices. x [B,T,2H]. Returns out [B,T,H] and the keys and
        values [B,nh,T,hd] that the later unroll steps attend to."""
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x))
        q, k = self.rope(q, pos), self.rope(k, pos)
        s = (q @ k.transpose(2, 3)) / math.sqrt(self.hd)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        out = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd)), (k, v)

    def unrolled(self, x, ti, rows, pos, kv0, cache):
        """Step i >= 1 at M selected indices (EAGLE-3 training-time test). x [M,2H]; ti [M] the index t of each;
        rows: per batch row b, the slice of the M entries that belong to it; pos [M] = ti + i; kv0 the step-0
        keys/values [B,nh,T,hd]; cache: (k, v) [M,nh,hd] of steps 1..i-1, appended to. Index t attends to the
        step-0 keys of indices <= t and to its own keys of steps 1..i (a depth-i tree node sees the committed
        prefix and its ancestors)."""
        q, k, v = self.qkv(x)                                          # [M, heads, hd]
        q, k = self.rope(q, pos), self.rope(k, pos)
        cache.append((k, v))
        scale = 1.0 / math.sqrt(self.hd)
        k0, v0 = kv0
        T = k0.shape[2]
        s0 = torch.cat([torch.einsum("mhd,htd->mht", q[r], k0[b]) for b, r in enumerate(rows)], dim=0) * scale
        s0 = s0.masked_fill(torch.arange(T)[None, None, :] > ti[:, None, None], float("-inf"))
        diag = torch.stack([(q * kj).sum(-1) * scale for kj, _ in cache], dim=-1)  # [M, nh, i]
        p = torch.softmax(torch.cat((s0, diag), dim=-1), dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.cat([torch.einsum("mht,htd->mhd", p[r, :, :T], v0[b]) for b, r in enumerate(rows)], dim=0)
        for j, (_, vj) in enumerate(cache):
            out = out + p[..., T + j, None] * vj
        return self.o_proj(out.reshape(out.shape[0], self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, H, I, nh, nkv, hd, eps, theta):
        super().__init__()
        self.hidden_norm = RMSNorm(H, eps)
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(H, nh, nkv, hd, theta)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(H, I)

    def forward(self, emb, h, attend):
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(h)), dim=-1)
        a, extra = attend(x)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), extra


class Eagle3Head(nn.Module):
    """EAGLE-3 drafter; parameter names are the published checkpoint's tensor names."""

    def __init__(self, cfg, embed):
        super().__init__()
        H = cfg["hidden_size"]
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.midlayer = MidLayer(H, cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                 cfg["head_dim"], cfg["rms_norm_eps"], cfg["rope_theta"])
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(H, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("embed", embed, persistent=False)  # the target's, frozen, not saved

    def unroll(self, feats, tokens, n, sel=None):
        """Training-time-test unroll. feats [B,T,3H] (target features of indices 0..T-1); tokens [B, T+n-1]: index
        t of step i reads tokens[:, t+i] at RoPE position t+i; step i > 0 takes step i-1's output h3 (no fc).
        sel: per batch row a sorted LongTensor of the indices whose outputs are wanted (default: all). Step 0 runs
        on every index (its keys are the context of every later step); the later steps only on sel.
        Returns (logits of each step [M, Vd] in sel order (row 0's first), batch-row ids bi [M], indices ti [M])."""
        B, T, _ = feats.shape
        if sel is None:
            sel = [torch.arange(T)] * B
        att = self.midlayer.self_attn
        pos = torch.arange(T)
        h0, kv0 = self.midlayer(self.embed[tokens[:, :T]], self.fc(feats), lambda x: att.causal(x, pos))
        bi = torch.cat([torch.full((len(s),), b, dtype=torch.long) for b, s in enumerate(sel)])
        ti = torch.cat(list(sel))
        ends = torch.tensor([len(s) for s in sel]).cumsum(0).tolist()
        rows = [slice(e - len(s), e) for e, s in zip(ends, sel)]
        h = h0[bi, ti]
        outs = [self.lm_head(self.norm(h))]
        cache = []
        for i in range(1, n):
            h, _ = self.midlayer(self.embed[tokens[bi, ti + i]], h,
                                 lambda x: (att.unrolled(x, ti, rows, ti + i, kv0, cache), None))
            outs.append(self.lm_head(self.norm(h)))
        return outs, bi, ti


def drafter_config(a, tcfg):
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": tcfg.hidden_size,
        "intermediate_size": a.intermediate,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": tcfg.rms_norm_eps,
        "rope_theta": tcfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": tcfg.max_position_embeddings,
        "vocab_size": tcfg.vocab_size,
        "draft_vocab_size": a.draft_vocab,
        "target_hidden_size": tcfg.hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": None,
        "eos_token_id": IM_END_ID,
        "pad_token_id": EOT_ID,
        "torch_dtype": "bfloat16" if a.export_dtype == "bf16" else "float32",
    }


# ---------------------------------------------------------------- data


def encode_docs(tok, docs):
    """Token ids of each document's `text` and, per token, 1 if it is part of the assistant answer (the answer
    and its closing <|im_end|>), else 0."""
    encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    out = []
    for d, e in zip(docs, encs):
        t = d["text"]
        a0 = t.index(ASSISTANT_TAG) + len(ASSISTANT_TAG)
        a1 = t.rindex("<|im_end|>") + len("<|im_end|>")
        roles = [1 if (s >= a0 and en <= a1) else 0 for s, en in e.offsets]
        out.append((e.ids, roles))
    return out


def build_stream(encoded, seed):
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(encoded), generator=g).tolist()
    ids, roles = [], []
    for i in order:
        ids.extend(encoded[i][0])
        roles.extend(encoded[i][1])
        ids.append(EOT_ID)
        roles.append(0)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(roles, dtype=torch.long)


def draft_vocabulary(encoded, n, vocab):
    """The n most frequent ids among assistant tokens (ties: smaller id first), sorted; d2t offsets, t2d mask."""
    c = Counter()
    for ids, roles in encoded:
        c.update(i for i, r in zip(ids, roles) if r)
    ranked = sorted(range(vocab), key=lambda i: (-c.get(i, 0), i))
    used = sorted(ranked[:n])
    total = sum(c.values())
    coverage = sum(c.get(i, 0) for i in used) / max(total, 1)
    used_t = torch.tensor(used, dtype=torch.long)
    d2t = (used_t - torch.arange(n)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used_t] = True
    return used_t, d2t, t2d, coverage, total


def chunk_starts(roles, seq_len, min_assistant):
    """Chunk c covers stream[c*L : c*L + L + 1] (the extra token labels the last position). Chunks with fewer
    than min_assistant assistant tokens among their labels are dropped (they would carry no loss)."""
    n = (len(roles) - 1) // seq_len
    starts = torch.arange(n) * seq_len
    if min_assistant > 0:
        cs = torch.cat((torch.zeros(1, dtype=torch.long), roles.cumsum(0)))
        a = cs[starts + seq_len + 1] - cs[starts + 2]
        starts = starts[a >= min_assistant]
    return starts, n


def batch_at(stream, roles, starts, step, batch, seq_len, seed):
    rows, rrows = [], []
    n_chunks = len(starts)
    for gi in range(step * batch, (step + 1) * batch):
        epoch, i = divmod(gi, n_chunks)
        perm = torch.randperm(n_chunks, generator=torch.Generator().manual_seed(seed * 1000003 + 7919 + epoch))
        s = int(starts[perm[i]])
        rows.append(stream[s:s + seq_len + 1])
        rrows.append(roles[s:s + seq_len + 1])
    return torch.stack(rows), torch.stack(rrows)


# ---------------------------------------------------------------- target features


@torch.no_grad()
def target_features(target, x, taps):
    """x [B,T] -> features [B,T,3H] (residual stream entering layers taps, low|mid|high), logits [B,T,V]."""
    out = target(input_ids=x, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    return torch.cat([hs[i] for i in taps], dim=-1).float(), out.logits.float()


def ttt_loss(model, feats, logits_t, x, weights, used, t2d, n, decay):
    """One training-time-test forward.
    x [B,T+1] tokens (x[:, T] only labels); feats/logits_t of x[:, :T]; weights [B,T+1] per token (the loss
    weight of predicting that token). Drafter index t (0..T-2): step i feeds token x[t+1+i] and is trained
    towards the target's distribution at position t+1+i (its prediction of x[t+2+i]); valid while t+1+i <= T-1.
    Returns (loss, per-step losses, per-step (correct, count))."""
    B, T = x.shape[0], x.shape[1] - 1
    Td = T - 1
    tok = torch.cat((x[:, 1:T], torch.zeros(B, n, dtype=torch.long)), dim=1)  # [B, Td + n]
    tl = logits_t[:, 1:]                                            # index j = position j+1, [B, Td, V]
    targ_arg = tl.argmax(-1)
    in_vocab = t2d[targ_arg]
    tp = torch.softmax(tl[..., used], dim=-1)                       # restricted to the draft vocabulary
    darg = torch.searchsorted(used, targ_arg)                       # draft index of the target argmax (if in_vocab)
    w = weights[:, 2:T + 1].float() * in_vocab.float()              # index j: weight of predicting x[j+2]
    wp = torch.cat((w, torch.zeros(B, n)), dim=1)                   # zero past the chunk
    anyw = torch.stack([wp[:, i:i + Td] for i in range(n)]).amax(0) > 0
    sel = [anyw[b].nonzero().squeeze(1) for b in range(B)]
    outs, bi, ti = model.unroll(feats[:, :Td], tok, n, sel)
    total, losses, accs = 0.0, [], []
    for i, lg in enumerate(outs):
        m = wp[bi, ti + i]
        j = (ti + i).clamp(max=Td - 1)
        logp = F.log_softmax(lg.float(), dim=-1)
        ce = -(tp[bi, j] * logp).sum(-1)
        li = (ce * m).sum() / m.sum().clamp(min=1e-6)
        total = total + (decay ** i) * li
        losses.append(li.detach())
        with torch.no_grad():
            hit = (lg.argmax(-1) == darg[bi, j]) & in_vocab[bi, j]
            accs.append(((hit.float() * m).sum().item(), m.sum().item()))
    return total, losses, accs


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def make_eval_set(target, tok, a):
    """Greedy target continuations of held-out prompts: the first --eval-gsm8k GSM8K and --eval-cnn CNN/DM
    documents of valid.jsonl (corpus order), rendered with the generation prompt."""
    docs = read_jsonl(a.corpus / "valid.jsonl")
    picked = [d for d in docs if d["source"] == "gsm8k"][: a.eval_gsm8k] + \
             [d for d in docs if d["source"] == "cnn_dm"][: a.eval_cnn]
    items = []
    for d in picked:
        prompt = d["text"][: d["text"].index(ASSISTANT_TAG) + len(ASSISTANT_TAG)]
        ids = tok.encode(prompt, add_special_tokens=False).ids
        x = torch.tensor([ids])
        gen = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.eval_new_tokens,
                              do_sample=False, eos_token_id=IM_END_ID, pad_token_id=EOT_ID)
        items.append({"id": d["id"], "source": d["source"], "prompt_len": len(ids), "ids": gen[0].tolist()})
    return items


@torch.no_grad()
def evaluate(model, target, items, taps, used, t2d, n):
    """Per source: per-step top-1 agreement on the generated part and the mean committed tokens per position of
    a greedy top-1 chain of depth n (1 + leading steps whose draft argmax is the target's next token)."""
    model.eval()
    res = {}
    for it in items:
        s = torch.tensor([it["ids"]])
        T = s.shape[1]
        feats, logits = target_features(target, s, taps)
        Td = T - 1
        tok = torch.cat((s[:, 1:T], torch.zeros(1, n, dtype=torch.long)), dim=1)
        # index t has root s[t+1]: the first decode cycle's root is the first generated token
        t0 = it["prompt_len"] - 1
        outs, _, ti = model.unroll(feats[:, :Td], tok, n, [torch.arange(t0, Td)])
        targ = logits[0, 1:].argmax(-1)                              # index j: target argmax at position j+1
        r = res.setdefault(it["source"], {"hit": [0] * n, "cnt": [0] * n, "chain_sum": 0.0, "chain_n": 0})
        good = []
        for i, lg in enumerate(outs):
            valid = ti + i < Td
            d = used[lg.argmax(-1)]                                  # target id of the draft argmax at step i
            ok = valid & (d == targ[(ti + i).clamp(max=Td - 1)])     # vs the target's argmax at t+1+i
            good.append(ok)
            r["hit"][i] += int(ok.sum())
            r["cnt"][i] += int(valid.sum())
        # chain acceptance at index t: 1 + the leading run of correct steps (stops where the text ends)
        run = torch.ones(len(ti), dtype=torch.bool)
        acc = torch.zeros(len(ti))
        for ok in good:
            run = run & ok
            acc += run.float()
        r["chain_sum"] += float((1 + acc).sum())
        r["chain_n"] += len(ti)
    model.train()
    out = {}
    for src, r in res.items():
        out[src] = {"acc": [round(h / max(c, 1), 4) for h, c in zip(r["hit"], r["cnt"])],
                    "chain_tokens_per_pos": round(r["chain_sum"] / max(r["chain_n"], 1), 3),
                    "positions": r["chain_n"]}
    return out


# ---------------------------------------------------------------- state / export


def save_state(path, model, opt, step, tokens, train_seconds, a, vocab, target_sha):
    save_state_atomic(path, {"target_sha": target_sha, "model": model.state_dict(), "opt": opt.state_dict(),
                             "step": step, "tokens": tokens, "train_seconds": train_seconds, "args": jsonable(a),
                             "vocab": vocab, "torch_rng": torch.get_rng_state()})


def param_counts(model):
    total = sum(p.numel() for p in model.parameters())
    by = {n: p.numel() for n, p in model.named_parameters()}
    return {"total": total, "lm_head": by["lm_head.weight"], "fc": by["fc.weight"],
            "midlayer": sum(v for n, v in by.items() if n.startswith("midlayer.")), "norm": by["norm.weight"]}


@torch.no_grad()
def check_against_reference(model, cfg, w, target, taps, ids, n=4, every=3):
    """Compare the training unroll with inference as written in tools/fixtures/make_eagle3_fixture.py's
    functional Eagle3Drafter (the reference the engine's tests use): for every `every`-th index t, the prefix
    0..t through fc with a KV cache, then n-1 recurrent steps (own hidden output, no fc, token ids[t+1+i] at
    position t+i, KV cache of the prefix plus the ancestors). Logits must match the unroll's at (t, step i)."""
    sys.path.insert(0, str(REPO / "tools" / "fixtures"))
    from make_eagle3_fixture import Eagle3Drafter  # noqa: E402
    was = model.training
    model.eval()
    ref = Eagle3Drafter(cfg, w, model.embed)
    x = torch.tensor([ids])
    feats, _ = target_features(target, x, taps)
    T = len(ids) - 1
    tok = torch.cat((x[:, 1:], torch.zeros(1, n, dtype=torch.long)), dim=1)
    sel = torch.arange(0, T - n + 1, every)
    outs, _, ti = model.unroll(feats[:, :T], tok, n, [sel])
    assert torch.equal(ti, sel)
    full = ref.forward(feats[0, :T], x[0, 1:T + 1], torch.arange(T))
    worst, scale = 0.0, full["logits"].abs().max().item()
    for k, t in enumerate(sel.tolist()):
        pre = ref.forward(feats[0, :t + 1], x[0, 1:t + 2], torch.arange(t + 1))
        worst = max(worst, (pre["logits"][t] - full["logits"][t]).abs().max().item())
        worst = max(worst, (outs[0][k] - pre["logits"][t]).abs().max().item())
        hid, kv = pre["hidden_out"][t:t + 1], pre["kv"]
        for i in range(1, n):
            st = ref.forward(hid, x[0, t + 1 + i:t + 2 + i], torch.tensor([t + i]), kv=kv)
            worst = max(worst, (outs[i][k] - st["logits"][0]).abs().max().item())
            hid, kv = st["hidden_out"], st["kv"]
    model.train(was)
    return {"max_abs_diff": worst, "logit_scale": round(scale, 3), "indices": len(sel), "steps": n,
            "ok": worst <= 1e-4 * max(scale, 1.0)}


@torch.no_grad()
def export(model, cfg, vocab, target, taps, a, extra, check_ids):
    """Write config.json + model.safetensors and check them against the fixture's functional reference."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    d = fresh_dir(a.export_dir)
    dt = torch.bfloat16 if a.export_dtype == "bf16" else torch.float32
    tensors = {k: v.detach().to(dt).contiguous() for k, v in model.state_dict().items()}
    tensors["d2t"] = vocab["d2t"].to(torch.int64).contiguous()
    tensors["t2d"] = vocab["t2d"].to(torch.bool).contiguous()
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    from safetensors import safe_open
    with safe_open(d / "model.safetensors", "pt") as f:
        w = {k: f.get_tensor(k) for k in f.keys()}
    same = set(w) == set(tensors) and all(torch.equal(w[k], tensors[k]) for k in w)
    wf = {k: (v.float() if v.is_floating_point() else v) for k, v in w.items()}
    m = copy.deepcopy(model).float()
    m.load_state_dict({k: wf[k] for k in m.state_dict()})
    diff = check_against_reference(m, json.loads((d / "config.json").read_text()), wf, target, taps, check_ids)
    ok = same and diff["ok"]
    sizes = {p.name: p.stat().st_size for p in sorted(d.iterdir())}
    rec = {"type": "export", "dir": str(d), "bytes": sizes, "total_bytes": sum(sizes.values()), "dtype": a.export_dtype,
           "reload_identical": same, "vs_fixture_reference": diff,
           "check_ok": ok, **extra}
    log(a, rec)
    if not ok:
        sys.exit("export check failed")
    return rec


# ---------------------------------------------------------------- main


def main():
    a = parse_args()
    set_threads_and_seed(a)
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

    t0 = time.time()
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32, attn_implementation="sdpa").eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = target.config
    N = tcfg.num_hidden_layers
    taps = [2, N // 2, N - 3]
    assert len(set(taps)) == 3, taps
    V = tcfg.vocab_size
    assert 0 < a.draft_vocab <= V
    tok = Tokenizer.from_file(str(a.target / "tokenizer.json"))
    target_sha = hashlib.sha256((a.target / "model.safetensors").read_bytes()).hexdigest()

    cfg = drafter_config(a, tcfg)
    embed = target.model.embed_tokens.weight.detach().float().clone()
    model = Eagle3Head(cfg, embed)

    state_path = a.ckpt_dir / "state.pt"
    state = load_state(state_path, a.bench)
    if state is not None:
        if state.get("target_sha") != target_sha:
            sys.exit(f"{state_path} was trained on another target (model.safetensors sha256 differs); "
                     "use a fresh --ckpt-dir")
        model.load_state_dict(state["model"])

    train_docs = read_jsonl(a.corpus / "train.jsonl")
    enc = encode_docs(tok, train_docs)
    if state is not None:
        vocab = state["vocab"]
    else:
        used, d2t, t2d, cov, n_resp = draft_vocabulary(enc, a.draft_vocab, V)
        vocab = {"used": used, "d2t": d2t, "t2d": t2d, "coverage": cov, "response_tokens": n_resp}
    used, t2d = vocab["used"], vocab["t2d"]

    check_ids = enc[0][0][:48]  # the first training document's first tokens
    if a.export_only:
        if state is None:
            sys.exit(f"--export-only: no checkpoint at {state_path}")
        export(model, cfg, vocab, target, taps, a, {"step": state["step"], "tokens": state["tokens"],
                                                     "complete": state["step"] >= a.steps}, check_ids)
        return

    if state is None and a.lm_head_init == "target":
        with torch.no_grad():
            model.lm_head.weight.copy_(target.lm_head.weight[used].float())
            model.norm.weight.copy_(target.model.norm.weight.float())

    # The unroll must compute what inference computes (checked on the starting weights, a few seconds).
    selftest = check_against_reference(model, cfg, {k: v.detach() for k, v in model.state_dict().items()},
                                       target, taps, check_ids)
    if not selftest["ok"]:
        sys.exit(f"self-test against the fixture reference failed: {selftest}")

    stream, roles = build_stream(enc, a.seed)
    starts, n_all = chunk_starts(roles, a.seq_len, a.min_assistant if a.prompt_weight == 0 else 0)
    n_chunks = len(starts)
    tokens_per_step = a.batch * a.seq_len
    counts = param_counts(model)

    opt = adamw(model, a)
    step, tokens, train_seconds = resume(opt, state)

    items = []
    if not a.bench:
        a.ckpt_dir.mkdir(parents=True, exist_ok=True)
        a.log.parent.mkdir(parents=True, exist_ok=True)
        ev_path = a.ckpt_dir / "eval_set.pt"
        ev = torch.load(ev_path, weights_only=False) if ev_path.exists() else None
        if ev is not None and ev.get("target_sha") == target_sha:
            items = ev["items"]
        else:
            te = time.time()
            items = make_eval_set(target, tok, a)
            torch.save({"target_sha": target_sha, "items": items}, ev_path)
            log(a, {"type": "eval_set", "items": len(items), "tokens": sum(len(i["ids"]) for i in items),
                    "generated": sum(len(i["ids"]) - i["prompt_len"] for i in items), "s": round(time.time() - te, 1)})

    log(a, {"type": "resume" if state else ("bench" if a.bench else "start"), "step": step, "steps": a.steps,
            "config": cfg, "params": counts, "taps": taps, "draft_vocab": a.draft_vocab,
            "draft_vocab_response_coverage": round(vocab["coverage"], 4), "train_docs": len(train_docs),
            "train_tokens": len(stream), "assistant_tokens": int(roles.sum()), "chunks": n_chunks,
            "chunks_dropped": n_all - n_chunks, "seq_len": a.seq_len, "tokens_per_step": tokens_per_step,
            "epochs_planned": round(a.steps * a.batch / n_chunks, 3), "target": str(a.target),
            "target_sha256": target_sha, "selftest": selftest, "setup_s": round(time.time() - t0, 1),
            **process_info()})

    stop = stop_flag()

    end = a.bench if a.bench else a.steps
    model.train()
    last_ckpt = time.time()
    win = {"t": time.time(), "tok": 0, "loss": 0.0, "n": 0, "steps": [0.0] * a.ttt, "hit": [0.0] * a.ttt,
           "cnt": [0.0] * a.ttt, "target_s": 0.0, "drafter_s": 0.0}
    bench_times = []
    last_eval = None
    while step < end and not stop["flag"]:
        ts = time.time()
        x, r = batch_at(stream, roles, starts, step, a.batch, a.seq_len, a.seed)
        w = torch.where(r > 0, torch.tensor(1.0), torch.tensor(a.prompt_weight))
        feats, logits_t = target_features(target, x[:, :-1], taps)
        tt = time.time()
        loss, losses, accs = ttt_loss(model, feats, logits_t, x, w, used, t2d, a.ttt, a.decay)
        gnorm = optimizer_step(model, opt, loss, lr_at(step, a), a.clip)
        step += 1
        tokens += tokens_per_step
        dt = time.time() - ts
        train_seconds += dt
        bench_times.append((dt, tt - ts))
        win["tok"] += tokens_per_step
        win["loss"] += loss.item()
        win["n"] += 1
        win["target_s"] += tt - ts
        win["drafter_s"] += time.time() - tt
        for i in range(a.ttt):
            win["steps"][i] += losses[i].item()
            win["hit"][i] += accs[i][0]
            win["cnt"][i] += accs[i][1]
        if step % a.log_every == 0 or step == end or a.bench:
            now = time.time()
            log(a, {"type": "train", "step": step, "loss": round(win["loss"] / win["n"], 4),
                    "step_loss": [round(v / win["n"], 4) for v in win["steps"]],
                    "acc": [round(h / max(c, 1e-9), 4) for h, c in zip(win["hit"], win["cnt"])],
                    "lr": round(lr_at(step - 1, a), 6), "grad_norm": round(gnorm, 3), "tokens": tokens,
                    "tok_per_s": round(win["tok"] / (now - win["t"]), 1),
                    "target_frac": round(win["target_s"] / max(win["target_s"] + win["drafter_s"], 1e-9), 3),
                    "train_s": round(train_seconds, 1)})
            win = {"t": now, "tok": 0, "loss": 0.0, "n": 0, "steps": [0.0] * a.ttt, "hit": [0.0] * a.ttt,
                   "cnt": [0.0] * a.ttt, "target_s": 0.0, "drafter_s": 0.0}
        if not a.bench and (step % a.eval_every == 0 or step == end):
            te = time.time()
            ev = evaluate(model, target, items, taps, used, t2d, a.ttt)
            last_eval = {"step": step, **ev}
            log(a, {"type": "valid", "step": step, **ev, "eval_s": round(time.time() - te, 1)})
        if not a.bench and (time.time() - last_ckpt > 60 * a.ckpt_minutes or step == end):
            save_state(state_path, model, opt, step, tokens, train_seconds, a, vocab, target_sha)
            last_ckpt = time.time()
            log(a, {"type": "ckpt", "step": step, "path": str(state_path)})

    if a.bench:
        steady = bench_times[1:] or bench_times
        s = sum(b[0] for b in steady) / len(steady)
        print(json.dumps({"bench_steps": len(bench_times), "s_per_step": round(s, 2),
                          "target_s_per_step": round(sum(b[1] for b in steady) / len(steady), 2),
                          "tok_per_s": round(tokens_per_step / s, 1),
                          "minutes_for_default_budget": round(DEFAULT_STEPS * s / 60, 1)}))
        return
    if stop["flag"] and step < end:
        save_state(state_path, model, opt, step, tokens, train_seconds, a, vocab, target_sha)
        log(a, {"type": "ckpt", "step": step, "path": str(state_path), "reason": "signal"})
        return
    rec = export(model, cfg, vocab, target, taps, a, {"step": step, "tokens": tokens, "complete": True,
                                                       "train_s": round(train_seconds, 1),
                                                       "mean_tok_per_s": round(tokens / max(train_seconds, 1e-9), 1)},
                 check_ids)
    info = {"config": cfg, "params": counts, "taps": taps, "draft_vocab_response_coverage": vocab["coverage"],
            "target": str(a.target), "target_sha256": target_sha, "args": jsonable(a), "last_eval": last_eval,
            "export": rec}
    a.info.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
