"""Load test of OpenAI-compatible servers, side by side in one run (issue 15, BENCHMARKS.md).

Starts each server in turn on a free loopback port, waits until it answers, sends one untimed
warm-up request, then lets --clients concurrent streaming clients work through --requests chat
requests (GSM8K questions from data/spec_bench, greedy, max_tokens cycling through --max-tokens).
Each request is timed from the moment it is sent: time to the first content chunk (TTFT) and to
the end of the stream. Refusals (429/503) are counted, not retried.

Servers (all on the shipped target, 2 threads):
  specfit-ar        specfit serve --policy ar --store ram               (plain decoding, experts in RAM)
  specfit-specfit   specfit serve                                       (the defaults: SpecFit, disk tier, 16 of 64 slots)
  specfit-eagle3    specfit serve --policy eagle3 --store ram           (EAGLE-3 tree, experts in RAM)
  llama-server      llama.cpp's C++ server (tools/bench/build_llama_server.sh) on the f32 GGUF of
                    the same target, 2 threads, one slot (one sequence at a time, as specfit)
  llama-server-np4  the same with 4 parallel slots (continuous batching of 4 sequences)
  llama-cpp-python  python -m llama_cpp.server on the same GGUF (n_threads 2; --interrupt_requests
                    False, else each new request cuts the stream in progress)

Completion tokens come from the `usage` a stream reports; where a server reports none in streams
they are the count of content chunks (one per token). Resident memory is read
from /proc/PID/status (VmRSS after the load, VmHWM peak).

    tools/.venv/bin/python tools/bench/serve_load.py      # writes bench-results/serve_load.json

The GGUF is bench-models/target-gguf/target-f32.gguf (tools/bench/README.md, "Verify cost on CPU").
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPECFIT = ROOT / "target/release/specfit"
LLAMA_SERVER = ROOT / "bench-models/llama-server-build/bin/llama-server"
GGUF = ROOT / "bench-models/target-gguf/target-f32.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers(port: int) -> dict[str, list[str]]:
    base = [str(SPECFIT), "serve", "--host", "127.0.0.1", "--port", str(port), "--queue", "256"]
    return {
        "specfit-ar": base + ["--policy", "ar", "--store", "ram"],
        "specfit-specfit": base,
        "specfit-eagle3": base + ["--policy", "eagle3", "--store", "ram"],
        "llama-server": [str(LLAMA_SERVER), "-m", str(GGUF), "--alias", "target", "-t", "2",
                         "-tb", "2", "-c", "4096", "-np", "1", "--host", "127.0.0.1",
                         "--port", str(port)],
        "llama-server-np4": [str(LLAMA_SERVER), "-m", str(GGUF), "--alias", "target", "-t", "2",
                             "-tb", "2", "-c", "16384", "-np", "4", "--host", "127.0.0.1",
                             "--port", str(port)],
        "llama-cpp-python": [sys.executable, "-m", "llama_cpp.server", "--model", str(GGUF),
                      "--model_alias", "target", "--n_threads", "2", "--n_threads_batch", "2",
                      "--n_ctx", "4096", "--interrupt_requests", "False", "--host", "127.0.0.1", "--port", str(port)],
    }


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


async def one(client: httpx.AsyncClient, url: str, question: str, max_tokens: int) -> dict:
    try:
        return await stream(client, url, question, max_tokens)
    except httpx.HTTPError as e:  # a stream the server broke off
        return {"status": 0, "error": str(e)}


async def stream(client: httpx.AsyncClient, url: str, question: str, max_tokens: int) -> dict:
    body = {"model": "target", "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first = None
    chunks = 0
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
                if (c.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
    total = time.perf_counter() - start
    tokens = usage["completion_tokens"] if usage else chunks
    return {"status": 200, "ttft": first if first is not None else total, "latency": total,
            "tokens": tokens}


async def load(url: str, clients: int, work: list[tuple[str, int]]) -> tuple[list[dict], float]:
    queue: asyncio.Queue = asyncio.Queue()
    for w in work:
        queue.put_nowait(w)
    results: list[dict] = []
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker():
            while not queue.empty():
                q, n = queue.get_nowait()
                results.append(await one(client, url, q, n))
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return results, time.perf_counter() - start


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * p)] * 1e3 if xs else float("nan")


def run_server(name: str, cmd: list[str], port: int, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    log_path = pathlib.Path(args.out).with_name(f"serve_load.{name}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"{name} did not start")
            time.sleep(0.5)
        url = base + "/v1/chat/completions"
        asyncio.run(load(url, 1, [("Warm up: what is 2 + 2?", 16)]))
        idle = proc_status(proc.pid, "VmRSS")
        qs = questions(args.requests)
        sizes = [int(x) for x in args.max_tokens.split(",")]
        work = [(q, sizes[i % len(sizes)]) for i, q in enumerate(qs)]
        results, wall = asyncio.run(load(url, args.clients, work))
        ok = [r for r in results if r["status"] == 200]
        broken = [r for r in results if r["status"] == 0]
        tokens = sum(r["tokens"] for r in ok)
        row = {
            "server": name, "command": " ".join(cmd[1:] if name == "llama-cpp-python" else cmd),
            "clients": args.clients, "requests": len(results), "completed": len(ok),
            "refused": len(results) - len(ok) - len(broken), "broken": len(broken), "wall_s": wall,
            "requests_per_s": len(ok) / wall, "tokens_per_s": tokens / wall,
            "completion_tokens": tokens,
            "ttft_p50_ms": pct([r["ttft"] for r in ok], 0.5),
            "ttft_p99_ms": pct([r["ttft"] for r in ok], 0.99),
            "latency_p50_ms": pct([r["latency"] for r in ok], 0.5),
            "latency_p99_ms": pct([r["latency"] for r in ok], 0.99),
            "rss_idle_mib": idle, "rss_after_mib": proc_status(proc.pid, "VmRSS"),
            "rss_peak_mib": proc_status(proc.pid, "VmHWM"),
        }
        print(json.dumps(row), flush=True)
        return row
    finally:
        log.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", default="32,64,128", help="cycled through, one per request")
    ap.add_argument("--only", help="comma-separated server names")
    ap.add_argument("--out", default=str(ROOT / "bench-results/serve_load.json"))
    args = ap.parse_args()
    if not SPECFIT.exists():
        raise SystemExit("build first: cargo build --release")
    rows = []
    for name in servers(0):
        if args.only and name not in args.only.split(","):
            continue
        if name.startswith("llama") and not GGUF.exists():
            print(f"skipping {name}: no {GGUF}", file=sys.stderr)
            continue
        if name.startswith("llama-server") and not LLAMA_SERVER.exists():
            print(f"skipping {name}: build it with tools/bench/build_llama_server.sh", file=sys.stderr)
            continue
        port = free_port()
        rows.append(run_server(name, servers(port)[name], port, args))
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "processor": next((l.split(":", 1)[1].strip() for l in
                           pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                           if l.startswith("model name")), platform.processor()),
        "cpus": os.cpu_count(), "rows": rows,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
