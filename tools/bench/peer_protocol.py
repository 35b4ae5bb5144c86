"""Plain decoding of one GGUF by llama.cpp and by specfit under one protocol (BENCHMARKS.md, "Peer
protocol"), for files that fit in RAM (warm: the file is read into the page cache before every
run) and files larger than RAM (cold: the page cache is dropped before every run).

The protocol:
- the same compute threads: llama.cpp `n_threads` = `n_threads_batch` = `SPECFIT_THREADS` = T
  (specfit also runs `SPECFIT_IO_THREADS` expert-read threads, default 8, which mostly wait on
  the disk; they are reported);
- the same tokens: the prompt is tokenized once (llama.cpp's tokenizer, the file's own) and
  both engines decode greedily from those ids for the same number of tokens (end of text
  ignored); the script reports whether the token sequences agree;
- llama.cpp at its best on this machine: weight repacking (`use_extra_bufts`) on and off, both
  reported; `mlock` (load mode mmap+mlock) when the file fits in memory; flash attention chosen
  per file by a probe run of each setting, the faster one kept (the probe is reported);
- at least 3 alternating rounds (each round runs every engine once, the order rotating), median
  and min–max per engine, ratios from the medians;
- the page cache is dropped before each cold run; a run that cannot drop it says so in the
  report (`caches_dropped: false`) and on stderr; memory is each process's peak RSS plus the
  pages of the model file it left in the page cache (`fincore`), not RSS alone;
- every command is recorded in the JSON.

    tools/.venv/bin/python tools/bench/peer_protocol.py bench-models/paper/target-q4_k_m.gguf --warm --specfit ram
    tools/.venv/bin/python tools/bench/peer_protocol.py bench-models/paper/target-q8_0.gguf --cold --specfit 16,32,48

`--specfit` lists specfit's configurations: `ram` (experts used in place from the mapped file)
or a slot count (disk tier, experts streamed from the file into that many slots per layer).
Decode tok/s is specfit's definition for both: the first token comes from the prefill, then
`tokens − 1` one-token forwards are timed.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

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
cp = L.llama_context_default_params(); cp.n_ctx = 2048; cp.n_batch = 512; cp.n_ubatch = 512
cp.n_threads = cp.n_threads_batch = cfg["threads"]
cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg["flash"] else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = L.llama_init_from_model(m, cp)
n_vocab = L.llama_vocab_n_tokens(vocab)
prompt = cfg["ids"]; n = cfg["tokens"]
b = L.llama_batch_init(max(len(prompt), 1), 0, 1)
def run(toks, pos0):
    for i, t in enumerate(toks):
        b.token[i] = t; b.pos[i] = pos0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0
        b.logits[i] = 1 if i == len(toks) - 1 else 0
    b.n_tokens = len(toks)
    assert L.llama_decode(ctx, b) == 0
    z = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
    return int(np.argmax(z))
nxt = run(prompt, 0); ttft = time.time() - t0
toks = [nxt]; t = time.time()
for s in range(n - 1):
    nxt = run([nxt], len(prompt) + s); toks.append(nxt)
print("RESULT", ttft, (n - 1) / (time.time() - t), ",".join(map(str, toks)), flush=True)
'''


def meminfo(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+)", pathlib.Path("/proc/meminfo").read_text()).group(1)) * 1024


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def warm(path: pathlib.Path) -> None:
    """Reads the file once so that its pages are in the page cache."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def cached_bytes(path: pathlib.Path) -> int:
    """Bytes of `path` in the page cache (util-linux fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True)
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return -1


def watch(proc: subprocess.Popen, stats: dict) -> None:
    while proc.poll() is None:
        try:
            io = pathlib.Path(f"/proc/{proc.pid}/io").read_text()
            st = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
            stats["read_bytes"] = int(re.search(r"read_bytes: (\d+)", io).group(1))
            stats["hwm_kb"] = int(re.search(r"VmHWM:\s+(\d+)", st).group(1))
        except (OSError, AttributeError):
            pass
        time.sleep(0.2)


def execute(cmd: list[str], env: dict | None = None) -> tuple[str, dict, float]:
    stats: dict = {}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    th = threading.Thread(target=watch, args=(proc, stats))
    th.start()
    out, _ = proc.communicate()
    th.join()
    if proc.returncode != 0:
        why = "killed (-9: out of memory?)" if proc.returncode == -9 else f"exit {proc.returncode}"
        raise RuntimeError(f"{cmd[0]} {why}: {out[-1500:]}")
    return out, stats, time.time() - t0


def llama_cmd(cfg: dict) -> list[str]:
    return [sys.executable, "-c", LLAMA, json.dumps(cfg)]


def run_llama(cfg: dict) -> dict:
    t0 = time.time()
    out, st, wall = execute(llama_cmd(cfg) + [str(t0)])
    _, ttft, tps, toks = next(l for l in out.splitlines() if l.startswith("RESULT")).split()
    return {"tok_s": float(tps), "ttft_s": float(ttft), "tokens": toks, "stats": st, "wall_s": wall}


def run_specfit(gguf: pathlib.Path, config: str, ids: list[int], tokens: int, threads: int) -> dict:
    store = ["--store", "ram"] if config == "ram" else ["--store", "disk", "--slots", config]
    cmd = [str(ROOT / "target/release/specfit"), "generate", "--model", str(gguf), *store,
           "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(tokens), "--ignore-eos"]
    env = dict(os.environ, SPECFIT_THREADS=str(threads))
    out, st, wall = execute(cmd, env)
    m = re.search(r"(\d+) tokens, ([\d.]+) tok/s decode; prefill (\d+) tokens in ([\d.]+) ms", out)
    toks = next((l for l in out.splitlines() if re.fullmatch(r"[\d,]+", l.strip())), "").strip()
    tps = float(m.group(2))
    ttft = wall - (int(m.group(1)) - 1) / tps if tps > 0 else wall
    return {"tok_s": tps, "ttft_s": ttft, "tokens": toks, "stats": st, "wall_s": wall,
            "command": " ".join(cmd), "log": out[-500:]}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", type=pathlib.Path)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--warm", action="store_true", help="the file is read into the page cache before every run")
    mode.add_argument("--cold", action="store_true", help="the page cache is dropped before every run")
    ap.add_argument("--specfit", default="ram", help="comma-separated: ram, or slot counts (disk tier)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", default="<|im_start|>user\nQuestion: Janet's ducks lay 16 eggs per day. She eats three "
                    "for breakfast every morning and bakes muffins for her friends every day with four. She sells the "
                    "remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make "
                    "every day at the farmers' market?<|im_end|>\n<|im_start|>assistant\n")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-results" / "peer_protocol.json")
    args = ap.parse_args()
    assert args.rounds >= 3, "the protocol takes at least 3 rounds"
    size = args.gguf.stat().st_size
    fits = size < meminfo("MemAvailable") * 0.9
    base = {"gguf": str(args.gguf), "threads": args.threads, "tokens": args.tokens}
    out, _, _ = execute(llama_cmd({**base, "repack": False, "mlock": False, "tokenize": args.prompt}) + ["0"])
    ids = [int(x) for x in next(l for l in out.splitlines() if l.startswith("IDS")).split()[1].split(",")]

    def prepare() -> bool:
        if args.cold:
            ok = drop_caches()
            if not ok:
                print("warning: cannot drop the page cache (not root?): this cold run starts warm", file=sys.stderr)
            return ok
        warm(args.gguf)
        return True

    # Flash attention: one probe run of each setting (repacking off), the faster kept.
    probes = {}
    for flash in (False, True):
        prepare()
        cfg = {**base, "ids": ids, "repack": False, "mlock": False, "flash": flash,
               "tokens": min(args.tokens, 16)}
        probes[flash] = run_llama(cfg)["tok_s"]
    flash = probes[True] > probes[False]
    engines: list[tuple[str, dict]] = []
    skipped = []
    for repack in (True, False):
        # mlock keeps the mapped file resident; with repacking the weights are copied out of it
        # (a second copy in anonymous memory), so mlock then only doubles the footprint.
        cfg = {**base, "ids": ids, "repack": repack, "mlock": fits and args.warm and not repack, "flash": flash}
        name = f"llama.cpp (repack {'on' if repack else 'off'}{', mlock' if cfg['mlock'] else ''})"
        if repack and not fits:
            # Repacking copies the weights into anonymous memory: a file larger than memory
            # cannot be repacked, and the attempt ends in the kernel's OOM killer.
            skipped.append({"engine": name, "skipped": "weight repacking copies the weights into anonymous "
                            f"memory; the file ({size / 1e9:.1f} GB) is larger than the available memory"})
            continue
        engines.append((name, cfg))
    for c in args.specfit.split(","):
        engines.append((f"specfit ({'mapped in place' if c == 'ram' else c + ' slots, disk tier'})", {"specfit": c}))
    runs: dict[str, list[dict]] = {name: [] for name, _ in engines}
    for r in range(args.rounds):
        for k in range(len(engines)):
            name, cfg = engines[(k + r) % len(engines)]
            dropped = prepare()
            before = cached_bytes(args.gguf)
            try:
                res = (run_specfit(args.gguf, cfg["specfit"], ids, args.tokens, args.threads) if "specfit" in cfg
                       else run_llama(cfg))
            except RuntimeError as e:
                print(f"round {r} {name}: failed: {str(e)[:200]}", flush=True)
                runs[name].append({"round": r, "failed": str(e)[-600:], "caches_dropped": dropped})
                continue
            res.update({"round": r, "caches_dropped": dropped, "file_cached_before": before,
                        "file_cached_after": cached_bytes(args.gguf)})
            if "specfit" not in cfg:
                res["command"] = " ".join(llama_cmd(cfg)[:2]) + " <LLAMA script> " + json.dumps(cfg)
            runs[name].append(res)
            print(f"round {r} {name}: {res['tok_s']:.2f} tok/s", flush=True)
    ok = {name: [x for x in rs if "failed" not in x] for name, rs in runs.items()}
    reference = next((rs[0]["tokens"] for name, rs in ok.items() if rs and name.startswith("llama")), None)
    table = list(skipped)
    for name, _ in engines:
        rs = ok[name]
        if not rs:
            table.append({"engine": name, "failed": runs[name][0]["failed"][:300]})
            continue
        row = {"engine": name, "tok_s": summary([x["tok_s"] for x in rs]),
               "ttft_s": summary([x["ttft_s"] for x in rs]),
               "peak_rss_gb": summary([x["stats"].get("hwm_kb", 0) / 1e6 for x in rs]),
               "page_cache_gb": summary([max(x["file_cached_after"], 0) / 1e9 for x in rs]),
               "read_gb": summary([x["stats"].get("read_bytes", 0) / 1e9 for x in rs]),
               "same_tokens_as_llama": all(x["tokens"] == reference for x in rs),
               "caches_dropped": all(x["caches_dropped"] for x in rs)}
        row["memory_gb_median"] = row["peak_rss_gb"]["median"] + row["page_cache_gb"]["median"]
        table.append(row)
    measured = [r for r in table if "tok_s" in r]
    best_llama = max((r for r in measured if r["engine"].startswith("llama")), key=lambda r: r["tok_s"]["median"],
                     default=None)
    for row in measured:
        row["vs_best_llama"] = row["tok_s"]["median"] / best_llama["tok_s"]["median"] if best_llama else None
    report = {"gguf": str(args.gguf), "gguf_bytes": size, "mem_total_bytes": meminfo("MemTotal"),
              "mode": "cold" if args.cold else "warm", "threads": args.threads,
              "specfit_io_threads": int(os.environ.get("SPECFIT_IO_THREADS", "8")), "tokens": args.tokens,
              "prompt_ids": ids, "flash_attention_probe_tok_s": {"off": probes[False], "on": probes[True]},
              "flash_attention": flash, "cpu": re.search(r"model name\s+:\s+(.*)", pathlib.Path("/proc/cpuinfo").read_text()).group(1),
              "table": table, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, args.out)
    print(f"\n{args.gguf.name}, {report['mode']}, {args.threads} threads, {args.tokens} greedy tokens, "
          f"flash attention {'on' if flash else 'off'} (probe: off {probes[False]:.2f}, on {probes[True]:.2f} tok/s)\n")
    print("| engine | tok/s median (min–max) | × best llama.cpp | TTFT s | peak RSS GB | + page cache GB | read GB | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        if "tok_s" not in r:
            print(f"| {r['engine']} | {'failed' if 'failed' in r else 'not run'}: {r.get('failed', r.get('skipped'))[:120]} | | | | | | |")
            continue
        t = r["tok_s"]
        print(f"| {r['engine']} | {t['median']:.2f} ({t['min']:.2f}–{t['max']:.2f}) | {r['vs_best_llama'] or 0:.2f} | "
              f"{r['ttft_s']['median']:.1f} | {r['peak_rss_gb']['median']:.1f} | {r['page_cache_gb']['median']:.1f} | "
              f"{r['read_gb']['median']:.1f} | {'yes' if r['same_tokens_as_llama'] else 'no'} |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
