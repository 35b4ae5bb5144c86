"""Verify cost: the time of one verify forward, specfit beside llama.cpp under the peer protocol
(protocol.py): `peer_protocol.py forward` (issue 12 item 6, issue 22). This module owns that
comparison; the protocol's steps (rounds, statistics, llama.cpp's settings, noise guard, report)
are protocol.py's.

One run measures, for specfit and for llama.cpp on a GGUF of the same target (models/target, same
weight dtype, same threads), the time of ONE forward of T new tokens (a causal chain, every row's
logits, as a verify forward needs) after C cached tokens, for T in --tokens and C in --cached,
the cache brought back to C tokens between repetitions (outside the timing). Each engine setting
runs --rounds times per dtype (a fresh process each; each round runs every engine, dtype and
llama.cpp setting once, the order rotating), --reps timed repetitions after --warmup untimed ones
per process and cell; reported per cell: the median of the processes' medians, the min–max of
those medians, and the least time of all (one process alone can sit 1.5x off for its whole life on
this machine). Ratios are from the medians, against the best llama.cpp setting of that dtype (the
one with the least sum of the cells' medians).

Token ids: the cached prefix is ids[i] = (7 + 131*i) % 4096 for i < C; the T new tokens continue the
same formula for i in C..C+T.

  specfit    target/release/examples/forward_time (crates/engine/examples/forward_time.rs), one
             process per dtype and round, SPECFIT_THREADS=threads; it does its own timing (3 warm-up reps per
             cell) and also times one drafted level of the EAGLE-3 drafter.
  llama.cpp  llama-cpp-python's low-level API in a subprocess of this script: the GGUF
             (tools/bench/README.md, "Forward time"), n_ctx 2048, n_batch = n_ubatch = 512,
             n_threads = n_threads_batch = threads; the f32 GGUF with an f32 KV cache, the bf16 GGUF
             with an f16 KV cache; two settings, weight repacking (use_extra_bufts) on, and off with
             mlock; prefill C tokens once, then per rep: llama_decode of T tokens at positions
             C..C+T-1 with logits for all T rows, timed with perf_counter around llama_decode +
             llama_synchronize, then llama_memory_seq_rm(positions >= C).

Flash attention (llama.cpp): per dtype, one probe process with it on and one with it off
(repacking off, PROBE_REPS reps; the figure is the sum of the cells' medians), the faster kept;
both figures are in the JSON. With flash attention on, llama.cpp casts an f32 KV cache to f16 in
every forward (src/llama-graph.cpp, build_attn_mha), which loses f32 accuracy (logits off by up to
~0.4 at C=1000 against transformers f32, against 4e-5 without) and costs a cast of C rows: for the
f32 GGUF only "off" keeps the same dtype, so it is kept whatever the probe says (the probe is still
run and recorded). --flash-attn on|off|auto fixes the setting instead.

Checks (llama.cpp, recorded in the JSON): every rep's logits equal the first rep's (the removal
really restores the cache), the memory's last position is C-1 after each removal, and the batched
rows match T one-token forwards at the same positions (the chain is causal and reads the cache).

Noise guard (protocol.py's): llama.cpp: before the timed reps of one C (all T) the worker waits for
a quiet second, and it repeats those reps if other processes used more than --max-others of a core
meanwhile. specfit: the same around the whole process.

    tools/.venv/bin/python tools/bench/peer_protocol.py forward      # writes bench-results/forward_time.json
    tools/.venv/bin/python tools/bench/peer_protocol.py forward --engines llama --dtypes f32 --reps 10
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from protocol import (DRIVER, GUARD, ROOT, add_worker_arguments, binary_info, command_line, convert_gguf, fits_in_memory,
                      flash_probe, guarded, llama_context, llama_model, llama_settings, machine, mark_process_tree, rel,
                      rotation, rounds_arg, run_json_worker, set_guard, setting_name, specfit_commit, spread,
                      thread_env, write_report)

DTYPES = ("f32", "bf16")
ENGINES = ("specfit", "llama")
KV_TYPE = {"f32": "f32", "bf16": "f16"}  # llama.cpp KV cache type per GGUF dtype
VOCAB = 4096
REPS_LOGITS_TOL = 1e-3  # llama.cpp's reps are bit-identical here; a cache not restored moves logits by far more
BUILD_HINT = "cargo build --release -p specfit-engine --example forward_time"
PROBE_REPS = 10


def token_ids(lo: int, hi: int, vocab: int = VOCAB) -> list[int]:
    return [(7 + 131 * i) % vocab for i in range(lo, hi)]


def min_median(ms: list[float]) -> dict:
    return {"min_ms": min(ms), "median_ms": statistics.median(ms)}


# ----------------------------------------------------------------------------------------------
# llama.cpp (run in a subprocess: `peer_protocol.py forward --worker llama --dtypes D --worker-config JSON ...`,
# prints one JSON line)


def llama_worker(args: argparse.Namespace) -> dict:
    import ctypes

    import llama_cpp as L
    import numpy as np

    log: list[str] = []
    capture = [True]

    @L.llama_log_callback
    def on_log(level, text, user_data):  # noqa: ARG001
        line = text.decode(errors="replace")
        if capture[0]:
            log.append(line)
        if args.verbose:
            sys.stderr.write(line)

    L.llama_log_set(on_log, ctypes.c_void_p(0))
    L.llama_backend_init()
    gguf = args.gguf
    kv_name = KV_TYPE[args.dtype]
    cfg = json.loads(args.worker_config)
    model = llama_model(gguf, cfg)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    if n_vocab != VOCAB:
        raise SystemExit(f"{gguf} has {n_vocab} tokens, expected {VOCAB}")

    fa = cfg["flash"]
    ctx, cp = llama_context(model, 2048, args.threads, kv_name, fa)
    capture[0] = False
    context_log = [ln.strip() for ln in log if ln.startswith(("llama_context", "llama_kv_cache"))
                   or "Flash Attention" in ln]
    resolved = [ln for ln in context_log if "Flash Attention" in ln]
    fa_used = {"on": "enabled", "off": "disabled"}.get(fa) or (
        "enabled" if any(ln.endswith("enabled") for ln in resolved) else
        "disabled" if any("disabled" in ln for ln in resolved) else "unknown")

    # Removing positions >= C: llama_memory_seq_rm on the context's memory (libllama >= mid-2025),
    # llama_kv_self_seq_rm before that.
    if hasattr(L, "llama_get_memory") and hasattr(L, "llama_memory_seq_rm"):
        mem = L.llama_get_memory(ctx)

        def seq_rm(p0: int) -> bool:
            return bool(L.llama_memory_seq_rm(mem, 0, p0, -1))

        def pos_max() -> int:
            return int(L.llama_memory_seq_pos_max(mem, 0))

        def clear() -> None:
            L.llama_memory_clear(mem, True)

        rm_api = "llama_memory_seq_rm"
    else:
        def seq_rm(p0: int) -> bool:
            return bool(L.llama_kv_self_seq_rm(ctx, 0, p0, -1))

        def pos_max() -> int:
            return int(L.llama_kv_self_seq_pos_max(ctx, 0))

        def clear() -> None:
            L.llama_kv_self_clear(ctx)

        rm_api = "llama_kv_self_seq_rm"
    sync = getattr(L, "llama_synchronize", lambda _ctx: None)

    batch = L.llama_batch_init(cp.n_batch, 0, 1)

    def fill(toks: list[int], pos0: int, logits: str) -> None:
        for i, tok in enumerate(toks):
            batch.token[i] = tok
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if logits == "all" or i == len(toks) - 1 else 0
        batch.n_tokens = len(toks)

    def decode(what: str) -> None:
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode failed ({rc}) on {what}")

    def logits(rows: int) -> np.ndarray:
        return np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(rows, n_vocab)).copy()

    cells = []
    for c in args.cached:
        if c + max(args.tokens) > cp.n_ctx:
            raise SystemExit(f"C={c} + T={max(args.tokens)} does not fit n_ctx {cp.n_ctx}")
        clear()
        prefix = token_ids(0, c)
        for lo in range(0, c, cp.n_batch):  # prefill in n_batch chunks, logits of the last row only
            fill(prefix[lo:lo + cp.n_batch], lo, "last")
            decode(f"the prefill (C={c})")
        if pos_max() != c - 1:
            raise SystemExit(f"after the prefill the memory ends at {pos_max()}, expected {c - 1}")

        def block(c: int = c) -> list[dict]:
            out = []
            for t in args.tokens:
                fill(token_ids(c, c + t), c, "all")
                ms, first, max_diff, ends = [], None, 0.0, set()
                for rep in range(args.warmup + args.reps):
                    if args.vary:  # other new tokens each rep (other experts), as the specfit side does
                        shift = 1 + rep * 7919
                        fill(token_ids(c + shift, c + shift + t), c, "all")
                    t0 = time.perf_counter()
                    decode(f"T={t} after C={c}")
                    sync(ctx)
                    took = (time.perf_counter() - t0) * 1e3
                    got = logits(t)
                    if not seq_rm(c) or pos_max() != c - 1:
                        raise SystemExit(f"{rm_api} did not bring the memory back to C={c} "
                                         f"(it ends at position {pos_max()})")
                    ends.add(pos_max())
                    if first is None:
                        first = got
                    elif not args.vary:
                        max_diff = max(max_diff, float(np.abs(got - first).max()))
                    if rep >= args.warmup:
                        ms.append(took)
                if max_diff > REPS_LOGITS_TOL:
                    raise SystemExit(f"T={t} after C={c}: a rep's logits differ from the first rep's by "
                                     f"{max_diff:g}; the cache is not restored between reps")
                if max_diff > 0:
                    print(f"WARNING: T={t} after C={c}: reps' logits differ by {max_diff:g} (not bit-identical)",
                          file=sys.stderr)
                out.append({"cached": c, "tokens": t, "ms": [round(x, 4) for x in ms], **min_median(ms),
                            "reps_logits_max_abs_diff": max_diff, "pos_max_after_rm": sorted(ends),
                            "_first": first})
            return out

        rows, guard = guarded(block)
        for row in rows:
            # The chain is causal and reads the cache: row i of the batched forward equals a
            # one-token forward of token i at position C+i (after rows 0..i-1 went in one by one).
            t, first = row["tokens"], row.pop("_first")
            seq = []
            for i, tok in enumerate(token_ids(c, c + t)):
                fill([tok], c + i, "all")
                decode(f"the one-token check (C={c}, T={t})")
                seq.append(logits(1)[0])
            seq_rm(c)
            seq = np.stack(seq)
            row["vs_one_token_forwards"] = {
                "max_abs_diff": float(np.abs(seq - first).max()),
                "max_abs_logit": float(np.abs(first).max()),
                "argmax_agree": int((seq.argmax(1) == first.argmax(1)).sum()),
            }
            row.update(guard)
            cells.append(row)
        print(f"[forward_time] llama.cpp {args.dtype} C={c}: "
              + ", ".join(f"T={r['tokens']} {r['min_ms']:.3f}" for r in rows) + " ms (min)",
              file=sys.stderr, flush=True)

    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {
        "engine": "llama.cpp", "dtype": args.dtype, "threads": args.threads, "rows": cells,
        "gguf": rel(gguf),
        "repack": cfg["repack"], "mlock": cfg["mlock"],
        "kv_cache": kv_name, "n_ctx": cp.n_ctx, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch,
        "flash_attn": {"requested": fa, "used": fa_used},
        "memory_rm_api": rm_api, "context_log": context_log,
        "system_info": L.llama_print_system_info().decode().strip(),
        "versions": {"llama-cpp-python": L.__version__,
                     "libllama": L.llama_version().decode() if hasattr(L, "llama_version") else None},
    }


def run_llama(args: argparse.Namespace, dtype: str, cfg: dict, reps: int) -> dict:
    """One llama.cpp process (the worker) for one dtype and setting."""
    cmd = [sys.executable, str(DRIVER), "forward", "--worker", "llama", "--dtypes", dtype,
           "--gguf-dir", str(args.gguf_dir),
           "--cached", ",".join(map(str, args.cached)), "--tokens", ",".join(map(str, args.tokens)),
           "--threads", str(args.threads), "--reps", str(reps), "--warmup", str(args.warmup),
           "--worker-config", json.dumps(cfg), *args.guard_flags]
    if args.verbose:
        cmd.append("--verbose")
    if args.vary:
        cmd.append("--vary")
    return run_json_worker(cmd, args.threads, f"the llama.cpp worker ({dtype}, {cfg})")


def gguf_path(args: argparse.Namespace, dtype: str) -> pathlib.Path:
    return args.gguf_dir / f"target-{dtype}.gguf"


def ensure_gguf(args: argparse.Namespace, dtype: str) -> None:
    convert_gguf(gguf_path(args, dtype), args.model, dtype, args.llama_cpp_src,
                 'tools/bench/README.md, "Forward time"', tokenizer_pre="qwen2")


def probe_flash(args: argparse.Namespace, dtype: str) -> dict:
    """One llama.cpp process with flash attention off and one with it on (repacking off, no mlock,
    PROBE_REPS reps); the figure is the sum of the cells' medians."""
    runs = {fa: run_llama(args, dtype, {"repack": False, "mlock": False, "flash": fa}, PROBE_REPS)
            for fa in ("off", "on")}
    record = flash_probe({fa: sum(r["median_ms"] for r in res["rows"]) for fa, res in runs.items()},
                         "ms (sum of the cells' medians)", KV_TYPE[dtype])
    return record | {"commands": {fa: res["command"] for fa, res in runs.items()}}


