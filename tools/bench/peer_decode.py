"""Peer comparison of autoregressive decode speed at batch 1 (issue 3, BENCHMARKS.md).

One run measures, on the same random Qwen3-MoE checkpoint (tools/bench/make_peer_model.py), the
same prompt token ids and the same number of greedy tokens (eos ignored):

  transformers (torch CPU)  f32 checkpoint, f32 compute; bf16 checkpoint, bf16 compute
  llama.cpp (llama-cpp-python, low-level API)  f32 GGUF + f32 KV cache; f16 GGUF + f16 KV cache
  specfit (target/release/specfit generate)  f32 checkpoint; bf16 checkpoint

Decode tok/s counts decode only, as specfit does: the first token comes from the prefill logits,
then N-1 one-token forwards (each followed by an argmax) are timed, tok/s = (N-1) / time.
Every engine gets one untimed warm-up run, then --reps timed runs (best and median reported).
Each Python engine runs in its own subprocess (torch's and ggml's OpenMP pools never share one),
one after the other.

Agreement: the greedy sequences are compared with transformers' (length of the common prefix).
f32 rows are compared with transformers f32; bf16/f16 rows also with transformers running the bf16
checkpoint widened to f32 (what specfit's bf16 path computes exactly). With random weights small
numeric differences can flip near-ties, so this reports and does not assert.

    tools/.venv/bin/python tools/bench/peer_decode.py            # writes bench-results/peer_decode.json

GGUFs are made by tools/bench/convert_peer_gguf.py (see tools/bench/README.md); a missing one is
converted on the fly when --llama-cpp-src is given.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

# key -> (engine, weights, description of the compute)
ENGINES = {
    "hf-f32": ("transformers", "f32", "f32 checkpoint, f32 compute"),
    "hf-bf16": ("transformers", "bf16", "bf16 checkpoint, bf16 compute"),
    "llama-f32": ("llama.cpp", "f32", "f32 GGUF, f32 KV cache"),
    "llama-f16": ("llama.cpp", "f16", "f16 GGUF, f16 KV cache"),
    "specfit-f32": ("specfit", "f32", "f32 checkpoint, f32 compute"),
    "specfit-bf16": ("specfit", "bf16", "bf16 checkpoint widened exactly, f32 compute"),
}
# Agreement reference for the low-precision rows (timed once, not in the table).
REF_BF16 = "hf-bf16ckpt-f32"


# ----------------------------------------------------------------------------------------------
# workers (run in a subprocess: `peer_decode.py --worker KEY ...`, print one JSON line)


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
    gguf, kv = {"llama-f32": (args.gguf_f32, L.GGML_TYPE_F32), "llama-f16": (args.gguf_f16, L.GGML_TYPE_F16)}[
        args.worker
    ]
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(gguf).encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {gguf}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    prompt = (L.llama_token * len(args.prompt_ids))(*args.prompt_ids)

    def run() -> tuple[list[int], float, float]:
        cp = L.llama_context_default_params()
        cp.n_ctx = 512
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = 1
        cp.n_threads = args.threads
        cp.n_threads_batch = args.threads
        cp.type_k = kv
        cp.type_v = kv
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama.cpp could not create a context")

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
        "threads": args.threads,
        "kv_cache": {L.GGML_TYPE_F32: "f32", L.GGML_TYPE_F16: "f16"}[kv],
        "flash_attn": "auto (library default)",
        "gguf": str(gguf.relative_to(ROOT) if gguf.is_relative_to(ROOT) else gguf),
        "system_info": L.llama_print_system_info().decode().strip(),
        "versions": {"llama-cpp-python": L.__version__},
    }


# ----------------------------------------------------------------------------------------------
# noise guard: CPU time that other processes (not ours, nice < 19) use while a run is timed.
# On a small shared machine a compile or a test run next door makes the engines' thread pools
# collapse, so a run during which others used more than --max-others of a core is thrown away and
# retried once the machine is quiet again. A background job at nice 19 barely competes and is not
# counted, unless the scheduler's autogroups make its nice moot (see low_priority_group). Others = all busy CPU time in /proc/stat (steal included, so short-lived processes count
# too) minus this benchmark's process tree (children reaped included) minus nice-19 processes.

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot() -> tuple[int, int, dict[int, int]]:
    """(busy ticks of the machine, ticks of our process tree, ticks of each nice-19 process)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    busy = f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)
    root = int(os.environ.get("PEER_DECODE_ROOT", os.getpid()))
    stats: dict[int, tuple[int, int, int]] = {}  # pid -> (ppid, nice, utime+stime+cutime+cstime)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        x = raw[raw.rindex(")") + 2:].split()
        stats[int(d)] = (int(x[1]), int(x[16]), int(x[11]) + int(x[12]) + int(x[13]) + int(x[14]))
    ours = {root}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _, _) in stats.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                changed = True
    mine = sum(stats[p][2] for p in ours if p in stats)
    group = autogroup(root)
    idle = {p: t for p, (_, nice, t) in stats.items()
            if nice >= 19 and p not in ours and low_priority_group(autogroup(p), group)}
    return busy, mine, idle


