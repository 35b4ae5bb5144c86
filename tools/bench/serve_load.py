"""Server: OpenAI-compatible servers under load, `specfit serve` beside llama.cpp's servers, under
the peer protocol (protocol.py): `peer_protocol.py server` (issue 15, issue 22). This module owns
that comparison; the protocol's steps (rounds, statistics, llama.cpp's settings, page cache,
report) are protocol.py's.

Each round (--rounds, at least 3) starts every server once, the order rotating: on a free loopback
port, after reading its model files into the page cache; it waits until the server answers, sends
one untimed warm-up request, then lets --clients concurrent streaming clients work through
--requests chat requests (GSM8K questions from data/spec_bench, greedy, max_tokens cycling through
--max-tokens). Each request is timed from the moment it is sent: time to the first content chunk
(TTFT) and to the end of the stream. Refusals (429/503) are counted, not retried. Reported per
server: the median and min–max over the rounds of tok/s, req/s, TTFT p50 and latency p50; ratios
from the medians, against the best llama.cpp server.

Servers (all on the shipped target, --threads compute threads: SPECFIT_THREADS, llama-server
-t/-tb, llama-cpp-python n_threads/n_threads_batch, OMP_NUM_THREADS):
  specfit-ar        specfit serve --policy ar --store ram               (plain decoding, experts in RAM)
  specfit-specfit   specfit serve                                       (the defaults: SpecFit, disk tier, 16 of 64 slots)
  specfit-eagle3    specfit serve --policy eagle3 --store ram           (EAGLE-3 tree, experts in RAM)
  llama-server      llama.cpp's C++ server (tools/bench/build_llama_server.sh) on the bf16 GGUF of the
                    same target (the shipped target is bf16: the same weights as specfit's), one slot
                    (one sequence at a time, as specfit); two settings: weight repacking on, and
                    off (`--no-repack`) with mlock
  llama-server-np4  the same with 4 parallel slots (continuous batching of 4 sequences), both settings
  llama-cpp-python  python -m llama_cpp.server on the same GGUF (--interrupt_requests False, else each
                    new request cuts the stream in progress); its Llama class always repacks (no setting
                    for use_extra_bufts), so it runs without mlock (`--use_mlock False`: its default is on)

Flash attention: one probe round of the first llama.cpp server with `--flash-attn on` and one with
`--flash-attn off`, the faster (tok/s) kept for every llama.cpp server (llama-cpp-python:
`--flash_attn True|False`); both figures are in the JSON. The script reads `llama-server --help`
first and stops unless it lists `--flash-attn` and `--no-repack`; mlock is `--load-mode mmap+mlock`
where it lists `--load-mode` (llama.cpp replaced `--mlock` by load modes), else `--mlock`.

Agreement: every completion's text is hashed; each server's hashes are compared, request by
request, with the first round of llama-server (repack on) (else the first server run). Completion
tokens come from the `usage` a stream reports; where a server reports none in streams they are the
count of content chunks (one per token). Memory: resident memory from /proc/PID/status (VmRSS idle
after the warm-up and after the load, VmHWM peak) plus the server's model files in the page cache
after the load (`fincore`: specfit, models/target, models/drafter and the route predictor; llama.cpp,
the GGUF).

    tools/.venv/bin/python tools/bench/peer_protocol.py server    # writes bench-results/serve_load.json

The GGUF is bench-models/target-gguf/target-bf16.gguf (tools/bench/README.md, "Forward time").
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from protocol import (ROOT, cached_bytes, command_line, flash_probe, free_port, llama_settings, machine, prepare_cache,
                      rotation, rounds_arg, setting_name, specfit_commit, spread, summary, thread_env, write_report)

SPECFIT = ROOT / "target/release/specfit"
LLAMA_SERVER = ROOT / "bench-models/llama-server-build/bin/llama-server"
GGUF = ROOT / "bench-models/target-gguf/target-bf16.gguf"
PORT = "{port}"
REFERENCE = "llama-server (repack on)"


def servers(args: argparse.Namespace, flash: str, mlock: list[str]) -> dict[str, list[str]]:
    """Every server's command, PORT standing for its port."""
    host = ["--host", "127.0.0.1", "--port", PORT]
    t = str(args.threads)
    base = [str(SPECFIT), "serve", *host, "--queue", "256"]
    out = {
        "specfit-ar": base + ["--policy", "ar", "--store", "ram"],
        "specfit-specfit": base,
        "specfit-eagle3": base + ["--policy", "eagle3", "--store", "ram"],
    }
    for name, slots, ctx in (("llama-server", "1", "4096"), ("llama-server-np4", "4", "16384")):
        for s in llama_settings(True):  # the GGUF is tens of MB: it fits, mlock without repacking
            out[f"{name} ({setting_name(s)})"] = (
                [str(args.llama_server), "-m", str(args.gguf), "--alias", "target", "-t", t, "-tb", t, "-c", ctx,
                 "-np", slots, "--flash-attn", flash, *host]
                + ([] if s["repack"] else ["--no-repack"]) + (mlock if s["mlock"] else []))
    out["llama-cpp-python"] = [sys.executable, "-m", "llama_cpp.server", "--model", str(args.gguf),
                               "--model_alias", "target", "--n_threads", t, "--n_threads_batch", t,
                               "--n_ctx", "4096", "--interrupt_requests", "False", "--use_mlock", "False",
                               "--flash_attn", str(flash == "on"), *host]
    return out


