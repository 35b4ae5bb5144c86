"""Engine: autoregressive decode speed at batch 1, specfit beside transformers and llama.cpp under
the peer protocol (protocol.py): `peer_protocol.py engine` (issue 3, issue 22). This module owns
that comparison; the protocol's steps (rounds, statistics, llama.cpp's settings, noise guard,
report) are protocol.py's.

One run measures, on the same random Qwen3-MoE checkpoint (tools/bench/make_peer_model.py), the
same prompt token ids and the same number of greedy tokens (eos ignored):

  hf-f32, hf-bf16            transformers (torch CPU): f32 checkpoint, f32 compute; bf16 checkpoint, bf16 compute
  llama-f32, llama-bf16      llama.cpp (llama-cpp-python, low-level API): f32 GGUF + f32 KV cache; bf16 GGUF
                             (of the bf16 checkpoint: specfit's weights) + f16 KV cache; each in two
                             settings, weight repacking (use_extra_bufts) on, and off with mlock
  specfit-f32, specfit-bf16  specfit (target/release/specfit generate): f32 checkpoint; bf16 checkpoint

Decode tok/s counts decode only, as specfit does: the first token comes from the prefill logits,
then N-1 one-token forwards (each followed by an argmax) are timed, tok/s = (N-1) / time.
Rounds (--rounds, at least 3): each round runs every engine row once, the order rotating; in a
round an engine gets --warmup untimed runs, then --reps timed runs (each Python engine in its own
subprocess, so torch's and ggml's OpenMP pools never share one; specfit one process per run).
Reported per row: the median of the rounds' medians, the min–max of those medians, the best run;
ratios from the medians, against the faster llama.cpp setting of the same weights (f32 rows against
llama-f32, half-precision rows against llama-bf16).

llama.cpp's flash attention: per GGUF one probe round with it off and one with it on (repacking
off), the faster kept; with it on llama.cpp casts an f32 KV cache to f16 in every forward, so the
f32 GGUF keeps "off" (the probe is still run and recorded).

Agreement: the greedy sequences are compared with transformers' (length of the common prefix).
f32 rows are compared with transformers f32; bf16 rows also with transformers running the bf16
checkpoint widened to f32 (what specfit's bf16 path computes exactly), and every row with the best
llama.cpp setting of the same weights. With random weights small numeric differences can flip
near-ties, so this reports and does not assert.

Noise guard (protocol.py's): before each timed run the worker waits for a quiet second and throws
the run away if other processes used more than --max-others of a core meanwhile.

    tools/.venv/bin/python tools/bench/peer_protocol.py engine      # writes bench-results/peer_decode.json

GGUFs are made by tools/bench/convert_peer_gguf.py (see tools/bench/README.md); a missing one is
converted on the fly when --llama-cpp-src is given.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

from protocol import (DRIVER, GUARD, ROOT, add_worker_arguments, binary_info, command_line, convert_gguf, cpu_snapshot,
                      flash_probe, llama_context, llama_model, llama_settings, machine, mark_process_tree,
                      others_seconds, rel, rotation, rounds_arg, run_json_worker, set_guard, setting_name,
                      specfit_commit, spread, thread_env, wait_quiet, write_report)

# key -> (engine, weights, description of the compute)
ENGINES = {
    "hf-f32": ("transformers", "f32", "f32 checkpoint, f32 compute"),
    "hf-bf16": ("transformers", "bf16", "bf16 checkpoint, bf16 compute"),
    "llama-f32": ("llama.cpp", "f32", "f32 GGUF, f32 KV cache"),
    "llama-bf16": ("llama.cpp", "bf16", "bf16 GGUF, f16 KV cache"),
    "specfit-f32": ("specfit", "f32", "f32 checkpoint, f32 compute"),
    "specfit-bf16": ("specfit", "bf16", "bf16 checkpoint widened exactly, f32 compute"),
}
KV_TYPE = {"llama-f32": "f32", "llama-bf16": "f16"}
# Agreement reference for the low-precision rows (run once, not in the table).
REF_BF16 = "hf-bf16ckpt-f32"


# ----------------------------------------------------------------------------------------------
# workers (run in a subprocess: `peer_protocol.py engine --worker KEY [--worker-config JSON] ...`, print one
# JSON line)


def hf_worker(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    ckpt, dtype = {
        "hf-f32": ("f32", torch.float32),
        "hf-bf16": ("bf16", torch.bfloat16),
        REF_BF16: ("bf16", torch.float32),
    }[args.worker]
    model = AutoModelForCausalLM.from_pretrained(args.model_dir / ckpt, dtype=dtype).eval()
    prompt = torch.tensor([args.prompt_ids])

    def run() -> tuple[list[int], float, float]:
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(input_ids=prompt, use_cache=True)
            tok = int(out.logits[0, -1].float().argmax())
            t1 = time.perf_counter()
            toks = [tok]
            past = out.past_key_values
            for _ in range(args.tokens - 1):
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = int(out.logits[0, -1].float().argmax())
                toks.append(tok)
            t2 = time.perf_counter()
        return toks, t1 - t0, t2 - t1

    return timed(run, args.warmup, args.reps, args.tokens) | {
        "threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }


def llama_worker(args: argparse.Namespace) -> dict:
    import ctypes

    import llama_cpp as L
    import numpy as np

    @L.llama_log_callback
    def quiet(level, text, user_data):  # noqa: ARG001
        if args.verbose:
            sys.stderr.write(text.decode(errors="replace"))

    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    cfg = json.loads(args.worker_config)
    gguf = gguf_path(args, args.worker)
    model = llama_model(gguf, cfg)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    prompt = (L.llama_token * len(args.prompt_ids))(*args.prompt_ids)

    def run() -> tuple[list[int], float, float]:
        ctx, _ = llama_context(model, 512, args.threads, KV_TYPE[args.worker], cfg["flash"])

        def argmax() -> int:
            ptr = L.llama_get_logits_ith(ctx, -1)
            return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())

        one = (L.llama_token * 1)()
        t0 = time.perf_counter()
        if L.llama_decode(ctx, L.llama_batch_get_one(prompt, len(args.prompt_ids))) != 0:
            raise SystemExit("llama_decode failed on the prompt")
        tok = argmax()
        t1 = time.perf_counter()
        toks = [tok]
        for _ in range(args.tokens - 1):
            one[0] = tok
            if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                raise SystemExit("llama_decode failed")
            tok = argmax()
            toks.append(tok)
        t2 = time.perf_counter()
        L.llama_free(ctx)
        return toks, t1 - t0, t2 - t1

    res = timed(run, args.warmup, args.reps, args.tokens)
    L.llama_model_free(model)
    return res | {
        "threads": args.threads, "kv_cache": KV_TYPE[args.worker], "repack": cfg["repack"], "mlock": cfg["mlock"],
        "flash_attn": cfg["flash"], "gguf": rel(gguf),
        "system_info": L.llama_print_system_info().decode().strip(),
        "versions": {"llama-cpp-python": L.__version__},
    }


def timed(run, warmup: int, reps: int, n: int) -> dict:
    """warmup untimed runs, then reps timed ones, each after a quiet second; a run during which
    others used more than --max-others of a core is thrown away (up to --max-retries)."""
    for _ in range(warmup):
        run()
    tok_s, prefill_ms, seqs, others, discarded, waited = [], [], [], [], 0, 0.0
    while len(tok_s) < reps:
        waited += wait_quiet(GUARD["max_others"], GUARD["quiet_timeout"])
        before, t0 = cpu_snapshot(), time.perf_counter()
        toks, prefill, decode = run()
        share = others_seconds(before, cpu_snapshot()) / (time.perf_counter() - t0)
        seqs.append(toks)
        if share > GUARD["max_others"] and discarded < GUARD["max_retries"]:
            discarded += 1
            continue
        tok_s.append((n - 1) / decode)
        prefill_ms.append(prefill * 1e3)
        others.append(round(share, 4))
    return {"tok_s": tok_s, "prefill_ms": prefill_ms, "tokens": seqs[0],
            "deterministic": all(s == seqs[0] for s in seqs), "others_cpu_share": others,
            "discarded_noisy_runs": discarded, "waited_for_quiet_s": round(waited, 1)}


# ----------------------------------------------------------------------------------------------
# specfit (the CLI binary, one process per run)

SPECFIT_LINE = re.compile(r"(\d+) tokens, ([\d.]+) tok/s decode; prefill (\d+) tokens in ([\d.]+) ms")


def specfit_bench(args: argparse.Namespace, key: str) -> dict:
    ckpt = {"specfit-f32": "f32", "specfit-bf16": "bf16"}[key]
    cmd = [
        str(args.specfit), "generate", "--model", str(args.model_dir / ckpt),
        "--prompt-ids", ",".join(map(str, args.prompt_ids)),
        "--max-tokens", str(args.tokens), "--ignore-eos",
    ]
    env = thread_env(args.threads)

    def run() -> tuple[list[int], float, float]:
        p = subprocess.run(cmd, env=os.environ | env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
        m = SPECFIT_LINE.search(p.stderr)
        if not m:
            raise SystemExit(f"no tok/s line in specfit's stderr:\n{p.stderr}")
        toks = [int(t) for t in p.stdout.strip().split(",")]
        if len(toks) != args.tokens or int(m.group(1)) != args.tokens:
            raise SystemExit(f"specfit made {len(toks)} tokens, asked for {args.tokens}")
        tok_s = float(m.group(2))
        return toks, float(m.group(4)) / 1e3, (args.tokens - 1) / tok_s

    binary = binary_info(args.specfit)
    res = timed(run, args.warmup, args.reps, args.tokens)
    return res | {"threads": args.threads, "binary": binary, "command": command_line(cmd, env)}


# ----------------------------------------------------------------------------------------------
# driver


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_worker(args: argparse.Namespace, key: str, cfg: dict | None = None, reference: bool = False) -> dict:
    """One round of a Python engine (a worker subprocess); the reference runs once, untimed."""
    cmd = [sys.executable, str(DRIVER), "engine", "--worker", key, "--model-dir", str(args.model_dir),
           "--gguf-f32", str(args.gguf_f32), "--gguf-bf16", str(args.gguf_bf16),
           "--prompt-ids", ",".join(map(str, args.prompt_ids)), "--tokens", str(args.tokens),
           "--threads", str(args.threads), *args.guard_flags,
           "--reps", str(1 if reference else args.reps), "--warmup", str(0 if reference else args.warmup)]
    if cfg is not None:
        cmd += ["--worker-config", json.dumps(cfg)]
    if args.verbose:
        cmd.append("--verbose")
    return run_json_worker(cmd, args.threads, f"worker {key}")


def run_row(args: argparse.Namespace, key: str, cfg: dict | None) -> dict:
    return specfit_bench(args, key) if key.startswith("specfit") else run_worker(args, key, cfg)


def gguf_path(args: argparse.Namespace, key: str) -> pathlib.Path:
    return {"llama-f32": args.gguf_f32, "llama-bf16": args.gguf_bf16}[key]


def ensure_gguf(args: argparse.Namespace, key: str) -> None:
    """Converts the GGUF of a llama.cpp key from the checkpoint of the same dtype, if missing."""
    dtype = ENGINES[key][1]
    convert_gguf(gguf_path(args, key), args.model_dir / dtype, dtype, args.llama_cpp_src, "tools/bench/README.md")


def probe_flash(args: argparse.Namespace, key: str) -> dict:
    """One round of the llama.cpp key with flash attention off and one with it on (repacking off,
    no mlock); the figure is the round's median tok/s."""
    runs = {fa: run_worker(args, key, {"repack": False, "mlock": False, "flash": fa}) for fa in ("off", "on")}
    record = flash_probe({fa: statistics.median(res["tok_s"]) for fa, res in runs.items()}, "tok/s", KV_TYPE[key])
    return record | {"commands": {fa: res["command"] for fa, res in runs.items()}}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model-dir", type=pathlib.Path, default=ROOT / "bench-models/peer115m",
                    help="holds f32/ and bf16/ (make_peer_model.py)")
    ap.add_argument("--gguf-f32", type=pathlib.Path, default=None, help="default MODEL_DIR/gguf/peer115m-f32.gguf")
    ap.add_argument("--gguf-bf16", type=pathlib.Path, default=None, help="default MODEL_DIR/gguf/peer115m-bf16.gguf")
    ap.add_argument("--llama-cpp-src", type=pathlib.Path, default=None,
                    help="llama.cpp source tree, to convert missing GGUFs")
    ap.add_argument("--specfit", type=pathlib.Path, default=ROOT / "target/release/specfit")
    ap.add_argument("--prompt-ids", default="1,100,200,300,400,500,600,700")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated (first from the prefill)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=rounds_arg, default=3, help="rounds, each running every engine row once")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per engine row and round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per engine row and round")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-results/peer_decode.json")
    add_worker_arguments(ap)
    ap.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    args.prompt_ids = [int(t) for t in args.prompt_ids.split(",")]
    args.model_dir = args.model_dir.resolve()
    args.gguf_f32 = (args.gguf_f32 or args.model_dir / "gguf/peer115m-f32.gguf").resolve()
    args.gguf_bf16 = (args.gguf_bf16 or args.model_dir / "gguf/peer115m-bf16.gguf").resolve()
    if args.tokens < 2:
        raise SystemExit("--tokens must be at least 2")
    args.guard_flags = set_guard(args)

    if args.worker:
        res = llama_worker(args) if args.worker.startswith("llama") else hf_worker(args)
        print(json.dumps(res))
        return

    mark_process_tree()
    keys = [k for k in args.engines.split(",") if k]
    for k in keys:
        if k not in ENGINES:
            raise SystemExit(f"unknown engine {k}")
    # The rows of a round: (row key, engine key, llama.cpp setting). Both GGUFs are tens of MB:
    # repacking off runs with mlock.
    rows: list[tuple[str, str, dict | None]] = []
    probes = {}
    for key in keys:
        if not key.startswith("llama"):
            rows.append((key, key, None))
            continue
        ensure_gguf(args, key)
        print(f"[peer_decode] flash-attention probe, {key} ...", file=sys.stderr, flush=True)
        probes[key] = probe_flash(args, key)
        for s in llama_settings(True):
            rows.append((f"{key} ({setting_name(s)})", key, s | {"flash": probes[key]["chosen"]}))

    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {row: [] for row, _, _ in rows}
    for r in range(args.rounds):
        for row, key, cfg in rotation(rows, r):
            print(f"[peer_decode] round {r + 1}/{args.rounds}: {row} ...", file=sys.stderr, flush=True)
            t = time.perf_counter()
            res = run_row(args, key, cfg)
            runs[row].append(res)
            print(f"[peer_decode] {row}: median {statistics.median(res['tok_s']):.1f} tok/s "
                  f"({time.perf_counter() - t:.0f} s; {res['discarded_noisy_runs']} noisy runs thrown away, "
                  f"{res['waited_for_quiet_s']:.0f} s waited for quiet)", file=sys.stderr, flush=True)
    results = {row: merge_rounds(rs) for row, rs in runs.items()}
    print(f"[peer_decode] {REF_BF16} (agreement reference, once) ...", file=sys.stderr, flush=True)
    results[REF_BF16] = merge_rounds([run_worker(args, REF_BF16, reference=True)])
    engine_of = {row: key for row, key, _ in rows}
    compare(results, engine_of)

    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "model": rel(args.model_dir), "prompt_ids": args.prompt_ids, "tokens": args.tokens,
        "threads": args.threads, "rounds": args.rounds, "reps": args.reps, "warmup": args.warmup,
        "noise_guard": dict(GUARD),
        "tok_s_definition": "(tokens-1) / time of the one-token forwards after the prefill (+argmax)",
        "statistics": "median: median of the rounds' medians; min / max: the least and the largest of those "
                      "medians; best: the fastest run of all",
        "llama_flash_attention_probe": probes, "specfit_commit": specfit_commit(), "invocation": args.invocation,
        "engines": {row: describe(row, engine_of.get(row)) | v for row, v in results.items()},
    }
    write_report(args.out, report)
    print(markdown(report))
    noisy = [k for k, r in results.items() if any(x > args.max_others for x in r["others_cpu_share"])]
    if noisy:
        print(f"\nWARNING: kept runs during which other processes used > {args.max_others:.0%} of a core "
              f"(--quiet-timeout/--max-retries ran out): {', '.join(noisy)}; see others_cpu_share",
              file=sys.stderr)
    print(f"\n(written to {args.out})", file=sys.stderr)


