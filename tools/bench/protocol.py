"""The peer protocol's shared steps (issue 22; tools/bench/README.md, "Peer protocol"): what every
specfit-vs-llama.cpp comparison in tools/bench/ does the same way.

It owns the page cache (drop, warm, measure), running and watching one process, the rotating
rounds and their statistics, llama.cpp's settings under the protocol (weight repacking, mlock, the
flash-attention probe) and a model and context made under them through the low-level API, the noise
guard and the options it shares with the worker subprocesses, the machine description and writing a
report. It owns no comparison (gguf_decode.py, forward_time.py, peer_decode.py, serve_load.py) and
no command line (peer_protocol.py).

The protocol:
- the same compute threads: llama.cpp `n_threads` = `n_threads_batch` (llama-server `-t`/`-tb`)
  = `SPECFIT_THREADS`; specfit also runs `SPECFIT_IO_THREADS` expert-read threads (default 8),
  which wait on the disk; every report gives both;
- llama.cpp at its best on this machine: weight repacking (`use_extra_bufts`, llama-server
  `--no-repack` to turn it off) on and off, both reported; mlock only without repacking and only
  where the file fits in memory; flash attention by a probe run of each setting, the faster kept
  among the settings that keep the KV cache's dtype, both probe figures reported;
- the same weight dtype and the same tokens on both sides (greedy), agreement reported;
- at least 3 rounds, each running every engine once in a rotating order; median and min–max per
  engine; ratios from the medians, against the best llama.cpp setting;
- a cold run that cannot drop the page cache says so (`caches_dropped: false`, and on stderr);
  memory is peak RSS plus the model's pages the run left in the page cache (`fincore`);
- every command, complete, in the output JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(__file__).resolve().with_name("peer_protocol.py")  # the command line; workers run through it too
MIN_ROUNDS = 3


# ----------------------------------------------------------------------------------------------
# page cache


def meminfo(key: str, missing: int | None = None) -> int:
    """`/proc/meminfo`'s `key` in bytes; `missing` when the kernel has no such line (else an error).
    `FileHugePages`: the page cache's file pages in huge folios (system-wide: a mapped file in 2 MB
    folios can be mapped with 2 MB pages)."""
    found = re.search(rf"{key}:\s+(\d+)", pathlib.Path("/proc/meminfo").read_text())
    if found is None and missing is not None:
        return missing
    return int(found.group(1)) * 1024


def fits_in_memory(size: int) -> bool:
    return size < meminfo("MemAvailable") * 0.9


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
    """Bytes of `path` in the page cache (util-linux fincore); -1 when fincore cannot tell."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True)
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return -1


def prepare_cache(paths: list[pathlib.Path], cold: bool) -> bool:
    """Before a run: drop the page cache (cold) or read the files into it (warm). Returns False
    when a cold run cannot drop it, and says so on stderr."""
    if cold:
        if drop_caches():
            return True
        print("warning: cannot drop the page cache (not root?): this cold run starts warm", file=sys.stderr)
        return False
    for p in paths:
        warm(p)
    return True


# ----------------------------------------------------------------------------------------------
# one process


def watch(proc: subprocess.Popen, stats: dict) -> None:
    """Samples the process's disk reads and peak RSS until it exits."""
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
    """Runs cmd to the end (stdout and stderr together), watched; raises RuntimeError if it fails."""
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