def family(name: str) -> str:
    """The server without its llama.cpp setting ("llama-server (repack on)" -> "llama-server"), for --only."""
    return name.split(" (")[0]


def model_files(name: str, gguf: pathlib.Path) -> list[pathlib.Path]:
    if name.startswith("llama"):
        return [gguf]
    dirs = [ROOT / "models/target", ROOT / "models/drafter"]
    files = (p for d in dirs for p in d.iterdir() if p.is_file() and p.suffix != ".compressed")
    return sorted(files) + [ROOT / "models/route-predictor.safetensors"]


def mlock_flag(llama_server: pathlib.Path) -> list[str]:
    """llama-server's spelling of mmap + mlock, after checking that its --help lists the flags used."""
    text = subprocess.run([str(llama_server), "--help"], capture_output=True, text=True).stdout
    for flag in ("--flash-attn", "--no-repack"):
        if flag not in text:
            raise SystemExit(f"{llama_server} --help lists no {flag}: check the spelling in its common/arg.cpp")
    return ["--load-mode", "mmap+mlock"] if "--load-mode" in text else ["--mlock"]


def proc_status(pid: int, key: str) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # kB -> MiB
    return 0.0


def questions(n: int) -> list[str]:
    path = ROOT / "data/spec_bench/math_reasoning.jsonl"
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line)["turns"][0])
    return [out[i % len(out)] for i in range(n)]


async def one(client, url: str, question: str, max_tokens: int) -> dict:
    import httpx

    try:
        return await stream(client, url, question, max_tokens)
    except httpx.HTTPError as e:  # a stream the server broke off
        return {"status": 0, "error": str(e)}


async def stream(client, url: str, question: str, max_tokens: int) -> dict:
    body = {"model": "target", "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first = None
    text: list[str] = []
    usage = None
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"status": r.status_code}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            v = json.loads(line[6:])
            usage = v.get("usage") or usage
            for c in v.get("choices", []):
                content = (c.get("delta") or {}).get("content")
                if content:
                    text.append(content)
                    if first is None:
                        first = time.perf_counter() - start
    total = time.perf_counter() - start
    tokens = usage["completion_tokens"] if usage else len(text)
    return {"status": 200, "ttft": first if first is not None else total, "latency": total,
            "tokens": tokens, "sha1": hashlib.sha1("".join(text).encode()).hexdigest()[:16]}


async def load(url: str, clients: int, work: list[tuple[str, int]]) -> tuple[list[dict], float]:
    """The clients work through the requests; the results come back in request order."""
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for i, w in enumerate(work):
        queue.put_nowait((i, *w))
    results: list[dict] = [{} for _ in work]
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker():
            while not queue.empty():
                i, q, n = queue.get_nowait()
                results[i] = await one(client, url, q, n)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return results, time.perf_counter() - start


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * p)] * 1e3 if xs else float("nan")