def merge_rounds(rounds: list[dict]) -> dict:
    """One row's result over its rounds: every timed run, the median of the rounds' medians and
    their min–max, the best run; the first round's description; every round under "rounds"."""
    per_round = ("tok_s", "prefill_ms", "tokens", "deterministic", "others_cpu_share", "discarded_noisy_runs",
                 "waited_for_quiet_s", "command")
    medians = [statistics.median(r["tok_s"]) for r in rounds]
    out = {k: v for k, v in rounds[0].items() if k not in per_round}
    return out | {
        "tok_s": [x for r in rounds for x in r["tok_s"]], "prefill_ms": [x for r in rounds for x in r["prefill_ms"]],
        "round_medians": medians, "median": statistics.median(medians), "min": min(medians), "max": max(medians),
        "best": max(x for r in rounds for x in r["tok_s"]), "tokens": rounds[0]["tokens"],
        "deterministic": all(r["deterministic"] and r["tokens"] == rounds[0]["tokens"] for r in rounds),
        "others_cpu_share": [x for r in rounds for x in r["others_cpu_share"]],
        "discarded_noisy_runs": sum(r["discarded_noisy_runs"] for r in rounds),
        "waited_for_quiet_s": round(sum(r["waited_for_quiet_s"] for r in rounds), 1),
        "commands": [r["command"] for r in rounds], "rounds": rounds,
    }


