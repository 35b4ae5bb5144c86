"""The training-loop steps that train_target.py and train_drafter.py share (torch).

It owns their common options (output paths, the AdamW schedule, checkpoint timing, threads,
--export-only and --bench), the warmup + cosine learning rate, the JSONL log, loading and
atomically writing a checkpoint, the AdamW optimiser, its resumption, one optimiser step, stopping
on SIGTERM/SIGINT and the export directory made afresh. It owns no model, no data, no loss and no
checkpoint or export content: each script keeps what it saves and writes.
"""

import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "out"


# ---------------------------------------------------------------- options


def add_output_arguments(p, name):
    """--ckpt-dir, --log, --export-dir and --info of the model `name`, under tools/train/out/."""
    p.add_argument("--ckpt-dir", type=Path, default=OUT / f"{name}_ckpt")
    p.add_argument("--log", type=Path, default=OUT / f"{name}_log.jsonl")
    p.add_argument("--export-dir", type=Path, default=OUT / name)
    p.add_argument("--info", type=Path, default=OUT / f"{name}_train_info.json")


def add_schedule_arguments(p, warmup, weight_decay, clip, min_lr_help=None):
    """--lr, --min-lr-ratio, --warmup, --weight-decay, --beta2 and --clip: AdamW and its schedule (lr_at)."""
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help=min_lr_help)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--weight-decay", type=float, default=weight_decay)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=clip)


def add_run_arguments(p, bench_help):
    """--ckpt-minutes, --threads, --export-only and --bench (bench_help: what --bench times)."""
    p.add_argument("--ckpt-minutes", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--export-only", action="store_true", help="export the latest checkpoint and exit")
    p.add_argument("--bench", type=int, default=0, metavar="N", help=bench_help)


def jsonable(a):
    """The parsed options as JSON values (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}


# ---------------------------------------------------------------- run


def set_threads_and_seed(a):
    """a.threads torch threads (one inter-op thread) and the torch seed a.seed."""
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)


def process_info():
    """This process's torch threads, nice level and pid, as the start record logs them."""
    return {"threads": torch.get_num_threads(), "nice": os.nice(0), "pid": os.getpid()}


def log(a, rec):
    """Prints rec, stamped with the time, as one JSON line and appends it to a.log (not on a --bench run)."""
    rec = {"t": round(time.time(), 1), **rec}
    print(json.dumps(rec), flush=True)
    if not a.bench:
        with open(a.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


def stop_flag():
    """{"flag": False}, set to True by SIGTERM or SIGINT: the loop then checkpoints and stops."""
    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


# ---------------------------------------------------------------- checkpoint


def load_state(path, bench):
    """The checkpoint at path, or None on a --bench run or where there is none."""
    if bench or not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def save_state_atomic(path, state):
    """Writes the checkpoint state to path through a temporary file, so a kill never leaves half of one."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def fresh_dir(d):
    """The directory d, emptied: removed with its contents, then made again."""
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


# ---------------------------------------------------------------- optimisation


def lr_at(step, a):
    """Learning rate of step: linear warmup over a.warmup steps, then cosine down to a.lr * a.min_lr_ratio at a.steps."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(model, a, **options):
    """AdamW at a.lr, betas (0.9, a.beta2), eps 1e-8: weight decay a.weight_decay on the matrices, none on the
    vectors (norms); options go to torch.optim.AdamW as they are."""
    groups = [
        {"params": [p for n, p in model.named_parameters() if p.ndim >= 2], "weight_decay": a.weight_decay},
        {"params": [p for n, p in model.named_parameters() if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, **options)


def resume(opt, state):
    """(step, tokens, train_seconds) to start from: zeros for a fresh run (state None); else the checkpoint's,
    with its optimiser and torch RNG states restored."""
    if state is None:
        return 0, 0, 0.0
    opt.load_state_dict(state["opt"])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["tokens"], state["train_seconds"]


def optimizer_step(model, opt, loss, lr, clip):
    """One AdamW step at learning rate lr on the gradient of loss, its norm clipped to clip; returns the norm
    before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    opt.step()
    return gnorm
