"""Measures verify forwards of a Qwen3-30B-A3B-shaped MoE on a GPU whose routed experts live in
pinned host RAM and are copied over PCIe into a per-layer LRU cache of expert slots on the GPU.

This script owns the whole measurement: the random-weight model, the host expert pool, the
per-layer slot LRU, the probe plan (node counts, tree masks, routes with locality, cache states),
the timing of each forward, a few microbenchmarks and a quick least-squares check of the fit.
It writes `probes.jsonl` (exactly the five keys `specfit calibrate --probes` reads: nodes,
demand, hits, misses, ms) and `summary.json` (everything else) into --out, both atomically.
Weights are random: outputs are meaningless, only the timings matter. Routes come from the probe
plan, not from the router (whose cost is still paid). Final norm and lm_head are skipped.
On --device cpu (with --tiny) the same code path runs with plain tensors, as a smoke test.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

STATES = ("lru", "cleared", "resident")
STATE_P = (0.6, 0.2, 0.2)
MAX_NODES = 7
T0 = time.perf_counter()


def log(msg):
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


@dataclass
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    experts: int
    top_k: int
    eps: float = 1e-6
    rope_theta: float = 1e6

    def block_numel(self):
        """Elements of one expert block: gate [I,H] | up [I,H] | down [H,I]."""
        return 3 * self.inter * self.hidden


QWEN3_30B_A3B = Shape(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, inter=768,
                      experts=128, top_k=8)
TINY = Shape(hidden=256, layers=4, heads=8, kv_heads=2, head_dim=32, inter=128, experts=32,
             top_k=4)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (probes.jsonl, summary.json)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: smoke test)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny shapes (hidden 256, 4 layers, 32 experts top-4) for a smoke test")
    p.add_argument("--slots", type=int, default=None,
                   help="expert slots per layer on the device (default 48; 8 with --tiny)")
    p.add_argument("--host-experts", type=int, default=512,
                   help="distinct expert blocks in the host pool; (layer, expert) maps to block "
                        "(layer*experts + expert) %% N")
    p.add_argument("--context", type=int, default=512,
                   help="tokens already in the (fixed, random) KV cache of every layer")
    p.add_argument("--probes", type=int, default=400,
                   help="timed probes (capped to fit --budget-s)")
    p.add_argument("--warmup", type=int, default=10, help="untimed probes before timing")
    p.add_argument("--estimate", type=int, default=20,
                   help="probes timed before capping the count to the budget")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget of the timed probe loop in seconds (default 150; 30 "
                        "with --tiny)")
    p.add_argument("--locality", type=float, default=0.5,
                   help="probability that the root keeps each expert of the previous root")
    p.add_argument("--share-min", type=float, default=0.2,
                   help="lower end of the per-probe probability that a draft token keeps each "
                        "expert of its parent")
    p.add_argument("--share-max", type=float, default=0.95, help="upper end of that probability")
    p.add_argument("--no-route-sync", action="store_true",
                   help="skip the per-layer device-to-host copy of the router's top-k ids (a "
                        "real offloading engine needs them on the host to decide its copies)")
    for flag, gib, refused in (
            ("--max-pinned-gib", 8.0, "host pools larger than this (GiB, after allocator rounding)"),
            ("--max-gpu-gib", 40.0, "slot caches plus dense weights larger than this (GiB)")):
        p.add_argument(flag, type=float, default=gib, help="refuse " + refused)
    p.add_argument("--seed", type=int, default=0, help="seed of weights and probe plan")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Device helpers


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(fn, reps, dev):
    """Milliseconds of `fn()` per call, one sample per call (CUDA events on a GPU)."""
    out = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def next_pow2(n):
    return 1 << (max(n, 1) - 1).bit_length()


def gib(n):
    return n / 2**30


# ---------------------------------------------------------------------------------------------
# Model


@dataclass
class Layer:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    router: torch.Tensor
    k_cache: torch.Tensor  # [1, kv_heads, context + 8, head_dim]; first `context` rows fixed
    v_cache: torch.Tensor


def dense_bytes(shape, context, elem):
    s = shape
    per = (s.heads * s.head_dim * s.hidden * 2 + s.kv_heads * s.head_dim * s.hidden * 2
           + s.experts * s.hidden + 2 * s.hidden + 2 * s.head_dim
           + 2 * s.kv_heads * (context + MAX_NODES + 1) * s.head_dim)
    return per * s.layers * elem


def build_layers(shape, context, dev, dtype):
    """Random dense weights and a fixed random KV context for every layer."""
    s = shape

    def w(rows, cols):
        return torch.empty(rows, cols, device=dev, dtype=dtype).normal_(0.0, 0.02)

    layers = []
    for _ in range(s.layers):
        kc = torch.empty(1, s.kv_heads, context + MAX_NODES + 1, s.head_dim, device=dev,
                         dtype=dtype).normal_()
        layers.append(Layer(
            in_norm=torch.ones(s.hidden, device=dev, dtype=dtype),
            post_norm=torch.ones(s.hidden, device=dev, dtype=dtype),
            wq=w(s.heads * s.head_dim, s.hidden), wk=w(s.kv_heads * s.head_dim, s.hidden),
            wv=w(s.kv_heads * s.head_dim, s.hidden), wo=w(s.hidden, s.heads * s.head_dim),
            q_norm=torch.ones(s.head_dim, device=dev, dtype=dtype),
            k_norm=torch.ones(s.head_dim, device=dev, dtype=dtype),
            router=w(s.experts, s.hidden), k_cache=kc, v_cache=torch.randn_like(kc)))
    return layers


def pinned_chunks(shape, host_experts, dtype):
    """The host expert pool: chunk tensors of whole blocks (pinned on a GPU).

    PyTorch's pinned allocator rounds each allocation up to a power of two, and one bf16 expert
    is exactly 9 MiB, so the pool is allocated in chunks of about 512 MiB of whole blocks."""
    numel = shape.block_numel()
    elem = torch.empty(0, dtype=dtype).element_size()
    per_chunk = max(1, min(host_experts, (512 * 2**20) // (numel * elem)))
    sizes = [per_chunk] * (host_experts // per_chunk)
    if host_experts % per_chunk:
        sizes.append(host_experts % per_chunk)
    return sizes, sum(next_pow2(n * numel * elem) for n in sizes)


def build_host_pool(shape, sizes, dev, dtype):
    """Allocates the pool and fills it by repeating one random chunk (contents do not matter)."""
    numel = shape.block_numel()
    pin = dev.type == "cuda"
    src = torch.empty(sizes[0], numel, device=dev, dtype=dtype).normal_(0.0, 0.02)
    blocks = []
    for n in sizes:
        chunk = torch.empty(n, numel, dtype=dtype, pin_memory=pin)
        chunk.copy_(src[:n])
        blocks.extend(chunk[i] for i in range(n))
    del src
    if pin:
        torch.cuda.empty_cache()
    return blocks


class LayerLru:
    """One layer's slots: expert -> slot in LRU order (oldest first) and the empty slots."""

    def __init__(self, slots):
        self.slots = slots
        self.clear()

    def clear(self):
        self.where = OrderedDict()
        self.free = list(range(self.slots - 1, -1, -1))

    def schedule(self, experts):
        """Hits (touched, most recent last) then misses, each as (index in experts, slot).

        Misses take an empty slot, else the least recently used one; the hits were touched
        first, so a miss evicts a hit of this call only when the call needs more experts than
        there are slots (the hit has been computed by then: the stream orders copy after use)."""
        where, hits, missing = self.where, [], []
        for j, e in enumerate(experts):
            s = where.get(e)
            if s is None:
                missing.append(j)
            else:
                where.move_to_end(e)
                hits.append((j, s))
        misses = []
        for j in missing:
            s = self.free.pop() if self.free else where.popitem(last=False)[1]
            where[experts[j]] = s
            misses.append((j, s))
        return hits, misses