# ----------------------------------------------------------------------------------------------
# specfit (the forward_time example, one process per dtype and round)


def run_specfit(args: argparse.Namespace, dtype: str) -> dict:
    cmd = [str(args.specfit_bin), "--model", str(args.model), "--dtype", dtype, "--drafter", str(args.drafter),
           "--cached", ",".join(map(str, args.cached)), "--tokens", ",".join(map(str, args.tokens)),
           "--reps", str(args.reps)] + (["--vary"] if args.vary else [])
    env = thread_env(args.threads)

    def block() -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=os.environ | env, capture_output=True, text=True)

    binary = binary_info(args.specfit_bin)
    p, guard = guarded(block)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"no JSON object on the stdout of {' '.join(cmd)}:\n{p.stdout}\n{p.stderr}")
    res = json.loads(lines[-1])
    have = {(r["cached"], r["tokens"]) for r in res.get("rows", [])}
    missing = [(c, t) for c in args.cached for t in args.tokens if (c, t) not in have]
    if missing:
        raise SystemExit(f"specfit printed no row for (cached, tokens) {missing}")
    if res.get("threads") != args.threads:
        print(f"WARNING: specfit reports {res.get('threads')} threads, asked for {args.threads}", file=sys.stderr)
    for r in res["rows"]:
        r.update(guard)
    print(f"[forward_time] specfit {dtype}: "
          + "; ".join(f"C={c} " + ", ".join(f"T={r['tokens']} {r['min_ms']:.3f}" for r in res["rows"]
                                            if r["cached"] == c) for c in args.cached) + " ms (min)",
          file=sys.stderr, flush=True)
    return res | {"binary": binary, "noise_guard_scope": "whole process", **guard,
                  "command": command_line(cmd, env)}