def autogroup(pid: int) -> tuple[str, int] | None:
    """(autogroup name, autogroup nice), or None without CONFIG_SCHED_AUTOGROUP."""
    try:
        name, _, nice = open(f"/proc/{pid}/autogroup").read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def low_priority_group(theirs: tuple[str, int] | None, ours: tuple[str, int] | None) -> bool:
    # With sched_autogroup_enabled=1 a process's nice only ranks it inside its own autogroup
    # (session): a nice-19 job started from another session still gets an equal share against
    # this benchmark unless its whole autogroup is niced (echo 19 > /proc/PID/autogroup).
    if theirs is None or ours is None or not autogroup_enabled():
        return True
    return theirs[0] == ours[0] or theirs[1] >= 19


def autogroup_enabled() -> bool:
    try:
        return open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() == "1"
    except OSError:
        return False


def others_seconds(a: tuple, b: tuple) -> float:
    niced = sum(t - a[2].get(p, t) for p, t in b[2].items())
    return max(0, (b[0] - a[0]) - (b[1] - a[1]) - niced) / CLK_TCK


def wait_quiet(max_others: float, timeout: float) -> float:
    """Wait until others use < max_others of a core over one second; returns the seconds waited."""
    t0 = time.perf_counter()
    while True:
        a = cpu_snapshot()
        time.sleep(1.0)
        if others_seconds(a, cpu_snapshot()) < max_others or time.perf_counter() - t0 > timeout:
            return time.perf_counter() - t0


GUARD = {"max_others": 0.05, "quiet_timeout": 900.0, "max_retries": 20}


def timed(run, warmup: int, reps: int, n: int) -> dict:
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
    env = os.environ | {"SPECFIT_THREADS": str(args.threads)}

    def run() -> tuple[list[int], float, float]:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
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
    return res | {"threads": args.threads, "binary": binary, "command": "SPECFIT_THREADS=%d " % args.threads + " ".join(
        str(pathlib.Path(c).relative_to(ROOT)) if c.startswith(str(ROOT)) else c for c in cmd)}


# ----------------------------------------------------------------------------------------------
# driver


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_worker_subprocess(args: argparse.Namespace, key: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", key, "--model-dir", str(args.model_dir),
           "--gguf-f32", str(args.gguf_f32), "--gguf-f16", str(args.gguf_f16),
           "--prompt-ids", ",".join(map(str, args.prompt_ids)), "--tokens", str(args.tokens),
           "--threads", str(args.threads), "--max-others", str(args.max_others),
           "--quiet-timeout", str(args.quiet_timeout), "--max-retries", str(args.max_retries),
           "--reps", str(1 if key == REF_BF16 else args.reps),
           "--warmup", str(0 if key == REF_BF16 else args.warmup)]
    if args.verbose:
        cmd.append("--verbose")
    return run_json_worker(cmd, args.threads, f"worker {key}")