class SlotCache:
    """The device-side slots of every layer, their LRU state and the host pool they copy from."""

    def __init__(self, shape, slots, host_blocks, dev, dtype):
        s = shape
        self.shape, self.host = shape, host_blocks
        self.flat, self.gate_up, self.down = [], [], []
        ih = s.inter * s.hidden
        for _ in range(s.layers):
            t = torch.empty(slots, s.block_numel(), device=dev, dtype=dtype)
            self.flat.append([t[i] for i in range(slots)])
            self.gate_up.append([t[i, :2 * ih].view(2 * s.inter, s.hidden) for i in range(slots)])
            self.down.append([t[i, 2 * ih:].view(s.hidden, s.inter) for i in range(slots)])
        self.lru = [LayerLru(slots) for _ in range(s.layers)]

    def host_block(self, layer, expert):
        return self.host[(layer * self.shape.experts + expert) % len(self.host)]

    def clear(self):
        for lru in self.lru:
            lru.clear()

    def copy_in(self, layer, expert, slot):
        """H2D copy of one expert block, ordered on the current stream before its use."""
        self.flat[layer][slot].copy_(self.host_block(layer, expert), non_blocking=True)

    def prefetch(self, layer, experts):
        """Makes `experts` (at most the slot count) resident without computing them."""
        experts = experts[:self.lru[layer].slots]
        _, misses = self.lru[layer].schedule(experts)
        for j, slot in misses:
            self.copy_in(layer, experts[j], slot)