def thread_env(threads: int) -> dict[str, str]:
    """The environment that pins both engines to `threads` compute threads."""
    return {"SPECFIT_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}


def command_line(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """The complete command as a shell would run it: environment, program, arguments."""
    return shlex.join([f"{k}={v}" for k, v in (env or {}).items()] + [rel(c) for c in cmd])


def run_json_worker(cmd: list[str], threads: int, what: str) -> dict:
    """Runs a worker subprocess (OpenMP limited to `threads`) and returns the JSON object it
    printed on its last stdout line, with the command under "command"."""
    env = thread_env(threads)
    p = subprocess.run(cmd, env=os.environ | env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed ({p.returncode})")
    return json.loads(p.stdout.strip().splitlines()[-1]) | {"command": command_line(cmd, env)}


# ----------------------------------------------------------------------------------------------
# rounds and statistics


def rounds_arg(value: str) -> int:
    n = int(value)
    if n < MIN_ROUNDS:
        raise argparse.ArgumentTypeError(f"the protocol takes at least {MIN_ROUNDS} rounds")
    return n


def rotation(items: list, r: int) -> list:
    """Round r's order: every item once, starting r places further than round 0."""
    return [items[(k + r) % len(items)] for k in range(len(items))]


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def spread(s: dict, fmt: str = ".2f") -> str:
    """A summary as the tables print it: median (min–max)."""
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}–{s['max']:{fmt}})"


# ----------------------------------------------------------------------------------------------
# llama.cpp's settings


def llama_settings(fits: bool) -> list[dict]:
    """llama.cpp's two settings: weight repacking on (the library's default) and off, mlock with
    the latter where the file fits in memory. Never both: repacking copies the weights out of the
    mapped file into anonymous memory, so mlock then pins a second copy of the model (that pair
    was killed by the OOM killer on a 23.5 GiB machine)."""
    return [{"repack": True, "mlock": False}, {"repack": False, "mlock": fits}]


def setting_name(setting: dict) -> str:
    return f"repack {'on' if setting['repack'] else 'off'}{', mlock' if setting['mlock'] else ''}"


def llama_model(gguf: pathlib.Path, setting: dict):
    """`gguf` loaded on the CPU through llama-cpp-python's low-level API under one of
    llama_settings (weight repacking, mlock); SystemExit where llama.cpp cannot load it."""
    import llama_cpp as L

    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = setting["repack"]
    mp.load_mode = L.LLAMA_LOAD_MODE_MMAP_MLOCK if setting["mlock"] else L.LLAMA_LOAD_MODE_MMAP
    model = L.llama_model_load_from_file(str(gguf).encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {gguf}")
    return model


def llama_context(model, n_ctx: int, threads: int, kv_cache: str, flash: str):
    """A context on a llama_model, and its parameters: n_ctx positions, batches of 512 tokens
    (`n_batch` = `n_ubatch`), one sequence, `threads` threads for single tokens and batches alike
    (`n_threads` = `n_threads_batch`), a `kv_cache` ("f32" or "f16") KV cache and flash attention
    `flash` ("auto", "on" or "off"); SystemExit where llama.cpp cannot make it."""
    import llama_cpp as L

    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_seq_max = 1
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.type_k = cp.type_v = {"f32": L.GGML_TYPE_F32, "f16": L.GGML_TYPE_F16}[kv_cache]
    cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    return ctx, cp


def convert_gguf(path: pathlib.Path, model: pathlib.Path, dtype: str, llama_cpp_src: pathlib.Path | None,
                 how: str, tokenizer_pre: str | None = None) -> None:
    """Converts the checkpoint `model` to the GGUF `path` (`dtype` weights) with llama.cpp's own
    converter (convert_peer_gguf.py), unless `path` exists; without a source tree it stops and
    says how to make the file (`how`)."""
    if path.is_file():
        return
    if llama_cpp_src is None:
        raise SystemExit(f"{path} is missing: convert it ({how}) or pass --llama-cpp-src")
    pre = ["--tokenizer-pre", tokenizer_pre] if tokenizer_pre else []
    subprocess.run([sys.executable, str(ROOT / "tools/bench/convert_peer_gguf.py"), "--llama-cpp", str(llama_cpp_src),
                    "--model", str(model), *pre, "--outtype", dtype, "--outfile", str(path)], check=True)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flash_probe(figures: dict[str, float], unit: str, kv_cache: str) -> dict:
    """The record of a flash-attention probe: both figures ("off", "on") and the setting kept,
    the faster of those that keep the KV cache's dtype. With flash attention on, llama.cpp casts
    an f32 KV cache to f16 in every forward (src/llama-graph.cpp, build_attn_mha), so an f32 cache
    keeps only "off"."""
    allowed = ["off"] if kv_cache == "f32" else ["off", "on"]
    faster = min if unit.startswith("ms") else max
    record = {"unit": unit, "kv_cache": kv_cache, **figures, "chosen": faster(allowed, key=figures.__getitem__)}
    if kv_cache == "f32":
        record["excluded"] = {"on": "casts the f32 KV cache to f16: not the same dtype"}
    return record


# ----------------------------------------------------------------------------------------------
# noise guard: CPU time that other processes (not ours, nice < 19) use while a run is timed.
# On a small shared machine a compile or a test run next door makes the engines' thread pools
# collapse, so a run during which others used more than --max-others of a core is thrown away and
# retried once the machine is quiet again. A background job at nice 19 barely competes and is not
# counted, unless the scheduler's autogroups make its nice moot (see low_priority_group). Others =
# all busy CPU time in /proc/stat (steal included, so short-lived processes count too) minus this
# benchmark's process tree (children reaped included) minus nice-19 processes.

CLK_TCK = os.sysconf("SC_CLK_TCK")
GUARD = {"max_others": 0.05, "quiet_timeout": 900.0, "max_retries": 20}


def add_guard_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--max-others", type=float, default=GUARD["max_others"],
                    help="repeat a measurement during which other processes (nice < 19) used more than this "
                         "share of a core, and wait for a quiet second before each")
    ap.add_argument("--quiet-timeout", type=float, default=GUARD["quiet_timeout"],
                    help="seconds to wait for a quiet machine before measuring anyway")
    ap.add_argument("--max-retries", type=int, default=GUARD["max_retries"],
                    help="noisy measurements thrown away before keeping a noisy one")


def add_worker_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of a comparison whose engines run in worker subprocesses: the guard's, --verbose
    (llama.cpp's log on stderr) and the hidden --worker and --worker-config a worker is started with."""
    add_guard_arguments(ap)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-config", default=None, help=argparse.SUPPRESS)


def set_guard(args: argparse.Namespace) -> list[str]:
    """Applies the guard's flags; returns them, for a worker subprocess."""
    GUARD.update(max_others=args.max_others, quiet_timeout=args.quiet_timeout, max_retries=args.max_retries)
    return ["--max-others", str(args.max_others), "--quiet-timeout", str(args.quiet_timeout),
            "--max-retries", str(args.max_retries)]


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


def mark_process_tree() -> None:
    """Makes this process the root of "our process tree" for the guard (its workers inherit it)."""
    os.environ["PEER_DECODE_ROOT"] = str(os.getpid())


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


def guarded(block) -> tuple[object, dict]:
    """Run block() after a quiet second; run it again while others used > --max-others of a core."""
    discarded, waited = 0, 0.0
    while True:
        waited += wait_quiet(GUARD["max_others"], GUARD["quiet_timeout"])
        before, t0 = cpu_snapshot(), time.perf_counter()
        out = block()
        share = others_seconds(before, cpu_snapshot()) / (time.perf_counter() - t0)
        if share <= GUARD["max_others"] or discarded >= GUARD["max_retries"]:
            return out, {"others_cpu_share": round(share, 4), "discarded_noisy_runs": discarded,
                         "waited_for_quiet_s": round(waited, 1)}
        discarded += 1


# ----------------------------------------------------------------------------------------------
# machine and report


def rel(p: str | pathlib.Path) -> str:
    """A path under the repository relative to it; anything else unchanged."""
    path = pathlib.Path(p)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(p)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_id() -> dict:
    """/proc/cpuinfo's family, model and stepping (the model name alone can be as vague as "AMD EPYC")."""
    out = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "cpu family", "model", "stepping") and key not in out:
                out[key] = value.strip()
            if not line.strip():
                break
    except OSError:
        pass
    return out


def machine() -> dict:
    """What the numbers ran on, and what limits the protocol's choices (memory, mlock, root)."""
    return {"cpu": cpu_model(), "cpu_id": cpu_id(), "cores": os.cpu_count(), "python": platform.python_version(),
            "mem_total_bytes": meminfo("MemTotal"), "mem_available_bytes": meminfo("MemAvailable"),
            "memlock_limit_bytes": resource.getrlimit(resource.RLIMIT_MEMLOCK)[0], "root": os.geteuid() == 0,
            "specfit_io_threads": int(os.environ.get("SPECFIT_IO_THREADS", "8"))}


def binary_info(path: pathlib.Path) -> dict:
    """The binary actually timed (the work tree may be ahead of or behind HEAD)."""
    import hashlib

    st = path.stat()
    return {"path": rel(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "mtime": datetime.datetime.fromtimestamp(st.st_mtime).isoformat(timespec="seconds")}


def specfit_commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def invocation(argv: list[str]) -> str:
    """The command line of a run of this Python on argv (a script and its arguments)."""
    return command_line([sys.executable, *argv])


def write_report(path: pathlib.Path, report: dict) -> None:
    """Writes the JSON atomically (a temporary file, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, path)