# ----------------------------------------------------------------------------------------------
# driver


def ints(v: str) -> list[int]:
    return [int(x) for x in v.split(",") if x]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of f32,bf16")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of specfit,llama")
    ap.add_argument("--llama-repack", default="on,off",
                    help="llama.cpp's weight repacking settings to run (off runs with mlock: the files fit)")
    ap.add_argument("--cached", type=ints, default="100,1000", help="cached tokens C (comma-separated)")
    ap.add_argument("--tokens", type=ints, default="1,2,4,8,16", help="new tokens T per forward (comma-separated)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30, help="timed forwards per (C, T) and process")
    ap.add_argument("--vary", action="store_true",
                    help="other new tokens in every rep (other experts, not all warm in the caches), both engines")
    ap.add_argument("--rounds", type=rounds_arg, default=3,
                    help="processes per engine setting and dtype, in a rotating order (median of the medians, "
                         "their min–max, least time)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed forwards per (C, T) before them (llama.cpp; "
                    "specfit's example does 3)")
    ap.add_argument("--model", type=pathlib.Path, default=ROOT / "models/target")
    ap.add_argument("--drafter", type=pathlib.Path, default=ROOT / "models/drafter")
    ap.add_argument("--gguf-dir", type=pathlib.Path, default=ROOT / "bench-models/target-gguf",
                    help="holds target-f32.gguf and target-bf16.gguf")
    ap.add_argument("--flash-attn", default="probe", choices=["probe", "auto", "on", "off"],
                    help="llama.cpp flash attention; probe: the faster of on and off per dtype, off for the f32 GGUF "
                         "(on casts its f32 KV cache to f16)")
    ap.add_argument("--llama-cpp-src", type=pathlib.Path, default=None,
                    help="llama.cpp source tree, to convert missing GGUFs")
    ap.add_argument("--specfit-bin", type=pathlib.Path, default=ROOT / "target/release/examples/forward_time")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-results/forward_time.json")
    add_worker_arguments(ap)
    ap.set_defaults(run=run)


def check(args: argparse.Namespace) -> tuple[list[str], list[str], list[dict]]:
    """The dtypes, engines and llama.cpp settings asked for; SystemExit on a bad value."""
    dtypes = [d for d in args.dtypes.split(",") if d]
    engines = [e for e in args.engines.split(",") if e]
    repack = [r for r in args.llama_repack.split(",") if r]
    for values, allowed, what in ((dtypes, DTYPES, "dtype"), (engines, ENGINES, "engine"),
                                  (repack, ("on", "off"), "--llama-repack value")):
        for v in values:
            if v not in allowed:
                raise SystemExit(f"unknown {what} {v}")
    if not args.cached or not args.tokens or min(args.cached + args.tokens) < 1 or args.reps < 1:
        raise SystemExit("--cached, --tokens and --reps need positive values")
    settings = [s for s in llama_settings(True) if ("on" if s["repack"] else "off") in repack]
    return dtypes, engines, settings


def run(args: argparse.Namespace) -> None:
    dtypes, engines, settings = check(args)
    args.gguf_dir = args.gguf_dir.resolve()
    args.guard_flags = set_guard(args)

    if args.worker:
        args.dtype = dtypes[0]
        args.gguf = gguf_path(args, args.dtype)
        print(json.dumps(llama_worker(args)))
        return

    mark_process_tree()
    if "specfit" in engines and not args.specfit_bin.is_file():
        raise SystemExit(f"{args.specfit_bin} is missing: run `{BUILD_HINT}` first (or pass --specfit-bin)")
    load_before = os.getloadavg()
    # The engines of a round: specfit and each llama.cpp setting, per dtype. mlock with repacking
    # off where the GGUF fits in memory (these are tens of MB).
    entries: list[tuple[str, str, dict | None]] = []
    probes, flash = {}, {}
    for dtype in dtypes:
        if "specfit" in engines:
            entries.append((dtype, "specfit", None))
        if "llama" not in engines:
            continue
        ensure_gguf(args, dtype)
        if args.flash_attn == "probe":
            print(f"[forward_time] flash-attention probe, llama.cpp {dtype} ...", file=sys.stderr, flush=True)
            probes[dtype] = probe_flash(args, dtype)
        flash[dtype] = probes[dtype]["chosen"] if dtype in probes else args.flash_attn
        fits = fits_in_memory(gguf_path(args, dtype).stat().st_size)
        for s in settings:
            s = {**s, "mlock": s["mlock"] and fits}
            entries.append((dtype, f"llama ({setting_name(s)})", s | {"flash": flash[dtype]}))
    # Rounds: every entry once per round, the order rotating, each in a fresh process. On this
    # (virtual) machine one process of either engine can run a whole cell 1.5x slower than the next
    # one on a quiet machine, steadily through its reps, so one process per engine is not enough.
    runs: dict[str, dict[str, list]] = {d: {} for d in dtypes}
    for r in range(args.rounds):
        for dtype, key, cfg in rotation(entries, r):
            print(f"[forward_time] round {r + 1}/{args.rounds}: {key} {dtype} ...", file=sys.stderr, flush=True)
            res = run_specfit(args, dtype) if cfg is None else run_llama(args, dtype, cfg, args.reps)
            runs[dtype].setdefault(key, []).append(res)
    results = {d: {key: merge_rounds(rs) for key, rs in runs[d].items()} for d in dtypes}
    best = {d: best_llama(results[d]) for d in dtypes}

    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "what": "time of one forward of T new tokens (causal chain, logits for every row) after C cached tokens",
        "vary": args.vary,
        "model": rel(args.model), "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
        "warmup_llama": args.warmup,
        "statistics": "min_ms: least of all rounds' reps; median_ms: median of the rounds' medians; "
                      "round_median_min_ms / round_median_max_ms: the least and the largest of those medians",
        "cached": args.cached, "tokens": args.tokens,
        "token_ids": "ids[i] = (7 + 131*i) % 4096; cached prefix i < C, new tokens C <= i < C+T",
        "llama_kv_cache": {d: KV_TYPE[d] for d in dtypes},
        "llama_flash_attn": flash, "llama_flash_attention_probe": probes,
        "best_llama": best, "specfit_vs_best_llama": {d: ratios(results[d], best[d]) for d in dtypes},
        "noise_guard": dict(GUARD), "specfit_commit": specfit_commit(), "invocation": args.invocation,
        "results": results,
    }
    write_report(args.out, report)
    print(markdown(report))
    print(f"\n(written to {args.out})", file=sys.stderr)