def rope_tables(shape, positions, dev, dtype):
    d = shape.head_dim
    inv = 1.0 / (shape.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = np.asarray(positions, dtype=np.float64)[:, None] * inv[None]
    emb = np.concatenate([freqs, freqs], axis=1)
    cos = torch.tensor(np.cos(emb), device=dev, dtype=dtype).unsqueeze(1)
    sin = torch.tensor(np.sin(emb), device=dev, dtype=dtype).unsqueeze(1)
    return cos, sin


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def attention(shape, layer, h, inp):
    """RMSNorm, q/k/v, per-head q/k RMSNorm, RoPE, tree-masked attention over the context plus
    the new tokens, o_proj and residual."""
    s, t, c = shape, h.shape[0], inp.context
    x = F.rms_norm(h, (s.hidden,), layer.in_norm, s.eps)
    q = (x @ layer.wq.t()).view(t, s.heads, s.head_dim)
    k = (x @ layer.wk.t()).view(t, s.kv_heads, s.head_dim)
    v = (x @ layer.wv.t()).view(t, s.kv_heads, s.head_dim)
    q = rotate(F.rms_norm(q, (s.head_dim,), layer.q_norm, s.eps), inp.cos, inp.sin)
    k = rotate(F.rms_norm(k, (s.head_dim,), layer.k_norm, s.eps), inp.cos, inp.sin)
    layer.k_cache[0, :, c:c + t].copy_(k.transpose(0, 1))
    layer.v_cache[0, :, c:c + t].copy_(v.transpose(0, 1))
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), layer.k_cache[:, :, :c + t], layer.v_cache[:, :, :c + t],
        attn_mask=inp.mask, enable_gqa=True)
    return h + o[0].transpose(0, 1).reshape(t, s.heads * s.head_dim) @ layer.wo.t()


def swiglu(x, gate_up, down, inter):
    gu = x @ gate_up.t()
    return (F.silu(gu[:, :inter]) * gu[:, inter:]) @ down.t()


def moe(shape, cache, l, layer, h, inp, route_sync):
    """Router (cost only), planned routes, LRU copies of the missing experts, per-expert SwiGLU
    weighted by the router's normalized probabilities at the planned ids, residual.
    Returns the new hidden state, hits and misses."""
    s = shape
    x = F.rms_norm(h, (s.hidden,), layer.post_norm, s.eps)
    probs = torch.softmax((x @ layer.router.t()).float(), dim=-1)
    top = torch.topk(probs, s.top_k, dim=-1).indices
    if route_sync:
        top.cpu()
    ids = inp.ids[l]
    w = probs.gather(1, ids)
    w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype).reshape(-1)
    order = torch.argsort(ids.reshape(-1), stable=True)
    tok = order // s.top_k
    xs, ws = x[tok], w[order]
    experts, counts = np.unique(inp.routes[l], return_counts=True)
    starts = np.concatenate(([0], np.cumsum(counts))).tolist()
    experts = experts.tolist()
    hits, misses = cache.lru[l].schedule(experts)
    ys = [None] * len(experts)
    gate_up, down = cache.gate_up[l], cache.down[l]
    for j, slot in hits:
        ys[j] = swiglu(xs[starts[j]:starts[j + 1]], gate_up[slot], down[slot], s.inter)
    for j, slot in misses:
        cache.copy_in(l, experts[j], slot)
        ys[j] = swiglu(xs[starts[j]:starts[j + 1]], gate_up[slot], down[slot], s.inter)
    y = torch.cat(ys) * ws[:, None]
    return h + torch.zeros_like(x).index_add_(0, tok, y), len(hits), len(misses)