def wait_ready(name: str, proc: subprocess.Popen, base: str, log_path: pathlib.Path) -> None:
    import httpx

    deadline = time.time() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{name} did not start")
        time.sleep(0.5)


def run_server(name: str, cmd: list[str], args: argparse.Namespace, r: int) -> dict:
    """One server, one round: start it warm, warm it up, the load, its figures."""
    port = free_port()
    cmd = [str(port) if a == PORT else a for a in cmd]
    files = model_files(name, args.gguf)
    prepare_cache(files, cold=False)
    env = thread_env(args.threads)
    slug = re.sub(r"[^\w.-]+", "_", name).strip("_")
    log_path = args.out.with_name(f"serve_load.{slug}.log")  # the last round's
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ | env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(name, proc, base, log_path)
        url = base + "/v1/chat/completions"
        asyncio.run(load(url, 1, [("Warm up: what is 2 + 2?", 16)]))
        idle = proc_status(proc.pid, "VmRSS")
        sizes = [int(x) for x in args.max_tokens.split(",")]
        work = [(q, sizes[i % len(sizes)]) for i, q in enumerate(questions(args.requests))]
        results, wall = asyncio.run(load(url, args.clients, work))
        ok = [x for x in results if x["status"] == 200]
        broken = [x for x in results if x["status"] == 0]
        tokens = sum(x["tokens"] for x in ok)
        row = {
            "server": name, "round": r, "command": command_line(cmd, env),
            "clients": args.clients, "requests": len(results), "completed": len(ok),
            "refused": len(results) - len(ok) - len(broken), "broken": len(broken), "wall_s": wall,
            "requests_per_s": len(ok) / wall, "tokens_per_s": tokens / wall,
            "completion_tokens": tokens,
            "ttft_p50_ms": pct([x["ttft"] for x in ok], 0.5),
            "ttft_p99_ms": pct([x["ttft"] for x in ok], 0.99),
            "latency_p50_ms": pct([x["latency"] for x in ok], 0.5),
            "latency_p99_ms": pct([x["latency"] for x in ok], 0.99),
            "rss_idle_mib": idle, "rss_after_mib": proc_status(proc.pid, "VmRSS"),
            "rss_peak_mib": proc_status(proc.pid, "VmHWM"),
            "page_cache_mib": sum(max(cached_bytes(f), 0) for f in files) / 2**20,
            "outputs_sha1": [x.get("sha1") for x in results], "log": str(log_path),
        }
        print(json.dumps({k: v for k, v in row.items() if k != "outputs_sha1"}), flush=True)
        return row
    finally:
        log.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def available(args: argparse.Namespace) -> list[str]:
    """The servers to run: --only, and what is built and converted."""
    names = []
    for name in servers(args, "off", []):
        if args.only and name not in args.only.split(",") and family(name) not in args.only.split(","):
            continue
        if name.startswith("llama") and not args.gguf.exists():
            print(f"skipping {name}: no {args.gguf} (tools/bench/README.md, \"Forward time\")", file=sys.stderr)
            continue
        if name.startswith("llama-server") and not args.llama_server.exists():
            print(f"skipping {name}: build it with tools/bench/build_llama_server.sh", file=sys.stderr)
            continue
        names.append(name)
    return names


