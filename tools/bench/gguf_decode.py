"""Plain decoding of one GGUF by llama.cpp and by specfit under the peer protocol (protocol.py):
`peer_protocol.py decode` (any GGUF: the paper-scale files of `specfit inflate`) and
`peer_protocol.py full-size` (the random Qwen3-30B-A3B-shaped files of
`target/release/examples/random_qwen3moe`). For files that fit in RAM (warm: the file is read into
the page cache before every run) and files larger than RAM (cold: the page cache is dropped before
every run). This module owns that comparison; the protocol's steps are protocol.py's.

- the same compute threads: llama.cpp `n_threads` = `n_threads_batch` = `SPECFIT_THREADS` = T
  (specfit also runs `SPECFIT_IO_THREADS` expert-read threads, default 8, which mostly wait on
  the disk; they are reported);
- the same tokens: the prompt is tokenized once (llama.cpp's tokenizer, the file's own), or given
  as ids (`--prompt-ids`; the random full-size files have no tokenizer), and both engines decode
  greedily from those ids for the same number of tokens (end of text ignored), or are both fed
  the same ids (`--feed-seed`, teacher forcing); the report says whether the token sequences
  agree;
- llama.cpp at its best on this machine: weight repacking (`use_extra_bufts`) on and off, both
  reported (on is skipped for a file larger than memory: repacking copies the weights into
  anonymous memory); `mlock` (load mode mmap+mlock) when the file fits in memory and runs warm,
  never with repacking; flash attention chosen per file by a probe run of each setting (repacking
  off), the faster one kept (the probe is reported);
- at least 3 alternating rounds (each round runs every engine once, the order rotating), median
  and min–max per engine, ratios from the medians against the faster llama.cpp setting;
- the page cache is dropped before each cold run; a run that cannot drop it says so in the
  report (`caches_dropped: false`) and on stderr; memory is each process's peak RSS plus the
  pages of the model file it left in the page cache (`fincore`), not RSS alone;
- every command is recorded in the JSON (llama.cpp's is `python -c LLAMA CONFIG T0`, the script
  under `llama_script`).

    tools/.venv/bin/python tools/bench/peer_protocol.py decode bench-models/paper/target-q4_k_m.gguf --warm --specfit ram
    tools/.venv/bin/python tools/bench/peer_protocol.py decode bench-models/paper/target-q8_0.gguf --cold --specfit 16,32,48
    tools/.venv/bin/python tools/bench/peer_protocol.py full-size bench-models/full/qwen3-30b-a3b-q8_0.gguf

`--specfit` lists specfit's configurations: `ram` (experts used in place from the mapped file)
or a slot count (disk tier, experts streamed from the file into that many slots per layer).
Decode tok/s is specfit's definition for both: the first token comes from the prefill, then
`tokens − 1` one-token forwards are timed.

`full-size` is `decode` with that benchmark's defaults: cold, prompt ids 1..16, 24 tokens,
specfit at `ram,8,16,32,64` (without `ram` for a file larger than memory), teacher forcing with
`--feed-seed 0`, its own report (bench-results/full_size.json). A random model's greedy output
repeats tokens, which route every step to about the same experts (the disk tier would hit more
often than on real text); teacher forcing (as llama-bench feeds its tokens) instead feeds both
engines the same seeded pseudo-random ids, one per forward after the prefill, so both decode the
same sequence with each token routed about independently, and the report gives the share of
positions where the tokens each engine chose agree (`--feed-seed -1`: greedy, as `decode`).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import sys
import time

from protocol import (ROOT, cached_bytes, command_line, execute, fits_in_memory, flash_probe, llama_settings,
                      machine, meminfo, prepare_cache, rotation, rounds_arg, setting_name, spread, summary,
                      write_report)

SPECFIT = ROOT / "target/release/specfit"
PROMPT = ("<|im_start|>user\nQuestion: Janet's ducks lay 16 eggs per day. She eats three for breakfast every "
          "morning and bakes muffins for her friends every day with four. She sells the remainder at the "
          "farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at "
          "the farmers' market?<|im_end|>\n<|im_start|>assistant\n")
FULL_SIZE_PROMPT_IDS = ",".join(str(i) for i in range(1, 17))
PROBE_TOKENS = 16
FEED_VOCAB = 4096

LLAMA = r'''
import ctypes, json, sys, time
import llama_cpp as L, numpy as np
cfg = json.loads(sys.argv[1]); t0 = float(sys.argv[2])
keep = [L.llama_log_callback(lambda *_: None)]
L.llama_log_set(keep[0], ctypes.c_void_p(0)); L.llama_backend_init()
mp = L.llama_model_default_params(); mp.n_gpu_layers = 0
mp.use_extra_bufts = cfg["repack"]
mp.load_mode = L.LLAMA_LOAD_MODE_MMAP_MLOCK if cfg["mlock"] else L.LLAMA_LOAD_MODE_MMAP
m = L.llama_model_load_from_file(cfg["gguf"].encode(), mp)
assert m, "model failed to load"
vocab = L.llama_model_get_vocab(m)
if cfg.get("tokenize") is not None:
    text = cfg["tokenize"].encode()
    buf = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), False, True)
    print("IDS", ",".join(str(buf[i]) for i in range(n)), flush=True)
    sys.exit(0)
prompt = cfg["ids"]; n = cfg["tokens"]
# The whole prompt in one llama_decode call (its batch split into ubatches of 512 inside).
cp = L.llama_context_default_params(); cp.n_ctx = max(2048, len(prompt) + n + 1)
cp.n_batch = max(512, len(prompt)); cp.n_ubatch = 512
cp.n_threads = cp.n_threads_batch = cfg["threads"]
cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg["flash"] else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = L.llama_init_from_model(m, cp)
n_vocab = L.llama_vocab_n_tokens(vocab)
b = L.llama_batch_init(max(len(prompt), 1), 0, 1)
def run(toks, pos0):
    for i, t in enumerate(toks):
        b.token[i] = t; b.pos[i] = pos0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0
        b.logits[i] = 1 if i == len(toks) - 1 else 0
    b.n_tokens = len(toks)
    assert L.llama_decode(ctx, b) == 0
    z = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
    return int(np.argmax(z))
feed = cfg.get("feed") or []
tp = time.time(); nxt = run(prompt, 0); prefill = time.time() - tp; ttft = time.time() - t0
toks = [nxt]; t = time.time()
for s in range(n - 1):
    nxt = run([feed[s] if feed else nxt], len(prompt) + s); toks.append(nxt)
print("RESULT", ttft, (n - 1) / (time.time() - t), ",".join(map(str, toks)), 1000 * prefill, flush=True)
'''


def llama_cmd(cfg: dict) -> list[str]:
    return [sys.executable, "-c", LLAMA, json.dumps(cfg)]


def llama_command_line(cfg: dict) -> str:
    return command_line([sys.executable, "-c", "LLAMA", json.dumps(cfg), "T0"])


def run_llama(cfg: dict) -> dict:
    t0 = time.time()
    out, st, wall = execute(llama_cmd(cfg) + [str(t0)])
    _, ttft, tps, toks, prefill_ms = next(l for l in out.splitlines() if l.startswith("RESULT")).split()
    return {"tok_s": float(tps), "ttft_s": float(ttft), "prefill_ms": float(prefill_ms),
            "prefill_tokens": len(cfg["ids"]), "tokens": toks, "stats": st, "wall_s": wall,
            "command": llama_command_line(cfg)}


def tokenize(gguf: pathlib.Path, prompt: str, threads: int) -> list[int]:
    """The prompt's ids by the file's own tokenizer (llama.cpp's)."""
    cfg = {"gguf": str(gguf), "threads": threads, "repack": False, "mlock": False, "tokenize": prompt}
    out, _, _ = execute(llama_cmd(cfg) + ["0"])
    return [int(x) for x in next(l for l in out.splitlines() if l.startswith("IDS")).split()[1].split(",")]


def run_specfit(gguf: pathlib.Path, config: str, ids: list[int], tokens: int, threads: int,
                feed: list[int]) -> dict:
    store = ["--store", "ram"] if config == "ram" else ["--store", "disk", "--slots", config]
    cmd = [str(SPECFIT), "generate", "--model", str(gguf), *store,
           "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(tokens), "--ignore-eos"]
    if feed:
        cmd += ["--feed-ids", ",".join(map(str, feed))]
    env = {"SPECFIT_THREADS": str(threads)}
    out, st, wall = execute(cmd, os.environ | env)
    m = re.search(r"(\d+) tokens, ([\d.]+) tok/s decode; prefill (\d+) tokens in ([\d.]+) ms", out)
    toks = next((l for l in out.splitlines() if re.fullmatch(r"[\d,]+", l.strip())), "").strip()
    tps = float(m.group(2))
    ttft = wall - (int(m.group(1)) - 1) / tps if tps > 0 else wall
    return {"tok_s": tps, "ttft_s": ttft, "prefill_ms": float(m.group(4)), "prefill_tokens": int(m.group(3)),
            "tokens": toks, "stats": st,
            "wall_s": wall, "command": command_line(cmd, env), "log": out[-500:]}


def add_arguments(ap: argparse.ArgumentParser, full_size: bool = False) -> None:
    ap.add_argument("gguf", type=pathlib.Path)
    mode = ap.add_mutually_exclusive_group(required=not full_size)
    mode.add_argument("--warm", action="store_true", help="the file is read into the page cache before every run")
    mode.add_argument("--cold", action="store_true", help="the page cache is dropped before every run"
                      + (" (the default)" if full_size else ""))
    ap.add_argument("--specfit", default=None if full_size else "ram",
                    help="comma-separated: ram, or slot counts (disk tier)"
                         + ("; default ram,8,16,32,64 (8,16,32,64 for a file larger than memory)" if full_size else ""))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24 if full_size else 64)
    ap.add_argument("--rounds", type=rounds_arg, default=3)
    ap.add_argument("--prompt", default=PROMPT, help="text, tokenized by the file's own tokenizer")
    ap.add_argument("--prompt-ids", default=FULL_SIZE_PROMPT_IDS if full_size else None,
                    help="comma-separated prompt ids instead of --prompt (for a file without a tokenizer)")
    ap.add_argument("--feed-seed", type=int, default=0 if full_size else None,
                    help="teacher forcing: both engines are fed the same pseudo-random ids (seeded, "
                         "in [1, --feed-vocab)) one per forward instead of the tokens they choose"
                         + ("; default 0 (a random model's greedy output repeats tokens); -1: greedy"
                            if full_size else "; default: greedy"))
    ap.add_argument("--feed-vocab", type=int, default=FEED_VOCAB,
                    help=f"fed ids are below this (default {FEED_VOCAB}: inside every file's vocabulary, the "
                         "paper-scale files' 4,096 included)")
    ap.add_argument("--out", type=pathlib.Path,
                    default=ROOT / "bench-results" / ("full_size.json" if full_size else "peer_protocol.json"))
    ap.set_defaults(run=run_full_size if full_size else run)


def run_full_size(args: argparse.Namespace) -> None:
    args.cold = not args.warm
    if args.specfit is None:
        args.specfit = "ram,8,16,32,64" if fits_in_memory(args.gguf.stat().st_size) else "8,16,32,64"
    run(args)


def engines(args: argparse.Namespace, base: dict, fits: bool,
            size: int) -> tuple[list[tuple[str, dict]], list[dict]]:
    """The engines of every round (llama.cpp's settings, then specfit's configurations) and the
    settings skipped, with the reason."""
    out, skipped = [], []
    for setting in llama_settings(fits and args.warm):
        name = f"llama.cpp ({setting_name(setting)})"
        if setting["repack"] and not fits:
            # Repacking copies the weights into anonymous memory: a file larger than memory
            # cannot be repacked, and the attempt ends in the kernel's OOM killer.
            skipped.append({"engine": name, "skipped": "weight repacking copies the weights into anonymous "
                            f"memory; the file ({size / 1e9:.1f} GB) is larger than the available memory"})
            continue
        out.append((name, {**base, **setting}))
    for c in args.specfit.split(","):
        out.append((f"specfit ({'mapped in place' if c == 'ram' else c + ' slots, disk tier'})", {"specfit": c}))
    return out, skipped


def run(args: argparse.Namespace) -> None:
    size = args.gguf.stat().st_size
    fits = fits_in_memory(size)
    ids = ([int(x) for x in args.prompt_ids.split(",")] if args.prompt_ids
           else tokenize(args.gguf, args.prompt, args.threads))
    feed = fed_ids(args.feed_seed, args.tokens, args.feed_vocab)
    base = {"gguf": str(args.gguf), "threads": args.threads, "tokens": args.tokens, "ids": ids, "feed": feed}

    # Flash attention: one probe run of each setting (repacking off, no mlock), the faster kept.
    figures = {}
    for fa in ("off", "on"):
        prepare_cache([args.gguf], args.cold)
        figures[fa] = run_llama({**base, "repack": False, "mlock": False, "flash": fa == "on",
                                 "tokens": min(args.tokens, PROBE_TOKENS)})["tok_s"]
    probe = flash_probe(figures, "tok/s", "f16")
    flash = probe["chosen"] == "on"
    table_engines, skipped = engines(args, {**base, "flash": flash}, fits, size)
    runs: dict[str, list[dict]] = {name: [] for name, _ in table_engines}
    for r in range(args.rounds):
        for name, cfg in rotation(table_engines, r):
            dropped = prepare_cache([args.gguf], args.cold)
            before = cached_bytes(args.gguf)
            huge = meminfo("FileHugePages", missing=-1)
            try:
                res = (run_specfit(args.gguf, cfg["specfit"], ids, args.tokens, args.threads, feed)
                       if "specfit" in cfg
                       else run_llama(cfg))
            except RuntimeError as e:
                print(f"round {r} {name}: failed: {str(e)[:200]}", flush=True)
                runs[name].append({"round": r, "failed": str(e)[-600:], "caches_dropped": dropped})
                continue
            res.update({"round": r, "caches_dropped": dropped, "file_cached_before": before,
                        "file_huge_pages_before": huge, "file_cached_after": cached_bytes(args.gguf)})
            runs[name].append(res)
            print(f"round {r} {name}: {res['tok_s']:.2f} tok/s", flush=True)
    reference = next((x["tokens"] for name, rs in runs.items() if name.startswith("llama")
                      for x in rs if "failed" not in x), None)
    table = skipped + [row(name, runs[name], reference) for name, _ in table_engines]
    best_llama = max((r for r in table if "tok_s" in r and r["engine"].startswith("llama")),
                     key=lambda r: r["tok_s"]["median"], default=None)
    for r in table:
        if "tok_s" in r:
            r["vs_best_llama"] = r["tok_s"]["median"] / best_llama["tok_s"]["median"] if best_llama else None
    m = machine()
    report = {"gguf": str(args.gguf), "gguf_bytes": size, "mem_total_bytes": meminfo("MemTotal"),
              "mode": "cold" if args.cold else "warm", "threads": args.threads,
              "specfit_io_threads": m["specfit_io_threads"], "tokens": args.tokens, "rounds": args.rounds,
              "prompt": None if args.prompt_ids else args.prompt, "prompt_ids": ids,
              "decoding": "teacher-forced" if feed else "greedy", "feed_seed": args.feed_seed if feed else None,
              "feed_vocab": args.feed_vocab if feed else None,
              "feed_ids": feed,
              "flash_attention_probe_tok_s": {"off": figures["off"], "on": figures["on"]},
              "flash_attention_probe": probe, "flash_attention": flash, "cpu": m["cpu"], "machine": m,
              "invocation": args.invocation, "llama_script": LLAMA,
              "table": table, "runs": runs}
    write_report(args.out, report)
    print(markdown(report))
    print(f"\nwrote {args.out}")


def row(name: str, rs: list[dict], reference: str | None) -> dict:
    """One engine's line of the table: median and min–max of its rounds, memory, agreement with
    llama.cpp's first run (`reference`)."""
    ok = [x for x in rs if "failed" not in x]
    if not ok:
        return {"engine": name, "failed": rs[0]["failed"][:300]}
    out = {"engine": name, "tok_s": summary([x["tok_s"] for x in ok]),
           "ttft_s": summary([x["ttft_s"] for x in ok]),
           # The prompt's forward alone (TTFT also counts loading the model).
           "prefill_tok_s": summary([1000 * x["prefill_tokens"] / x["prefill_ms"] for x in ok]),
           "peak_rss_gb": summary([x["stats"].get("hwm_kb", 0) / 1e6 for x in ok]),
           "page_cache_gb": summary([max(x["file_cached_after"], 0) / 1e9 for x in ok]),
           # The page cache's file pages in huge folios before each run (system-wide; a mapped
           # file in 2 MB folios decodes faster: BENCHMARKS.md, "llama.cpp on the same files").
           "file_huge_pages_gb": summary([max(x.get("file_huge_pages_before", -1), 0) / 1e9 for x in ok]),
           "read_gb": summary([x["stats"].get("read_bytes", 0) / 1e9 for x in ok]),
           "same_tokens_as_llama": all(x["tokens"] == reference for x in ok),
           "agreement_with_llama": None if reference is None
           else min(agreement(x["tokens"], reference) for x in ok),
           "caches_dropped": all(x["caches_dropped"] for x in ok)}
    out["memory_gb_median"] = out["peak_rss_gb"]["median"] + out["page_cache_gb"]["median"]
    return out


def fed_ids(seed: int | None, tokens: int, vocab: int) -> list[int]:
    """The ids both engines are fed under teacher forcing (none: greedy decoding): one per
    forward after the prefill, drawn uniformly from 1..vocab-1 by a generator seeded `seed`."""
    if seed is None or seed < 0:
        return []
    if vocab < 2:
        raise SystemExit(f"--feed-vocab {vocab}: must be at least 2")
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(tokens - 1)]