def forward(shape, layers, cache, inp, route_sync):
    """One verify forward over all layers (no final norm / lm_head). Returns (hits, misses)."""
    h, hits, misses = inp.x, 0, 0
    for l, layer in enumerate(layers):
        h = attention(shape, layer, h, inp)
        h, hh, mm = moe(shape, cache, l, layer, h, inp, route_sync)
        hits += hh
        misses += mm
    return hits, misses


# ---------------------------------------------------------------------------------------------
# Probe plan


@dataclass
class Plan:
    nodes: int
    state: str
    share: float
    parents: list
    routes: np.ndarray  # [layers, tokens, top_k] expert ids


class Planner:
    """Draws probes: node counts in shuffled blocks of 0..=7, random trees, routes with locality
    (root vs the previous root, draft tokens vs their parents) and cache states."""

    def __init__(self, shape, args, rng):
        self.shape, self.args, self.rng = shape, args, rng
        self.prev_root = self.draw_routes(np.zeros((shape.layers, shape.top_k), np.int64), 0.0)
        self.nodes_queue = []

    def draw_routes(self, parent, keep_p):
        """Per layer: each parent expert kept with prob keep_p, the rest fresh and distinct."""
        s, rng = self.shape, self.rng
        score = rng.random((s.layers, s.experts))
        keep = rng.random((s.layers, s.top_k)) < keep_p
        rows = np.broadcast_to(np.arange(s.layers)[:, None], keep.shape)
        score[rows[keep], parent[keep]] = -1.0
        return np.argsort(score, axis=1)[:, :s.top_k]

    def next(self):
        rng, a = self.rng, self.args
        if not self.nodes_queue:
            self.nodes_queue = rng.permutation(MAX_NODES + 1).tolist()
        n = self.nodes_queue.pop()
        state = STATES[rng.choice(len(STATES), p=STATE_P)]
        share = float(rng.uniform(a.share_min, a.share_max))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n + 1)]
        root = self.draw_routes(self.prev_root, a.locality)
        self.prev_root = root
        toks = [root]
        for i in range(1, n + 1):
            toks.append(self.draw_routes(toks[parents[i]], share))
        return Plan(n, state, share, parents, np.stack(toks, axis=1))


@dataclass
class Inputs:
    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    ids: torch.Tensor
    routes: np.ndarray
    context: int