def probe_flash(args: argparse.Namespace, name: str, mlock: list[str]) -> dict:
    """One load of the server with flash attention off and one with it on; the faster kept."""
    rows = {fa: run_server(name, servers(args, fa, mlock)[name], args, -1) for fa in ("off", "on")}
    return (flash_probe({fa: x["tokens_per_s"] for fa, x in rows.items()}, "tok/s", "f16")
            | {"server": name, "commands": {fa: x["command"] for fa, x in rows.items()}})


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", default="32,64,128", help="cycled through, one per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=rounds_arg, default=3, help="rounds, each starting every server once")
    ap.add_argument("--only", help="comma-separated server names (a name without its setting, e.g. "
                    "llama-server, stands for both settings)")
    ap.add_argument("--gguf", type=pathlib.Path, default=GGUF)
    ap.add_argument("--llama-server", type=pathlib.Path, default=LLAMA_SERVER)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-results/serve_load.json")
    ap.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    if not SPECFIT.exists():
        raise SystemExit("build first: cargo build --release")
    names = available(args)
    if not names:
        raise SystemExit("no server to run")
    llama = [n for n in names if n.startswith("llama")]
    mlock = mlock_flag(args.llama_server) if any(n.startswith("llama-server") for n in llama) else []
    probe = probe_flash(args, llama[0], mlock) if llama else None
    flash = probe["chosen"] if probe else "off"
    commands = servers(args, flash, mlock)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in rotation(names, r):
            print(f"[serve_load] round {r + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            runs[name].append(run_server(name, commands[name], args, r))
    reference = REFERENCE if REFERENCE in runs else next(iter(runs))
    rows = [aggregate(name, rs, runs[reference][0]["outputs_sha1"]) for name, rs in runs.items()]
    best = max((x for x in rows if x["server"].startswith("llama")), key=lambda x: x["tokens_per_s"]["median"],
               default=None)
    for x in rows:
        x["vs_best_llama"] = x["tokens_per_s"]["median"] / best["tokens_per_s"]["median"] if best else None
    m = machine()
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "processor": m["cpu"], "cpus": m["cores"], "machine": m, "threads": args.threads,
        "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens, "rounds": args.rounds,
        "gguf": str(args.gguf), "flash_attention_probe": probe, "flash_attention": flash,
        "llama_server_mlock_flag": mlock, "best_llama": best["server"] if best else None,
        "outputs_reference": reference, "specfit_commit": specfit_commit(), "invocation": args.invocation,
        "rows": rows,
    }
    write_report(args.out, report)
    print(markdown(report))
    print(f"-> {args.out}")


def aggregate(name: str, rs: list[dict], reference: list[str | None]) -> dict:
    """One server's figures over its rounds: median and min–max; agreement with the reference's
    first round, request by request."""
    same = [sum(a == b and a is not None for a, b in zip(x["outputs_sha1"], reference)) for x in rs]
    out = {"server": name, "command": rs[0]["command"]}
    for key in ("tokens_per_s", "requests_per_s", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms",
                "latency_p99_ms", "rss_idle_mib", "rss_peak_mib", "page_cache_mib"):
        out[key] = summary([x[key] for x in rs])
    out["memory_mib_median"] = out["rss_peak_mib"]["median"] + out["page_cache_mib"]["median"]
    return out | {
        "completed": [x["completed"] for x in rs], "requests": rs[0]["requests"],
        "completion_tokens": [x["completion_tokens"] for x in rs],
        "same_outputs_as_reference": same,
        "deterministic": all(x["outputs_sha1"] == rs[0]["outputs_sha1"] for x in rs),
        "rounds": rs,
    }


def markdown(report: dict) -> str:
    p = report["flash_attention_probe"]
    probe = (f"flash attention {p['chosen']} (probe on {p['server']}: off {p['off']:.0f}, on {p['on']:.0f} tok/s)"
             if p else "no llama.cpp server")
    lines = [f"{report['clients']} clients, {report['requests']} requests per server and round, {report['rounds']} "
             f"rounds, {report['threads']} threads, {probe}", "",
             "| server | done | tok/s median (min–max) | × best llama.cpp | req/s | TTFT p50 ms | latency p50 ms "
             f"| peak RSS MiB | + page cache MiB | same outputs as {report['outputs_reference']} | same every round |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in report["rows"]:
        ratio = f"{x['vs_best_llama']:.2f}" if x["vs_best_llama"] else "–"
        done = "/".join(map(str, x["completed"]))
        same = "/".join(map(str, x["same_outputs_as_reference"]))
        lines.append(f"| {x['server']} | {done} of {x['requests']} | {spread(x['tokens_per_s'], '.0f')} | {ratio} "
                     f"| {spread(x['requests_per_s'])} | {spread(x['ttft_p50_ms'], '.0f')} "
                     f"| {spread(x['latency_p50_ms'], '.0f')} | {x['rss_peak_mib']['median']:.0f} "
                     f"| {x['page_cache_mib']['median']:.0f} | {same} of {x['requests']} "
                     f"| {'yes' if x['deterministic'] else 'no'} |")
    return "\n".join(lines)