def run_json_worker(cmd: list[str], threads: int, what: str) -> dict:
    """Runs a worker subprocess (OpenMP limited to `threads`) and returns the JSON object it
    printed on its last stdout line."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed ({p.returncode})")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ensure_gguf(args: argparse.Namespace, path: pathlib.Path, outtype: str) -> None:
    if path.is_file():
        return
    if args.llama_cpp_src is None:
        raise SystemExit(f"{path} is missing: convert it (tools/bench/README.md) or pass --llama-cpp-src")
    subprocess.run([sys.executable, str(ROOT / "tools/bench/convert_peer_gguf.py"), "--llama-cpp",
                    str(args.llama_cpp_src), "--model", str(args.model_dir / "f32"), "--outtype", outtype,
                    "--outfile", str(path)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=pathlib.Path, default=ROOT / "bench-models/peer115m",
                    help="holds f32/ and bf16/ (make_peer_model.py)")
    ap.add_argument("--gguf-f32", type=pathlib.Path, default=None)
    ap.add_argument("--gguf-f16", type=pathlib.Path, default=None)
    ap.add_argument("--llama-cpp-src", type=pathlib.Path, default=None,
                    help="llama.cpp source tree, to convert missing GGUFs")
    ap.add_argument("--specfit", type=pathlib.Path, default=ROOT / "target/release/specfit")
    ap.add_argument("--prompt-ids", default="1,100,200,300,400,500,600,700")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated (first from the prefill)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-results/peer_decode.json")
    ap.add_argument("--max-others", type=float, default=GUARD["max_others"],
                    help="throw away a timed run during which other processes (nice < 19) used more than "
                         "this share of a core, and wait for a quiet second before each run")
    ap.add_argument("--quiet-timeout", type=float, default=GUARD["quiet_timeout"],
                    help="seconds to wait for a quiet machine before a run anyway")
    ap.add_argument("--max-retries", type=int, default=GUARD["max_retries"],
                    help="noisy runs thrown away per engine before keeping noisy ones")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.prompt_ids = [int(t) for t in args.prompt_ids.split(",")]
    args.model_dir = args.model_dir.resolve()
    args.gguf_f32 = (args.gguf_f32 or args.model_dir / "gguf/peer115m-f32.gguf").resolve()
    args.gguf_f16 = (args.gguf_f16 or args.model_dir / "gguf/peer115m-f16.gguf").resolve()
    if args.tokens < 2:
        ap.error("--tokens must be at least 2")
    GUARD.update(max_others=args.max_others, quiet_timeout=args.quiet_timeout, max_retries=args.max_retries)

    if args.worker:
        res = llama_worker(args) if args.worker.startswith("llama") else hf_worker(args)
        print(json.dumps(res))
        return

    os.environ["PEER_DECODE_ROOT"] = str(os.getpid())
    keys = [k for k in args.engines.split(",") if k]
    for k in keys:
        if k not in ENGINES:
            ap.error(f"unknown engine {k}")
    if "llama-f32" in keys:
        ensure_gguf(args, args.gguf_f32, "f32")
    if "llama-f16" in keys:
        ensure_gguf(args, args.gguf_f16, "f16")

    load_before = os.getloadavg()
    results: dict[str, dict] = {}
    for key in keys + [REF_BF16]:
        print(f"[peer_decode] {key} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        res = specfit_bench(args, key) if key.startswith("specfit") else run_worker_subprocess(args, key)
        res["best"] = max(res["tok_s"])
        res["median"] = statistics.median(res["tok_s"])
        results[key] = res
        print(f"[peer_decode] {key}: best {res['best']:.1f} tok/s, median {res['median']:.1f} "
              f"({time.perf_counter() - t:.0f} s; {res['discarded_noisy_runs']} noisy runs thrown away, "
              f"{res['waited_for_quiet_s']:.0f} s waited for quiet)", file=sys.stderr, flush=True)

    hf = results.get("hf-f32", {}).get("tokens")
    ref_bf16 = results[REF_BF16]["tokens"]
    base = results.get("llama-f32")
    for key, res in results.items():
        res["agree_hf_f32"] = common_prefix(res["tokens"], hf) if hf else None
        res["agree_hf_bf16ckpt_f32"] = common_prefix(res["tokens"], ref_bf16)
        if base:
            res["ratio_best"] = res["best"] / base["best"]
            res["ratio_median"] = res["median"] / base["median"]

    specfit_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "model": str(args.model_dir.relative_to(ROOT) if args.model_dir.is_relative_to(ROOT) else args.model_dir),
        "prompt_ids": args.prompt_ids, "tokens": args.tokens, "threads": args.threads, "reps": args.reps,
        "warmup": args.warmup, "noise_guard": dict(GUARD),
        "tok_s_definition": "(tokens-1) / time of the one-token forwards after the prefill (+argmax)",
        "specfit_commit": specfit_commit,
        "engines": {k: {"engine": ENGINES[k][0] if k in ENGINES else "transformers",
                        "weights": ENGINES[k][1] if k in ENGINES else "bf16 (widened to f32)",
                        "compute": ENGINES[k][2] if k in ENGINES else "bf16 checkpoint, f32 compute"} | v
                    for k, v in results.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(report))
    noisy = [k for k, r in results.items() if any(x > args.max_others for x in r["others_cpu_share"])]
    if noisy:
        print(f"\nWARNING: kept runs during which other processes used > {args.max_others:.0%} of a core "
              f"(--quiet-timeout/--max-retries ran out): {', '.join(noisy)}; see others_cpu_share",
              file=sys.stderr)
    print(f"\n(written to {args.out})", file=sys.stderr)


def binary_info(path: pathlib.Path) -> dict:
    """The binary actually timed (the work tree may be ahead of or behind HEAD)."""
    import hashlib

    st = path.stat()
    return {"path": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "mtime": datetime.datetime.fromtimestamp(st.st_mtime).isoformat(timespec="seconds")}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def markdown(report: dict) -> str:
    n = report["tokens"]
    rows = [
        "| engine | weights | threads | decode tok/s (best / median) | × llama.cpp f32 (best / median) "
        f"| greedy prefix = transformers f32 (of {n}) | = transformers bf16→f32 (of {n}) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, r in report["engines"].items():
        if key == REF_BF16:
            continue
        ratio = f"{r['ratio_best']:.2f} / {r['ratio_median']:.2f}" if "ratio_best" in r else "–"
        agree = "–" if r["agree_hf_f32"] is None else str(r["agree_hf_f32"])
        rows.append(f"| {r['engine']} | {r['compute']} | {r['threads']} | {r['best']:.1f} / {r['median']:.1f} "
                    f"| {ratio} | {agree} | {r['agree_hf_bf16ckpt_f32']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