def tree_mask(parents, context, dev, dtype):
    """Additive mask [T, context+T]: each token sees the context, itself and its ancestors.
    Its storage is padded to a multiple of 16 columns (aligned for fused attention kernels)."""
    t = len(parents)
    width = context + t
    m = torch.full((t, (width + 15) // 16 * 16), float("-inf"), dtype=dtype)
    m[:, :context] = 0.0
    for i in range(t):
        j = i
        while j >= 0:
            m[i, context + j] = 0.0
            j = parents[j]
    return m.to(dev)[:, :width]


def depths(parents):
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def make_inputs(shape, plan, context, dev, dtype, gen):
    """Everything a forward takes, prepared before the timer starts."""
    t = plan.nodes + 1
    cos, sin = rope_tables(shape, [context + d for d in depths(plan.parents)], dev, dtype)
    x = torch.randn(t, shape.hidden, generator=gen).to(dev, dtype)
    ids = torch.from_numpy(np.ascontiguousarray(plan.routes)).to(dev)
    return Inputs(x, cos, sin, tree_mask(plan.parents, context, dev, dtype), ids, plan.routes,
                  context)


def apply_state(shape, cache, plan, dev):
    """Untimed: clear the slots, or make the probe's union resident (as far as slots allow)."""
    if plan.state == "cleared":
        cache.clear()
    elif plan.state == "resident":
        for l in range(shape.layers):
            cache.prefetch(l, np.unique(plan.routes[l]).tolist())
    sync(dev)


def run_probe(shape, layers, cache, plan, ctx, dev, dtype, gen, route_sync):
    inp = make_inputs(shape, plan, ctx, dev, dtype, gen)
    apply_state(shape, cache, plan, dev)
    sync(dev)
    t = time.perf_counter()
    hits, misses = forward(shape, layers, cache, inp, route_sync)
    sync(dev)
    ms = (time.perf_counter() - t) * 1e3
    demand = sum(len(np.unique(plan.routes[l])) for l in range(shape.layers))
    assert hits + misses == demand, (hits, misses, demand)
    return {"nodes": plan.nodes, "demand": demand, "hits": hits, "misses": misses, "ms": ms}


# ---------------------------------------------------------------------------------------------
# Microbenchmarks, fit, outputs


def median(xs):
    return float(np.median(np.asarray(xs)))


def microbench(shape, layers, cache, ctx, dev, dtype, gen):
    s = shape
    block = cache.host_block(0, 0)
    nbytes = block.numel() * block.element_size()
    slot = cache.flat[0][0]
    cache.lru[0].clear()  # slot 0 is overwritten below; the LRU must not trust it
    pinned = median(measure(lambda: slot.copy_(block, non_blocking=True), 50, dev))
    pageable_src = torch.empty(block.shape, dtype=block.dtype)
    pageable_src.copy_(block)
    pageable = median(measure(lambda: slot.copy_(pageable_src, non_blocking=True), 20, dev))
    slot.copy_(block)
    out = {
        "expert_bytes": nbytes,
        "h2d_pinned_ms": pinned, "h2d_pinned_gbps": nbytes / pinned / 1e6,
        "h2d_pageable_ms": pageable, "h2d_pageable_gbps": nbytes / pageable / 1e6,
    }
    for t in (1, 8):
        x = torch.randn(t, s.hidden, generator=gen).to(dev, dtype)
        out[f"swiglu_{t}tok_ms"] = median(measure(
            lambda: swiglu(x, cache.gate_up[0][0], cache.down[0][0], s.inter), 100, dev))
        chain = Plan(t - 1, "lru", 1.0, [-1] + list(range(t - 1)),
                     np.zeros((s.layers, t, s.top_k), np.int64))
        inp = make_inputs(s, chain, ctx, dev, dtype, gen)
        out[f"attention_{t}tok_ms"] = median(measure(
            lambda: attention(s, layers[0], inp.x, inp), 100, dev))
    return out


def fit(rows):
    """Least squares ms ≈ a[n] + β_hit·hits + β_miss·misses, and the paper form with demand."""
    if len(rows) < 3:
        return None
    ns = sorted({r["nodes"] for r in rows})
    y = np.array([r["ms"] for r in rows])
    out = {}
    forms = (("residency", (("hits", "beta_hit_ms"), ("misses", "beta_miss_ms"))),
             ("paper", (("demand", "beta_ms"),)))
    for form, cols in forms:
        x = np.zeros((len(rows), len(ns) + len(cols)))
        for i, r in enumerate(rows):
            x[i, ns.index(r["nodes"])] = 1.0
            for c, (key, _) in enumerate(cols):
                x[i, len(ns) + c] = r[key]
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        pred = x @ coef
        ss_tot = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
        out[form] = {"intercepts_ms": {str(n): float(coef[i]) for i, n in enumerate(ns)},
                     **{name: float(coef[len(ns) + i]) for i, (_, name) in enumerate(cols)},
                     "r2": r2, "median_abs_err_ms": float(np.median(np.abs(y - pred)))}
    return out


def state_stats(rows, states):
    out = {}
    for st in STATES:
        ms = [r["ms"] for r, s in zip(rows, states) if s == st]
        ar = [r["ms"] for r, s in zip(rows, states) if s == st and r["nodes"] == 0]
        out[st] = {"count": len(ms), "mean_ms": float(np.mean(ms)) if ms else None,
                   "autoregressive_count": len(ar),
                   "autoregressive_median_ms": median(ar) if ar else None}
    return out


def device_info(dev):
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "device": str(dev)}
    if dev.type == "cuda":
        info["cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(dev)
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=pcie.link.gen.current,"
                                "pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max",
                                "--format=csv"], capture_output=True, text=True, timeout=10)
            info["pcie"] = r.stdout.strip()
        except Exception as e:  # noqa: BLE001 - optional information
            info["pcie"] = f"unavailable: {e}"
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


