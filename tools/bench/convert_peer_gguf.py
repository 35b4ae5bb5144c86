"""Convert the peer checkpoint (or the shipped target) to GGUF with llama.cpp's own converter.

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

With --tokenizer-pre NAME the checkpoint's own Hugging Face tokenizer is written instead (tokenizer
model "gpt2": tokens, merges, special tokens, chat template), with NAME as its pre-tokenizer. That is
for a byte-level BPE tokenizer whose pre-tokenizer llama.cpp implements but whose vocabulary the
converter does not recognise (it identifies pre-tokenizers by hashing the ids of a test string, so
any newly trained vocabulary fails with "BPE pre-tokenizer was not recognized"). The shipped target
(models/target) is such a case: its split regex is Qwen2's, so

    tools/.venv/bin/python tools/bench/convert_peer_gguf.py --llama-cpp "$SRC" --model models/target \
        --tokenizer-pre qwen2 --outtype f32 --outfile bench-models/target-gguf/target-f32.gguf
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
    ap.add_argument("--tokenizer-pre", default=None, metavar="NAME",
                    help="write the model's own tokenizer with this llama.cpp pre-tokenizer (e.g. qwen2) "
                         "instead of the dummy 'none' vocabulary")
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

    if args.tokenizer_pre is None:
        Qwen3MoeModel.set_vocab = set_vocab_none
    else:
        if not (args.model / "tokenizer.json").is_file():
            sys.exit(f"error: --tokenizer-pre needs {args.model}/tokenizer.json")
        # The converter's own byte-level BPE path (_set_vocab_gpt2), with the pre-tokenizer named
        # instead of looked up by hash.
        Qwen3MoeModel.get_vocab_base_pre = lambda self, tokenizer: args.tokenizer_pre
        Qwen3MoeModel.set_vocab = lambda self: self._set_vocab_gpt2()

    args.outfile.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from compressed import ensure_decompressed  # noqa: E402
    ensure_decompressed(args.model)
    sys.argv = ["convert_hf_to_gguf.py", str(args.model), "--outfile", str(args.outfile),
                "--outtype", args.outtype]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
