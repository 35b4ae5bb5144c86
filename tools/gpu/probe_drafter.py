"""Measures what EAGLE-3 drafting costs on a GPU for a Qwen3-30B-A3B target, as `specfit calibrate
--probes ROWS --drafting drafting.json` stores it (the calibration's `drafting`, which trace replay
charges to every speculative cycle).

This script owns only that measurement: a random-weight bf16 EAGLE-3 drafter of the published
Qwen3-30B-A3B shape (SpecForge `configs/qwen3-30B-A3B-eagle3.json`: one Llama layer, hidden 2048,
32 heads / 4 kv of 128, intermediate 12288, draft vocabulary 32000, fc 3·2048 -> 2048), timed for
  - one drafted level: T tree nodes (default 4, the width of a top-2 expansion level of the
    18-node pool) through the layer against the drafter's KV cache, then lm_head and the top-2 of
    every node, copied to the host (the tree is built there);
  - feeding m committed tokens (1..8): fc over their three target taps, the layer, lm_head of the
    last one;
each at two context lengths, so the per-cached-token terms come out too. Writes `drafting.json`
({"ms_per_level", "feed_ms", "feed_ms_per_token", "level_context_ms", "feed_context_ms"}) and
`drafting-summary.json` (every timing) into --out, atomically. Weights are random: only timings
matter. `--device cpu --tiny` runs the same code as a smoke test.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from probe_gpu import T0, device_info, log, measure, median, rope_tables, rotate, write_atomic


class Shape:
    def __init__(self, hidden, heads, kv_heads, head_dim, inter, vocab, target_hidden):
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.inter, self.vocab, self.target_hidden = inter, vocab, target_hidden
        self.eps, self.rope_theta = 1e-6, 1e6


QWEN3_30B_A3B_EAGLE3 = Shape(2048, 32, 4, 128, 12288, 32000, 2048)
TINY = Shape(256, 8, 2, 32, 512, 2048, 256)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--level-nodes", type=int, default=4, help="tree nodes per drafted level")
    p.add_argument("--contexts", default="512,1536", help="two context lengths (tokens)")
    p.add_argument("--reps", type=int, default=50, help="timed repetitions per point")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Drafter:
    """Random bf16 weights of one EAGLE-3 layer plus its fc, norms and lm_head."""

    def __init__(self, s, max_ctx, dev, dtype, gen):
        def w(rows, cols):
            return (torch.randn(rows, cols, generator=gen) / cols ** 0.5).to(dev, dtype)

        h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.fc = w(h, 3 * s.target_hidden)
        self.wq, self.wk, self.wv = w(q, 2 * h), w(kv, 2 * h), w(kv, 2 * h)
        self.wo = w(h, q)
        self.gate, self.up, self.down = w(s.inter, h), w(s.inter, h), w(h, s.inter)
        self.lm_head = w(s.vocab, h)
        ones = torch.ones(h, device=dev, dtype=dtype)
        self.in_norm, self.hidden_norm, self.post_norm, self.norm = ones, ones, ones, ones
        shape = (1, s.kv_heads, max_ctx, s.head_dim)
        self.k_cache = torch.randn(shape, generator=gen).to(dev, dtype)
        self.v_cache = torch.randn(shape, generator=gen).to(dev, dtype)


def layer(s, d, emb, hid, ctx, cos, sin, mask):
    """The drafter layer on T tokens: [norm(embedding) | norm(hidden)] -> attention over the
    context and these tokens -> MLP. Returns the new hidden states."""
    t = emb.shape[0]
    x = torch.cat([F.rms_norm(emb, (s.hidden,), d.in_norm, s.eps),
                   F.rms_norm(hid, (s.hidden,), d.hidden_norm, s.eps)], dim=-1)
    q = rotate((x @ d.wq.t()).view(t, s.heads, s.head_dim), cos, sin)
    k = rotate((x @ d.wk.t()).view(t, s.kv_heads, s.head_dim), cos, sin)
    v = (x @ d.wv.t()).view(t, s.kv_heads, s.head_dim)
    d.k_cache[0, :, ctx:ctx + t].copy_(k.transpose(0, 1))
    d.v_cache[0, :, ctx:ctx + t].copy_(v.transpose(0, 1))
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), d.k_cache[:, :, :ctx + t], d.v_cache[:, :, :ctx + t],
        attn_mask=mask, enable_gqa=True)
    h = hid + o[0].transpose(0, 1).reshape(t, -1) @ d.wo.t()
    y = F.rms_norm(h, (s.hidden,), d.post_norm, s.eps)
    return h + (F.silu(y @ d.gate.t()) * (y @ d.up.t())) @ d.down.t()


def inputs(s, t, ctx, dev, dtype, gen):
    """Embeddings, hidden states, RoPE tables and a causal mask for t tokens after ctx."""
    emb = torch.randn(t, s.hidden, generator=gen).to(dev, dtype)
    hid = torch.randn(t, s.hidden, generator=gen).to(dev, dtype)
    cos, sin = rope_tables(s, range(ctx, ctx + t), dev, dtype)
    mask = torch.ones(t, ctx + t, dtype=torch.bool)
    mask[:, ctx:] = torch.tril(torch.ones(t, t, dtype=torch.bool))
    return emb, hid, cos, sin, mask.to(dev)


def time_level(s, d, t, ctx, reps, dev, dtype, gen):
    emb, hid, cos, sin, mask = inputs(s, t, ctx, dev, dtype, gen)

    def level():
        h = layer(s, d, emb, hid, ctx, cos, sin, mask)
        logits = F.rms_norm(h, (s.hidden,), d.norm, s.eps) @ d.lm_head.t()
        torch.topk(logits, 2, dim=-1).indices.cpu()

    level()
    return median(measure(level, reps, dev))


def time_feed(s, d, m, ctx, reps, dev, dtype, gen):
    emb, _, cos, sin, mask = inputs(s, m, ctx, dev, dtype, gen)
    taps = torch.randn(m, 3 * s.target_hidden, generator=gen).to(dev, dtype)

    def feed():
        h = layer(s, d, emb, taps @ d.fc.t(), ctx, cos, sin, mask)
        logits = F.rms_norm(h[-1:], (s.hidden,), d.norm, s.eps) @ d.lm_head.t()
        torch.topk(logits, 2, dim=-1).indices.cpu()

    feed()
    return median(measure(feed, reps, dev))


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    s = TINY if args.tiny else QWEN3_30B_A3B_EAGLE3
    contexts = [int(c) for c in args.contexts.split(",")]
    assert len(contexts) == 2 and contexts[0] < contexts[1], "--contexts takes two lengths"
    gen = torch.Generator().manual_seed(args.seed)
    summary = {"device": device_info(dev), "args": vars(args), "shape": vars(s),
               "level_ms": {}, "feed_ms": {}}
    with torch.inference_mode():
        d = Drafter(s, contexts[1] + 16, dev, dtype, gen)
        for ctx in contexts:
            for t in (2, args.level_nodes, 8):
                summary["level_ms"][f"{ctx}/{t}"] = time_level(s, d, t, ctx, args.reps, dev,
                                                               dtype, gen)
            for m in range(1, 9):
                summary["feed_ms"][f"{ctx}/{m}"] = time_feed(s, d, m, ctx, args.reps, dev,
                                                             dtype, gen)
            log(f"context {ctx}: level of {args.level_nodes} nodes "
                f"{summary['level_ms'][f'{ctx}/{args.level_nodes}']:.3f} ms, feed 1 / 8 tokens "
                f"{summary['feed_ms'][f'{ctx}/1']:.3f} / {summary['feed_ms'][f'{ctx}/8']:.3f} ms")

    def feed_line(ctx):
        m = np.arange(1, 9, dtype=np.float64)
        y = np.array([summary["feed_ms"][f"{ctx}/{k}"] for k in range(1, 9)])
        slope, intercept = np.polyfit(m, y, 1)
        return max(intercept, 0.0), max(slope, 0.0)

    (c0, c1), n = contexts, args.level_nodes
    lv0, lv1 = summary["level_ms"][f"{c0}/{n}"], summary["level_ms"][f"{c1}/{n}"]
    (f0, s0), (f1, _) = feed_line(c0), feed_line(c1)
    # Costs at context 0, plus a per-cached-token slope between the two contexts.
    level_ctx = max((lv1 - lv0) / (c1 - c0), 0.0)
    feed_ctx = max((f1 - f0) / (c1 - c0), 0.0)
    drafting = {
        "ms_per_level": max(lv0 - level_ctx * c0, 0.0),
        "feed_ms": max(f0 - feed_ctx * c0, 0.0),
        "feed_ms_per_token": s0,
        "level_context_ms": level_ctx,
        "feed_context_ms": feed_ctx,
    }
    summary["drafting"] = drafting
    summary["total_s"] = time.perf_counter() - T0
    write_atomic(os.path.join(args.out, "drafting.json"), json.dumps(drafting, indent=1) + "\n")
    write_atomic(os.path.join(args.out, "drafting-summary.json"),
                 json.dumps(summary, indent=1) + "\n")
    log("drafting: " + ", ".join(f"{k}={v:.4g}" for k, v in drafting.items()))


if __name__ == "__main__":
    main()