def merge_rounds(rounds: list[dict]) -> dict:
    """One engine setting's result over its rounds: per cell the least min, the median of the
    medians and their min–max; the largest deviation of each llama.cpp check; every round kept
    under "rounds"."""
    first = rounds[0]
    per_round = ("rows", "draft_level", "others_cpu_share", "discarded_noisy_runs", "waited_for_quiet_s", "command")
    out = {k: v for k, v in first.items() if k not in per_round}
    for key, ident in (("rows", ("cached", "tokens")), ("draft_level", ("cached", "nodes"))):
        if key not in first:
            continue
        merged = []
        for row in first[key]:
            same = [next(x for x in run[key] if all(x.get(i) == row.get(i) for i in ident)) for run in rounds]
            medians = [x["median_ms"] for x in same]
            m = {i: row[i] for i in ident if i in row}
            m |= {"min_ms": min(x["min_ms"] for x in same), "median_ms": statistics.median(medians),
                  "round_median_min_ms": min(medians), "round_median_max_ms": max(medians),
                  "round_min_ms": [x["min_ms"] for x in same], "round_median_ms": medians}
            if "reps_logits_max_abs_diff" in row:
                m["reps_logits_max_abs_diff"] = max(x["reps_logits_max_abs_diff"] for x in same)
                m["vs_one_token_forwards_max_abs_diff"] = max(
                    x["vs_one_token_forwards"]["max_abs_diff"] for x in same)
            merged.append(m)
        out[key] = merged
    if "binary" in first:
        shas = {r["binary"]["sha256"] for r in rounds}
        if len(shas) > 1:  # rebuilt while the benchmark ran: the rounds timed different code
            out["binary"] = [r["binary"] for r in rounds]
            print(f"WARNING: {first['binary']['path']} changed between rounds ({len(shas)} different builds); "
                  "the merged numbers mix them", file=sys.stderr)
    out["commands"] = [r["command"] for r in rounds]
    out["rounds"] = rounds
    return out


