"""The one driver of every specfit-vs-llama.cpp comparison in BENCHMARKS.md, all under one protocol
(issue 22; what the protocol is: protocol.py; how to set each comparison up: tools/bench/README.md):

  decode GGUF --warm|--cold --specfit ram|S,...  plain decoding of one GGUF, e.g. the paper-scale files
                                                 (gguf_decode.py)
  full-size GGUF                                 the same on a random Qwen3-30B-A3B-shaped GGUF (gguf_decode.py)
  forward                                        verify cost: one forward of T new tokens after C cached
                                                 (forward_time.py)
  engine                                         batch-1 decode on the peer checkpoint, transformers too
                                                 (peer_decode.py)
  server                                         OpenAI-compatible servers under load (serve_load.py)
  all                                            each of the above whose inputs exist, in turn, each into
                                                 its report under bench-results/

It owns the command line and `all`; each comparison is its module's, the protocol's steps are
protocol.py's. Every report records its own command line (`invocation`) and every command it ran.

    tools/.venv/bin/python tools/bench/peer_protocol.py decode bench-models/paper/target-q4_k_m.gguf --warm --specfit ram
    tools/.venv/bin/python tools/bench/peer_protocol.py decode bench-models/paper/target-q8_0.gguf --cold --specfit 16,32,48
    tools/.venv/bin/python tools/bench/peer_protocol.py full-size bench-models/full/qwen3-30b-a3b-q8_0.gguf
    tools/.venv/bin/python tools/bench/peer_protocol.py forward
    tools/.venv/bin/python tools/bench/peer_protocol.py engine
    tools/.venv/bin/python tools/bench/peer_protocol.py server
    sudo tools/.venv/bin/python tools/bench/peer_protocol.py all     # root: the cold runs drop the page cache

`COMMAND --help` lists each one's options.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys

import forward_time
import gguf_decode
import peer_decode
import serve_load
from protocol import DRIVER, ROOT, invocation, rel, rounds_arg

LLAMA_MODULES = ["llama_cpp", "numpy"]


def add_all_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--paper", type=pathlib.Path, default=ROOT / "bench-models/paper",
                    help="the files of `specfit inflate --type q4_k_m,q8_0`")
    ap.add_argument("--full", type=pathlib.Path, default=ROOT / "bench-models/full",
                    help="the files of target/release/examples/random_qwen3moe")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=rounds_arg, default=3)
    ap.set_defaults(run=run_all)


def steps(args: argparse.Namespace) -> list[tuple[str, list[str], list[pathlib.Path], list[str]]]:
    """`all`'s runs: (what, the subcommand's arguments, the files it needs, the Python modules it needs)."""
    out = ROOT / "bench-results"
    specfit = ROOT / "target/release/specfit"
    target_gguf = ROOT / "bench-models/target-gguf"
    peer = ROOT / "bench-models/peer115m"
    runs = []
    for name, mode, configs in (("q4_k_m", "--warm", "ram"), ("q8_0", "--cold", "16,32,48")):
        gguf = args.paper / f"target-{name}.gguf"
        runs.append((f"decode, paper-scale {name}, {mode[2:]}",
                     ["decode", str(gguf), mode, "--specfit", configs,
                      "--out", str(out / f"peer_protocol.target-{name}.{mode[2:]}.json")],
                     [gguf, specfit], LLAMA_MODULES))
    for name in ("q4_k_m", "q8_0"):
        gguf = args.full / f"qwen3-30b-a3b-{name}.gguf"
        runs.append((f"full-size {name}", ["full-size", str(gguf), "--out", str(out / f"full_size.{name}.json")],
                     [gguf, specfit], LLAMA_MODULES))
    runs += [
        ("forward (verify cost)", ["forward"],
         [ROOT / "target/release/examples/forward_time", target_gguf / "target-f32.gguf",
          target_gguf / "target-bf16.gguf"], LLAMA_MODULES),
        ("engine (batch-1 decode, peer checkpoint)", ["engine"],
         [specfit, peer / "f32", peer / "bf16", peer / "gguf/peer115m-f32.gguf", peer / "gguf/peer115m-bf16.gguf"],
         LLAMA_MODULES + ["torch", "transformers"]),
        ("server (load test)", ["server"], [specfit], ["httpx"]),
    ]
    return runs


def run_all(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        print("[all] warning: not root: the cold runs cannot drop the page cache (their tables say so)",
              file=sys.stderr)
    parser = build_parser()
    common = ["--threads", str(args.threads), "--rounds", str(args.rounds)]
    done, skipped, failed = [], [], []
    for what, argv, files, modules in steps(args):
        missing = [rel(f) for f in files if not f.exists()]
        missing += [f"Python module {m}" for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            print(f"[all] skipping {what}: missing {', '.join(missing)} (tools/bench/README.md says how to "
                  "make them)", flush=True)
            skipped.append(what)
            continue
        sub = parser.parse_args(argv + common)
        sub.invocation = invocation([str(DRIVER), *argv, *common])
        print(f"[all] {what}: {sub.invocation}", flush=True)
        try:
            sub.run(sub)
            done.append(what)
        except (SystemExit, RuntimeError) as e:
            print(f"[all] {what} failed: {e}", flush=True)
            failed.append(what)
    print(f"\n[all] done: {', '.join(done) or 'none'}; skipped: {', '.join(skipped) or 'none'}; "
          f"failed: {', '.join(failed) or 'none'}")
    if failed:
        raise SystemExit(1)


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gguf_decode.add_arguments(sub.add_parser("decode", help="plain decoding of one GGUF", formatter_class=raw,
                                             description=gguf_decode.__doc__))
    gguf_decode.add_arguments(sub.add_parser("full-size", help="plain decoding of a random full-size GGUF",
                                             formatter_class=raw, description=gguf_decode.__doc__), full_size=True)
    forward_time.add_arguments(sub.add_parser("forward", help="verify cost: one forward of T tokens after C cached",
                                              formatter_class=raw, description=forward_time.__doc__))
    peer_decode.add_arguments(sub.add_parser("engine", help="batch-1 decode on the peer checkpoint",
                                             formatter_class=raw, description=peer_decode.__doc__))
    serve_load.add_arguments(sub.add_parser("server", help="OpenAI-compatible servers under load",
                                            formatter_class=raw, description=serve_load.__doc__))
    add_all_arguments(sub.add_parser("all", help="every comparison whose inputs exist", formatter_class=raw,
                                     description="Runs decode (paper-scale Q4_K_M warm, Q8_0 cold), full-size "
                                                 "(Q4_K_M-like, Q8_0), forward, engine and server in turn, each "
                                                 "into its report under bench-results/, skipping (with the "
                                                 "reason) whatever lacks an input."))
    return ap


def main() -> None:
    args = build_parser().parse_args()
    args.invocation = invocation(sys.argv)
    args.run(args)


if __name__ == "__main__":
    main()
