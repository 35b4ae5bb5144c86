"""Plain decoding of a full-size GGUF (random weights, Qwen3-30B-A3B shapes) by llama.cpp (mmap) and
specfit (experts streamed from the same file behind S slots per layer), one engine at a time, same
2 threads, each in a fresh process after dropping the page cache (when allowed), sampling at
temperature 1 (a random model's greedy output repeats one token, which would route every step to
the same experts): tok/s after the
first token, time to first token (process start to first token: load + prefill), bytes the process
read from disk (`/proc/PID/io` read_bytes), peak RSS (`VmHWM`).

    cargo build --release && cargo build --release -p specfit-gguf --example random_qwen3moe
    target/release/examples/random_qwen3moe q8_0 bench-models/full/qwen3-30b-a3b-q8_0.gguf
    tools/.venv/bin/python tools/bench/full_size.py bench-models/full/qwen3-30b-a3b-q8_0.gguf --slots 8,16,32,64
    tools/.venv/bin/python tools/bench/full_size.py bench-models/full/qwen3-30b-a3b-q4_k_m.gguf --slots ram,32,64

llama.cpp runs through llama-cpp-python's low-level API (the file's vocabulary is llama.cpp's "none":
ids in, logits out). specfit runs `specfit generate --prompt-ids … --ignore-eos --store disk`.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]

LLAMA = r'''
import ctypes, sys, time
import llama_cpp as L, numpy as np
t0 = float(sys.argv[2]); n = int(sys.argv[3]); prompt = [int(x) for x in sys.argv[4].split(",")]
keep = [L.llama_log_callback(lambda *_: None)]
L.llama_log_set(keep[0], ctypes.c_void_p(0)); L.llama_backend_init()
mp = L.llama_model_default_params(); mp.n_gpu_layers = 0
m = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
cp = L.llama_context_default_params(); cp.n_ctx = 512; cp.n_batch = 64; cp.n_ubatch = 64
cp.n_threads = cp.n_threads_batch = 2
ctx = L.llama_init_from_model(m, cp)
vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
b = L.llama_batch_init(64, 0, 1)
def run(toks, pos0):
    for i, t in enumerate(toks):
        b.token[i] = t; b.pos[i] = pos0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0
        b.logits[i] = 1 if i == len(toks) - 1 else 0
    b.n_tokens = len(toks)
    assert L.llama_decode(ctx, b) == 0
    z = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,)).astype(np.float64)
    p = np.exp(z - z.max()); p /= p.sum()
    return int(rng.choice(vocab, p=p))
rng = np.random.default_rng(1)
nxt = run(prompt, 0); ttft = time.time() - t0
toks = [nxt]; t = time.time()
for s in range(n - 1):
    nxt = run([nxt], len(prompt) + s); toks.append(nxt)
print("RESULT", ttft, (n - 1) / (time.time() - t), ",".join(map(str, toks)), flush=True)
'''


from peer_protocol import drop_caches, watch  # the one protocol's helpers (same folder)


def run(cmd: list[str], env: dict | None = None) -> tuple[str, dict, float]:
    stats: dict = {}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    th = threading.Thread(target=watch, args=(proc, stats)); th.start()
    out, _ = proc.communicate(); th.join()
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}):\n{out[-3000:]}")
    return out, stats, time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", type=pathlib.Path)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--slots", default="8,16,32,64", help="comma-separated slot counts; 'ram' maps the file in place")
    ap.add_argument("--engines", default="llama,specfit")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-results" / "full_size.json")
    args = ap.parse_args()
    size = args.gguf.stat().st_size
    mem = int(re.search(r"MemTotal:\s+(\d+)", pathlib.Path("/proc/meminfo").read_text()).group(1)) * 1024
    rows = []
    if "llama" in args.engines:
        dropped = drop_caches()
        t0 = time.time()
        out, st, wall = run([sys.executable, "-c", LLAMA, str(args.gguf), str(t0), str(args.tokens),
                             ",".join(map(str, PROMPT))])
        _, ttft, tps, toks = next(l for l in out.splitlines() if l.startswith("RESULT")).split()
        rows.append({"engine": "llama.cpp (mmap)", "slots": None, "tok_s": float(tps), "ttft_s": float(ttft),
                     "read_gb": st.get("read_bytes", 0) / 1e9, "peak_rss_gb": st.get("hwm_kb", 0) / 1e6,
                     "tokens": toks, "caches_dropped": dropped, "wall_s": wall})
        print(rows[-1], flush=True)
    if "specfit" in args.engines:
        for slots in args.slots.split(","):
            dropped = drop_caches()
            # "ram": the quantized experts used in place from the mapped file (no slots).
            store = ["--store", "ram"] if slots == "ram" else ["--store", "disk", "--slots", slots]
            cmd = [str(ROOT / "target/release/specfit"), "generate", "--model", str(args.gguf), *store,
                   "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens",
                   str(args.tokens), "--ignore-eos", "--temperature", "1", "--seed", "1"]
            out, st, wall = run(cmd)
            m = re.search(r"(\d+) tokens, ([\d.]+) tok/s decode; prefill (\d+) tokens in ([\d.]+) ms", out)
            toks = next((l for l in out.splitlines() if re.fullmatch(r"[\d,]+", l.strip())), "")
            engine = "specfit (mapped in place)" if slots == "ram" else "specfit (disk tier)"
            # First token: process start to the end of the prefill = wall time less the decode.
            ttft = wall - (int(m.group(1)) - 1) / float(m.group(2)) if float(m.group(2)) > 0 else wall
            rows.append({"engine": engine, "slots": None if slots == "ram" else int(slots), "tok_s": float(m.group(2)),
                         "ttft_s": ttft,
                         "prefill_ms": float(m.group(4)), "read_gb": st.get("read_bytes", 0) / 1e9,
                         "peak_rss_gb": st.get("hwm_kb", 0) / 1e6, "tokens": toks.strip(),
                         "caches_dropped": dropped, "wall_s": wall, "log": out[-600:]})
            print({k: v for k, v in rows[-1].items() if k != "log"}, flush=True)
    report = {"gguf": str(args.gguf), "gguf_bytes": size, "mem_bytes": mem, "tokens": args.tokens,
              "prompt": PROMPT, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp"); tmp.write_text(json.dumps(report, indent=1)); os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
