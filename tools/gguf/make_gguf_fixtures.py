"""GGUF fixtures made by llama.cpp itself, and what llama.cpp, gguf-py and transformers compute on them.

A tiny random Qwen3-MoE (2 layers, hidden 256, 4 heads x 64, 2 kv heads, 8 experts top-2,
moe_intermediate 128, tied embeddings, the shipped target's 4,096-token byte-level BPE tokenizer)
is built with transformers, converted to an f32 GGUF with llama.cpp's own `convert_hf_to_gguf.py`
(tools/bench/convert_peer_gguf.py --tokenizer-pre qwen2) and quantized with llama.cpp's own
quantizer (`llama_model_quantize`) to Q8_0, Q4_0 and Q4_K_M. Hidden 256 makes the attention and
expert gate/up rows whole k-quant super-blocks; expert down rows (128) are not, so Q4_K_M also
holds llama.cpp's fallback types for them. For each quantized file the script records, in
fixtures/gguf/<name>.reference.json:

* per tensor: type, shape and the sha256 of gguf-py's dequantization (`gguf.quants.dequantize`,
  f32 little-endian) plus its first values — the Rust dequantizer must match it bit for bit;
* llama.cpp's logits (llama-cpp-python low-level API, 1 thread, f32 KV cache) for every position
  of two prompts, and its greedy continuation of each;
* transformers' logits on the same two prompts with the *dequantized* weights loaded into
  `Qwen3MoeForCausalLM` (f32, eager attention): the exact-arithmetic reference for specfit's f32
  forward on the file, plus its routes (top-2 experts per token and layer) and greedy tokens.

Run from the repository root (about 30 s; needs tools/.venv with llama-cpp-python, see
tools/bench/README.md):

    SRC=$(tools/bench/fetch_llama_cpp_src.sh)
    tools/.venv/bin/python tools/gguf/make_gguf_fixtures.py --llama-cpp "$SRC"
"""
import argparse
import ctypes
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "fixtures" / "gguf"
QUANTS = {"q8_0": 7, "q4_0": 2, "q4_k_m": 15}  # llama_ftype ids (LLAMA_FTYPE_MOSTLY_*)
PROMPTS = [
    "Natalia sold clips to 48 of her friends in April.",
    "The quick brown fox jumps over the lazy dog, and then",
]
CONTINUE = 8
_KEEP = []  # ctypes callbacks must outlive every call into llama.cpp


def build_hf(dst: pathlib.Path) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=0.05,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # spread the router so routing is not degenerate
            layer.mlp.gate.weight.mul_(8.0)
    model.save_pretrained(dst, safe_serialization=True)
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(ROOT / "models" / "target" / name, dst / name)


def quiet_llama() -> None:
    import llama_cpp as L

    _KEEP.append(L.llama_log_callback(lambda *_: None))
    L.llama_log_set(_KEEP[-1], ctypes.c_void_p(0))
    L.llama_backend_init()


def quantize(src: pathlib.Path, dst: pathlib.Path, ftype: int) -> None:
    import llama_cpp as L

    p = L.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc}) for {dst}")


def dequant_table(path: pathlib.Path) -> tuple[list[dict], dict]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(path)
    rows, values = [], {}
    for t in r.tensors:
        deq = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        dims = [int(d) for d in t.shape]  # ggml order, row length first
        values[t.name] = deq.reshape(list(reversed(dims)))
        rows.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": dims,
            "sha256": hashlib.sha256(deq.astype("<f4").tobytes()).hexdigest(),
            "head": [float(v) for v in deq.reshape(-1)[:8]],
        })
    return rows, values