def compare(results: dict[str, dict], engine_of: dict[str, str]) -> None:
    """Adds agreement (common greedy prefixes) and ratios from the medians to every row: against
    transformers f32, transformers on the bf16 checkpoint widened to f32, and the faster llama.cpp
    setting of the same weights."""
    hf = results.get("hf-f32", {}).get("tokens")
    ref_bf16 = results[REF_BF16]["tokens"]
    best = {}
    for weights in ("f32", "bf16"):
        llama = [row for row, key in engine_of.items() if key == f"llama-{weights}"]
        best[weights] = max(llama, key=lambda row: results[row]["median"], default=None)
    for row, res in results.items():
        res["agree_hf_f32"] = common_prefix(res["tokens"], hf) if hf else None
        res["agree_hf_bf16ckpt_f32"] = common_prefix(res["tokens"], ref_bf16)
        b = best.get(ENGINES[engine_of[row]][1]) if row in engine_of else None
        if b:
            res["best_llama"] = b
            res["agree_best_llama"] = common_prefix(res["tokens"], results[b]["tokens"])
            res["ratio_median"] = res["median"] / results[b]["median"]
            res["ratio_best"] = res["best"] / results[b]["best"]


def describe(row: str, key: str | None) -> dict:
    if key is None:  # the agreement reference
        return {"engine": "transformers", "weights": "bf16 (widened to f32)", "compute": "bf16 checkpoint, f32 compute"}
    engine, weights, compute = ENGINES[key]
    return {"engine": engine + row[len(key):], "weights": weights, "compute": compute}


