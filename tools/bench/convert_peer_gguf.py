"""Convert the tokenizer-less peer checkpoint to GGUF with llama.cpp's own converter.

llama.cpp's `convert_hf_to_gguf.py` (shipped in the llama-cpp-python sdist under
vendor/llama.cpp, together with its `conversion/` package and the matching `gguf-py`)
converts `Qwen3MoeForCausalLM`, but it insists on a Hugging Face tokenizer to write the
vocabulary. The random peer checkpoint has none (prompts are token ids), so this wrapper
runs the unmodified converter with one patch: `Qwen3MoeModel.set_vocab` writes the
"none" tokenizer model plus `qwen3moe.vocab_size`, which llama.cpp loads as a vocabulary of
that many dummy tokens (ids in, logits out; no text). Tensors, hyper-parameters and the
output dtype go through the converter untouched.

    SRC=$(tools/bench/fetch_llama_cpp_src.sh)   # or any extracted sdist's vendor/llama.cpp
    tools/.venv/bin/python tools/bench/convert_peer_gguf.py --llama-cpp "$SRC" \
        --model bench-models/peer115m/f32 --outtype f32 --outfile bench-models/peer115m/gguf/peer115m-f32.gguf
"""
import argparse
import pathlib
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=pathlib.Path,
                    help="llama.cpp source tree (vendor/llama.cpp of the llama-cpp-python sdist)")
    ap.add_argument("--model", required=True, type=pathlib.Path)
    ap.add_argument("--outfile", required=True, type=pathlib.Path)
    ap.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    args = ap.parse_args()

    src = args.llama_cpp.resolve()
    if not (src / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"error: {src}/convert_hf_to_gguf.py not found")
    sys.path.insert(0, str(src))
    import convert_hf_to_gguf  # noqa: E402  (puts src/gguf-py on sys.path itself)
    from conversion.qwen import Qwen3MoeModel  # noqa: E402

    def set_vocab_none(self) -> None:
        self._set_vocab_none()
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    Qwen3MoeModel.set_vocab = set_vocab_none

    args.outfile.parent.mkdir(parents=True, exist_ok=True)
    sys.argv = ["convert_hf_to_gguf.py", str(args.model), "--outfile", str(args.outfile),
                "--outtype", args.outtype]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