def llama_run(path: pathlib.Path, prompts: list[list[int]]) -> list[dict]:
    import llama_cpp as L

    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out = []
    for ids in prompts:
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 64, 64, 1, 1
        cp.type_k = cp.type_v = L.GGML_TYPE_F32
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(model, cp)
        batch = L.llama_batch_init(64, 0, 1)

        def run(toks: list[int], pos0: int) -> np.ndarray:
            for i, tok in enumerate(toks):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, 1
            batch.n_tokens = len(toks)
            if L.llama_decode(ctx, batch) != 0:
                sys.exit("llama_decode failed")
            return np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(toks), vocab)).copy()

        logits = run(ids, 0)
        greedy, nxt = [], int(logits[-1].argmax())
        for step in range(CONTINUE):
            greedy.append(nxt)
            nxt = int(run([nxt], len(ids) + step)[0].argmax())
        out.append({"logits": logits, "greedy": greedy})
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def hf_run(hf_dir: pathlib.Path, values: dict, prompts: list[list[int]]) -> list[dict]:
    """transformers on the dequantized weights of one GGUF."""
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    sd = {"model.embed_tokens.weight": values["token_embd.weight"],
          "model.norm.weight": values["output_norm.weight"]}
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate"}
    for i in range(model.config.num_hidden_layers):
        for g, h in names.items():
            sd[f"model.layers.{i}.{h}.weight"] = values[f"blk.{i}.{g}.weight"]
        for g, h in [("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")]:
            stack = values[f"blk.{i}.ffn_{g}_exps.weight"]  # [experts, out, in]
            for e in range(stack.shape[0]):
                sd[f"model.layers.{i}.mlp.experts.{e}.{h}.weight"] = stack[e]
    sd = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        sys.exit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    out = []
    with torch.no_grad():
        for ids in prompts:
            o = model(torch.tensor([ids]), output_router_logits=True)
            routes = [r.topk(model.config.num_experts_per_tok, dim=-1).indices.tolist()
                      for r in o.router_logits]
            seq = list(ids)
            for _ in range(CONTINUE):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            out.append({"logits": o.logits[0].numpy(), "routes": routes, "greedy": seq[len(ids):]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=pathlib.Path)
    args = ap.parse_args()
    sys.path.insert(0, str(args.llama_cpp.resolve() / "gguf-py"))
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    OUT.mkdir(parents=True, exist_ok=True)
    quiet_llama()
    tok = Tokenizer.from_file(str(ROOT / "models" / "target" / "tokenizer.json"))
    prompts = [[1] + tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        hf = tmp / "hf"
        build_hf(hf)
        f32 = tmp / "tiny-f32.gguf"
        subprocess.run([sys.executable, str(ROOT / "tools/bench/convert_peer_gguf.py"),
                        "--llama-cpp", str(args.llama_cpp), "--model", str(hf), "--tokenizer-pre",
                        "qwen2", "--outtype", "f32", "--outfile", str(f32)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, ftype in QUANTS.items():
            path = OUT / f"tiny-{name}.gguf"
            quantize(f32, path, ftype)
            table, values = dequant_table(path)
            llama = llama_run(path, prompts)
            hf_out = hf_run(hf, values, prompts)
            arrays, runs = {}, []
            for k, (ids, lo, ho) in enumerate(zip(prompts, llama, hf_out)):
                arrays[f"llama.logits.{k}"] = lo["logits"].astype(np.float32)
                arrays[f"hf.logits.{k}"] = ho["logits"].astype(np.float32)
                runs.append({"prompt": ids, "llama_greedy": lo["greedy"], "hf_greedy": ho["greedy"],
                             "hf_routes": ho["routes"]})
                diff = np.abs(lo["logits"] - ho["logits"]).max()
                print(f"{name} prompt {k}: max|llama - hf| = {diff:.3e}, "
                      f"greedy agree {sum(a == b for a, b in zip(lo['greedy'], ho['greedy']))}/{CONTINUE}")
            save_file(arrays, str(OUT / f"tiny-{name}.logits.safetensors"))
            ref = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                   "tensors": table, "runs": runs}
            (OUT / f"tiny-{name}.reference.json").write_text(json.dumps(ref, indent=1) + "\n")
            print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes), "
                  f"types {sorted({t['type'] for t in table})}")


if __name__ == "__main__":
    main()