def markdown(report: dict) -> str:
    n = report["tokens"]
    rows = [
        f"Decode tok/s at batch 1, {report['threads']} threads, {report['rounds']} rounds × {report['reps']} runs "
        f"(median of the rounds' medians, min–max of those medians), {report['machine']['cpu']}", "",
        "| engine | weights | threads | decode tok/s median (min–max) | best | × best llama.cpp, same weights "
        f"| greedy prefix = transformers f32 (of {n}) | = transformers bf16→f32 (of {n}) "
        f"| = best llama.cpp, same weights (of {n}) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in report["engines"].items():
        if key == REF_BF16:
            continue
        ratio = f"{r['ratio_median']:.2f}" if "ratio_median" in r else "–"
        agree = "–" if r["agree_hf_f32"] is None else str(r["agree_hf_f32"])
        rows.append(f"| {r['engine']} | {r['compute']} | {r['threads']} | {spread(r, '.1f')} | {r['best']:.1f} "
                    f"| {ratio} | {agree} | {r['agree_hf_bf16ckpt_f32']} | {r.get('agree_best_llama', '–')} |")
    probes = report["llama_flash_attention_probe"]
    if probes:
        rows += ["", "llama.cpp flash attention (probe, tok/s, repacking off): " + "; ".join(
            f"{key} off {p['off']:.1f}, on {p['on']:.1f} → {p['chosen']}"
            + (" (on casts the f32 KV cache to f16)" if "excluded" in p else "") for key, p in probes.items())]
    return "\n".join(rows)
