"""The experts llama.cpp routes each token to, on the committed GGUF fixtures (fixtures/gguf).

For each `tiny-NAME.gguf` and each prompt of its `tiny-NAME.reference.json`, runs llama.cpp's forward
on the whole prompt (llama-cpp-python low-level API, 1 thread, f32 KV cache, flash attention off, as
make_gguf_fixtures.py does) with an eval callback that reads every MoE layer's `ffn_moe_topk-L`
tensor (the selected expert ids, [top_k, tokens]), and writes them to
`fixtures/gguf/tiny-NAME.llama-routes.json`: `{"file", "sha256", "routes": [prompt][layer][token]
= [ids]}`. crates/engine/tests/gguf.rs compares specfit's routes with them.

Run from the repository root (a few seconds; needs tools/.venv with llama-cpp-python):

    tools/.venv/bin/python tools/gguf/llama_routes.py
"""
import ctypes
import hashlib
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "gguf"


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of the vendored ggml (include/ggml.h: 4 dims, 64 bytes of op params,
    10 sources, 64-byte names)."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


GGML_TYPE_I32 = 26
TOPK = re.compile(r"ffn_moe_topk-(\d+)$")


def routes_of(path: pathlib.Path, prompts: list[list[int]]) -> list:
    import llama_cpp as L

    keep = [L.llama_log_callback(lambda *_: None)]
    L.llama_log_set(keep[0], ctypes.c_void_p(0))
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    out = []
    for ids in prompts:
        seen: dict[int, list[list[int]]] = {}

        def callback(t, ask, _user):
            tensor = ctypes.cast(t, ctypes.POINTER(GgmlTensor)).contents
            m = TOPK.match(tensor.name.decode(errors="replace"))
            if ask:
                return m is not None
            if m is not None:
                if tensor.type != GGML_TYPE_I32:
                    sys.exit(f"{tensor.name}: type {tensor.type}, expected I32")
                k, tokens = tensor.ne[0], tensor.ne[1]
                rows = []
                for tok in range(tokens):
                    base = tensor.data + tok * tensor.nb[1]
                    rows.append([ctypes.cast(base + i * tensor.nb[0], ctypes.POINTER(ctypes.c_int32))[0]
                                 for i in range(k)])
                seen[int(m.group(1))] = rows
            return True

        cb = L.ggml_backend_sched_eval_callback(callback)
        keep.append(cb)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 64, 64, 1, 1
        cp.type_k = cp.type_v = L.GGML_TYPE_F32
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.cb_eval = cb
        cp.cb_eval_user_data = None
        ctx = L.llama_init_from_model(model, cp)
        batch = L.llama_batch_init(64, 0, 1)
        for i, tok in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        batch.n_tokens = len(ids)
        if L.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed")
        if not seen:
            sys.exit(f"{path.name}: no ffn_moe_topk tensor was evaluated")
        out.append([seen[layer] for layer in sorted(seen)])
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def main() -> None:
    for ref_path in sorted(FIXTURES.glob("tiny-*.reference.json")):
        ref = json.loads(ref_path.read_text())
        gguf = FIXTURES / ref["file"]
        sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
        if sha != ref["sha256"]:
            sys.exit(f"{gguf.name} is not the file its reference was made from")
        routes = routes_of(gguf, [run["prompt"] for run in ref["runs"]])
        name = ref["file"].removesuffix(".gguf")
        dst = FIXTURES / f"{name}.llama-routes.json"
        tmp = dst.with_suffix(".tmp")
        tmp.write_text(json.dumps({"file": ref["file"], "sha256": sha, "routes": routes}) + "\n")
        tmp.replace(dst)
        print(f"wrote {dst.relative_to(ROOT)}: {len(routes)} prompts × {len(routes[0])} layers × "
              f"{len(routes[0][0])} tokens")


if __name__ == "__main__":
    main()