class Outputs:
    """probes.jsonl (five keys per row) and summary.json in --out, rewritten atomically."""

    def __init__(self, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        self.rows_path = os.path.join(out_dir, "probes.jsonl")
        self.summary_path = os.path.join(out_dir, "summary.json")

    def write_rows(self, rows):
        write_atomic(self.rows_path, "".join(json.dumps(r) + "\n" for r in rows))

    def write_summary(self, summary):
        write_atomic(self.summary_path, json.dumps(summary, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Main


@dataclass
class Setup:
    dev: torch.device
    shape: Shape
    slots: int
    host_experts: int
    dtype: torch.dtype
    block_bytes: int
    chunks: list  # blocks per host pool chunk
    host_bytes: int  # host pool bytes after the pinned allocator's power-of-two rounding
    slot_bytes: int
    device_bytes: int  # slots plus dense weights and KV context (estimate)


def setup(args):
    """Resolves shapes, dtype and sizes from the arguments and checks the memory limits."""
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available; use --device cpu for the smoke test")
    shape = TINY if args.tiny else QWEN3_30B_A3B
    slots = args.slots if args.slots is not None else (8 if args.tiny else 48)
    if not 1 <= slots <= shape.experts:
        sys.exit(f"--slots {slots} must be in 1..={shape.experts}")
    host_experts = max(1, min(args.host_experts, shape.layers * shape.experts))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elem = torch.empty(0, dtype=dtype).element_size()
    block_bytes = shape.block_numel() * elem
    chunks, host_bytes = pinned_chunks(shape, host_experts, dtype)
    slot_bytes = shape.layers * slots * block_bytes
    device_bytes = slot_bytes + dense_bytes(shape, args.context, elem)
    if gib(host_bytes) > args.max_pinned_gib:
        sys.exit(f"host pool {gib(host_bytes):.2f} GiB > --max-pinned-gib; lower --host-experts")
    if gib(device_bytes) > args.max_gpu_gib:
        sys.exit(f"device memory {gib(device_bytes):.2f} GiB > --max-gpu-gib; lower --slots")
    return Setup(dev, shape, slots, host_experts, dtype, block_bytes, chunks, host_bytes,
                 slot_bytes, device_bytes)


def main(argv=None):
    args = parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 30.0 if args.tiny else 150.0
    su = setup(args)
    dev, shape, slots, dtype = su.dev, su.shape, su.slots, su.dtype
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    outputs = Outputs(args.out)
    route_sync = not args.no_route_sync
    summary = {
        "what": "verify-forward probes of a random-weight MoE with experts in host RAM behind an "
                "LRU of device slots (timing only; routes planned; no lm_head)",
        "args": vars(args), "shape": asdict(shape), "slots": slots,
        "host_experts": su.host_experts, "dtype": str(dtype).replace("torch.", ""),
        "expert_block_bytes": su.block_bytes, "device": device_info(dev),
        "memory": {"host_pool_bytes": su.host_experts * su.block_bytes,
                   "host_pool_pinned": dev.type == "cuda",
                   "host_pool_bytes_rounded_est": su.host_bytes, "host_pool_chunks": su.chunks,
                   "slot_bytes": su.slot_bytes, "device_bytes_est": su.device_bytes},
        "route_sync": route_sync,
    }
    log(f"device {summary['device'].get('gpu', dev)}; {shape.layers} layers x {slots} slots x "
        f"{su.block_bytes / 2**20:.2f} MiB = {gib(su.slot_bytes):.2f} GiB of slots; host pool "
        f"{su.host_experts} blocks, {gib(su.host_bytes):.2f} GiB "
        f"{'pinned' if dev.type == 'cuda' else 'pageable (no CUDA)'}")

    with torch.inference_mode():
        t = time.perf_counter()
        host = build_host_pool(shape, su.chunks, dev, dtype)
        log(f"host pool ready in {time.perf_counter() - t:.1f}s")
        layers = build_layers(shape, args.context, dev, dtype)
        cache = SlotCache(shape, slots, host, dev, dtype)
        sync(dev)
        if dev.type == "cuda":
            summary["memory"]["device_allocated_after_setup"] = torch.cuda.memory_allocated(dev)
        log("model and slots allocated")

        micro = microbench(shape, layers, cache, args.context, dev, dtype, gen)
        summary["micro"] = micro
        log("micro: " + ", ".join(f"{k}={v:.4g}" for k, v in micro.items()))
        summary["timing"] = {"setup_s": time.perf_counter() - T0}
        outputs.write_summary(summary)

        planner = Planner(shape, args, rng)
        t = time.perf_counter()
        for _ in range(args.warmup):
            run_probe(shape, layers, cache, planner.next(), args.context, dev, dtype, gen,
                      route_sync)
        summary["timing"]["warmup_s"] = time.perf_counter() - t
        log(f"{args.warmup} warm-up probes in {summary['timing']['warmup_s']:.1f}s")

        rows, details, states = [], [], []
        target = args.probes
        loop0 = time.perf_counter()
        i = 0
        while i < target:
            plan = planner.next()
            row = run_probe(shape, layers, cache, plan, args.context, dev, dtype, gen, route_sync)
            rows.append(row)
            states.append(plan.state)
            details.append({"state": plan.state, "share": round(plan.share, 4), **row})
            i += 1
            elapsed = time.perf_counter() - loop0
            if i == args.estimate and i < target:
                fits = args.estimate + int(max(0.0, args.budget_s - elapsed) / (elapsed / i))
                if fits < target:
                    log(f"{elapsed / i * 1e3:.0f} ms per probe: capping {target} -> {fits} probes")
                    target = fits
            if i % 10 == 0 or i == target:
                outputs.write_rows(rows)
            if i % 20 == 0 or i == target:
                log(f"probe {i}/{target}: nodes {row['nodes']} {plan.state:8s} demand "
                    f"{row['demand']} hits {row['hits']} misses {row['misses']} "
                    f"{row['ms']:.2f} ms")
            if i % 100 == 0:
                summary["probe_details"] = details
                outputs.write_summary(summary)
            if elapsed > args.budget_s * 1.1 and i < target:
                log(f"over budget after {i} probes; stopping")
                break
        outputs.write_rows(rows)
        summary["timing"]["loop_s"] = time.perf_counter() - loop0
        if dev.type == "cuda":
            summary["memory"]["device_max_allocated"] = torch.cuda.max_memory_allocated(dev)

    covered = sorted({r["nodes"] for r in rows})
    summary["probes"] = {"count": len(rows), "nodes_covered": covered,
                         "by_state": state_stats(rows, states)}
    summary["fit"] = fit(rows)
    summary["probe_details"] = details
    summary["timing"]["total_s"] = time.perf_counter() - T0
    outputs.write_summary(summary)
    if covered != list(range(MAX_NODES + 1)):
        log(f"warning: node counts {covered} do not cover 0..={MAX_NODES}; calibrate will refuse")
    f = (summary["fit"] or {}).get("residency")
    if f:
        a = f["intercepts_ms"]
        log(f"fit: beta_hit={f['beta_hit_ms']:.4f} ms beta_miss={f['beta_miss_ms']:.4f} ms "
            f"a[0]={a.get('0', float('nan')):.3f} ms a[7]={a.get('7', float('nan')):.3f} ms "
            f"R2={f['r2']:.3f}; copy {micro['h2d_pinned_gbps']:.2f} GB/s "
            f"({len(rows)} probes, {summary['timing']['total_s']:.1f}s total) -> {args.out}")
    else:
        log(f"too few probes to fit; wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