def agreement(tokens: str, reference: str) -> float:
    """The share of positions where two comma-separated token lists agree."""
    a, b = tokens.split(","), reference.split(",")
    return sum(x == y for x, y in zip(a, b)) / max(len(a), len(b), 1)


def markdown(report: dict) -> str:
    p = report["flash_attention_probe"]
    lines = [f"{pathlib.Path(report['gguf']).name}, {report['mode']}, {report['threads']} threads "
             f"(+ {report['specfit_io_threads']} specfit I/O threads), {report['tokens']} "
             f"{'teacher-forced (fed ids seeded ' + str(report['feed_seed']) + ')' if report['feed_ids'] else 'greedy'} tokens, "
             f"{report['rounds']} rounds, flash attention {p['chosen']} (probe: off {p['off']:.2f}, "
             f"on {p['on']:.2f} tok/s)", "",
             "| engine | tok/s median (min–max) | × best llama.cpp | prefill tok/s | TTFT s | peak RSS GB "
             "| + page cache GB | read GB | same tokens | caches dropped |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["table"]:
        if "tok_s" not in r:
            why = r.get("failed", r.get("skipped"))
            lines.append(f"| {r['engine']} | {'failed' if 'failed' in r else 'not run'}: {why[:120]} "
                         "| | | | | | | | |")
            continue
        ratio = f"{r['vs_best_llama']:.2f}" if r["vs_best_llama"] else "–"
        lines.append(f"| {r['engine']} | {spread(r['tok_s'])} | {ratio} | {spread(r['prefill_tok_s'])} "
                     f"| {r['ttft_s']['median']:.1f} "
                     f"| {r['peak_rss_gb']['median']:.1f} | {r['page_cache_gb']['median']:.1f} "
                     f"| {r['read_gb']['median']:.1f} | {same(r)} "
                     f"| {dropped(report['mode'], r['caches_dropped'])} |")
    return "\n".join(lines)


def same(r: dict) -> str:
    """The "same tokens" cell: yes, or the lowest share of positions agreeing with llama.cpp."""
    if r["same_tokens_as_llama"]:
        return "yes"
    a = r.get("agreement_with_llama")
    return "no" if a is None else f"{100 * a:.0f}% of positions"


def dropped(mode: str, caches_dropped: bool) -> str:
    return "–" if mode == "warm" else "yes" if caches_dropped else "**no** (not root?)"