def best_llama(results: dict) -> str | None:
    """The llama.cpp setting with the least sum of the cells' medians."""
    llama = [k for k in results if k.startswith("llama")]
    return min(llama, key=lambda k: sum(r["median_ms"] for r in results[k]["rows"]), default=None)


def ratios(results: dict, best: str | None) -> list[dict]:
    """specfit / the best llama.cpp setting per cell, from the medians (< 1: specfit faster)."""
    if best is None or "specfit" not in results:
        return []
    ref = {(r["cached"], r["tokens"]): r["median_ms"] for r in results[best]["rows"]}
    return [{"cached": r["cached"], "tokens": r["tokens"], "ratio": r["median_ms"] / ref[(r["cached"], r["tokens"])]}
            for r in results["specfit"]["rows"]]


def label(key: str, dtype: str) -> str:
    return f"specfit {dtype}" if key == "specfit" else f"llama.cpp {dtype} {key[len('llama '):]}"


def markdown(report: dict) -> str:
    ts, out = report["tokens"], []
    n = f"{report['rounds']} processes × {report['reps']} reps"
    vary = ", other new tokens every rep" if report.get("vary") else ""
    header = ["| engine, C | " + " | ".join(f"T={t}" for t in ts) + " |", "|---|" + "---:|" * len(ts)]
    for stat, title in (("median_ms", f"median of the medians of {n} (min–max of those medians)"),
                        ("min_ms", f"least of {n}")):
        out += [f"Forward time of T new tokens after C cached, ms ({title}{vary}), "
                f"{report['threads']} threads, {report['machine']['cpu']}", "", *header]
        for dtype, res in report["results"].items():
            best = report["best_llama"][dtype]
            ratio = {(x["cached"], x["tokens"]): x["ratio"] for x in report["specfit_vs_best_llama"][dtype]}
            for c in report["cached"]:
                for key, r in res.items():
                    cells = {x["tokens"]: x for x in r["rows"] if x["cached"] == c}
                    out.append(f"| {label(key, dtype)}, C={c} | "
                               + " | ".join(cell(cells[t], stat) for t in ts) + " |")
                if ratio and stat == "median_ms":
                    out.append(f"| specfit / {label(best, dtype)} | "
                               + " | ".join(f"{ratio[(c, t)]:.2f}" for t in ts) + " |")
        out.append("")
        for dtype, res in report["results"].items():
            lv = res.get("specfit", {}).get("draft_level", [])
            if lv:
                out.append(f"specfit {dtype} drafted level (EAGLE-3 drafter, {lv[0].get('nodes', 2)} nodes + "
                           "top-2 children each), ms: " + ", ".join(f"C={x['cached']} {x[stat]:.3f}" for x in lv))
        out.append("")
    for dtype, res in report["results"].items():
        llama = [r for k, r in res.items() if k.startswith("llama")]
        if not llama:
            continue
        probe = report["llama_flash_attention_probe"].get(dtype)
        chose = (f"flash attention {llama[0]['flash_attn']['used']} ({llama[0]['flash_attn']['requested']}"
                 + (f"; probe, {probe['unit']}: off {probe['off']:.2f}, on {probe['on']:.2f})" if probe else ")"))
        out.append(f"llama.cpp {dtype}: GGUF with {llama[0]['kv_cache']} KV cache, {chose}; n_ctx "
                   f"{llama[0]['n_ctx']}, n_batch = n_ubatch = {llama[0]['n_batch']}; llama-cpp-python "
                   f"{llama[0]['versions']['llama-cpp-python']}")
    return "\n".join(out).rstrip()


def cell(row: dict, stat: str) -> str:
    if stat == "min_ms":
        return f"{row['min_ms']:.3f}"
    return spread({"median": row["median_ms"], "min": row["round_median_min_ms"],
                   "max": row["round_median_max_ms"]}, ".3f")
