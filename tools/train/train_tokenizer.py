#!/usr/bin/env python3
"""Train the project's byte-level BPE tokenizer on the training corpus (issue 5).

Reads   tools/train/out/corpus/{train,valid}.jsonl  (from build_corpus.py) and data/spec_bench/*.jsonl.
Writes  tools/train/out/tokenizer/  (--out):
  tokenizer.json           the HF `tokenizers` model: Qwen2-style pre-tokenizer (the Qwen2 split regex,
                           so digits are single tokens) + byte-level BPE, no normaliser (lossless on any text)
  tokenizer_config.json    PreTrainedTokenizerFast, a ChatML chat_template (Qwen style, no default system
                           message), eos <|im_end|>, pad <|endoftext|>, no bos, clean_up_tokenization_spaces false
  special_tokens_map.json  the same special tokens
  stats.json               vocabulary, corpus token counts, validation compression, eval prompt lengths, checks

Only the training split is used to train the tokenizer. The special tokens get ids 0, 1, 2
(<|endoftext|>, <|im_start|>, <|im_end|>), then the 256 byte symbols, then the merges, --vocab-size ids in all.
The trainer sees the corpus text cut at the special-token strings, so no merge ever spans one.
BPE training has no randomness. The result depends only on the corpus and on these settings.
The script checks its own result. Training twice must give a byte-identical tokenizer.json; the rerun is skipped
with --no-determinism-check. transformers.AutoTokenizer must load the directory. decode(encode(x)) == x must hold
for every validation document and eval prompt, and for a set of awkward strings. The chat template must render
every corpus document exactly as build_corpus.py wrote it. Any failure exits non-zero.
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
from pathlib import Path

from common import add_eval_arguments, read_jsonl, render

HERE = Path(__file__).resolve().parent

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The Qwen2 / Qwen2.5 / Qwen3 pre-tokenizer split pattern (tokenizer.json of those models).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# ChatML, as in Qwen's templates, with no default system message and no tool or thinking blocks.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
AWKWARD = [
    "", " ", "  leading and trailing  ", "tabs\tand\r\nCRLF\rCR", "\n\n\n", "emoji 🙂👍🏽 and CJK 中文 and é vs e\u0301",
    "numbers 1234567890 3.14 -5 1,000,000 $12.50 50%", "<<48/2=24>>24\n#### 72", "a\u00a0nbsp \u2212 minus \u2013 dash",
    "literal <|im_end|> inside text", "<|im_start|>user\nhi<|im_end|>\n", "\x00\x01 control", "'s 't 're 've 'm 'll 'd",
]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def train(texts, vocab_size, min_frequency):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def segments():
        # cut each document at the special-token strings; the trainer never sees them
        import re
        cut = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS))
        for t in texts:
            for seg in cut.split(t):
                if seg:
                    yield seg

    tok.train_from_iterator(segments(), trainer=trainer)
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=HERE / "out" / "corpus")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "tokenizer")
    add_eval_arguments(ap)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="RAYON_NUM_THREADS for the trainer (results do not depend on it)")
    ap.add_argument("--no-determinism-check", action="store_true", help="skip the second training run")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if args.threads == 1 else "true"

    train_docs = read_jsonl(args.corpus / "train.jsonl")
    valid_docs = read_jsonl(args.corpus / "valid.jsonl")
    failures = []

    tok = train([d["text"] for d in train_docs], args.vocab_size, args.min_frequency)
    args.out.mkdir(parents=True, exist_ok=True)
    tok_path = args.out / "tokenizer.json"
    tok.save(str(tok_path), pretty=False)
    tok_sha = hashlib.sha256(tok_path.read_bytes()).hexdigest()
    if not args.no_determinism_check:
        again = train([d["text"] for d in train_docs], args.vocab_size, args.min_frequency)
        if again.to_str(pretty=False) != tok.to_str(pretty=False):
            failures.append("two training runs gave different tokenizers")

    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    added_tokens_decoder = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True} for s, i in ids.items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    special_map = {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map)):
        (args.out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    # ---- checks with transformers ------------------------------------------------------------
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(args.out))
    if (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) != (ids["<|im_end|>"], ids["<|endoftext|>"], None):
        failures.append(f"special ids: eos {hf.eos_token_id} pad {hf.pad_token_id} bos {hf.bos_token_id}")
    if len(hf) != args.vocab_size or tok.get_vocab_size() != args.vocab_size:
        failures.append(f"vocab size {len(hf)} / {tok.get_vocab_size()} != {args.vocab_size}")

    # chat template renders every document exactly as build_corpus.py wrote it
    bad_render = sum(hf.apply_chat_template(d["messages"], tokenize=False) != d["text"]
                     for d in train_docs + valid_docs)
    if bad_render:
        failures.append(f"chat template differs from the corpus text on {bad_render} documents")

    # round trip: tokenizers and transformers, on the validation split, eval prompts and awkward strings
    sb_sum = read_jsonl(args.eval_summarization)
    sb_math = read_jsonl(args.eval_math)
    eval_prompts = {r["question_id"]: hf.apply_chat_template([{"role": "user", "content": r["turns"][0]}],
                                                             tokenize=False, add_generation_prompt=True)
                    for r in sb_sum + sb_math}
    for r in sb_sum + sb_math:
        want = render([{"role": "user", "content": r["turns"][0]}]) + "<|im_start|>assistant\n"
        if eval_prompts[r["question_id"]] != want:
            failures.append(f"generation prompt render differs for question_id {r['question_id']}")
    texts = ([d["text"] for d in valid_docs] + [m["content"] for d in valid_docs for m in d["messages"]]
             + list(eval_prompts.values()) + AWKWARD)
    rt_tok = sum(tok.decode(tok.encode(t).ids, skip_special_tokens=False) != t for t in texts)
    rt_hf = sum(hf.decode(hf.encode(t), skip_special_tokens=False) != t for t in texts)
    if rt_tok or rt_hf:
        failures.append(f"round trip failed: tokenizers {rt_tok}, transformers {rt_hf} of {len(texts)}")
    # the rendered template starts with a single <|im_start|> token and a generation prompt ends with "assistant\n"
    enc = hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    if enc[0] != ids["<|im_start|>"] or hf.decode(enc) != "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n":
        failures.append(f"unexpected generation prompt ids {enc}")
    if tok.encode("<|im_start|>user\nhi<|im_end|>\n").ids[0] != ids["<|im_start|>"]:
        failures.append("<|im_start|> is not a single token")

    # ---- statistics ----------------------------------------------------------------------------
    def doc_tokens(docs):
        return [len(e.ids) for e in tok.encode_batch([d["text"] for d in docs])]

    def corpus_stats(docs):
        out = {}
        lens_all = doc_tokens(docs)
        for src in ("gsm8k", "cnn_dm", "all"):
            lens = [n for n, d in zip(lens_all, docs) if src == "all" or d["source"] == src]
            out[src] = {"documents": len(lens), "tokens": sum(lens), "mean": round(statistics.mean(lens), 1),
                        "p50": pct(lens, 50), "p95": pct(lens, 95), "max": max(lens)}
        return out

    def compression(docs):
        out = {}
        for src in ("gsm8k", "cnn_dm", "all"):
            contents = [m["content"] for d in docs if src == "all" or d["source"] == src for m in d["messages"]]
            ntok = sum(len(e.ids) for e in tok.encode_batch(contents))
            out[src] = {"chars_per_token": round(sum(map(len, contents)) / ntok, 3),
                        "tokens_per_word": round(ntok / sum(len(c.split()) for c in contents), 3),
                        "content_tokens": ntok}
        return out

    def prompt_stats(rows):
        lens = [len(hf.encode(eval_prompts[r["question_id"]])) for r in rows]
        return {"prompts": len(lens), "mean": round(statistics.mean(lens), 1), "min": min(lens), "max": max(lens),
                "total": sum(lens)}

    def sample(qid):
        e = tok.encode(eval_prompts[qid])
        return {"question_id": qid, "chars": len(eval_prompts[qid]), "tokens": len(e.ids),
                "first_tokens": [tok.decode([i], skip_special_tokens=False) for i in e.ids[:24]],
                "first_ids": e.ids[:24]}

    vocab = tok.get_vocab()
    merges = json.loads(tok.to_str())["model"]["merges"]
    stats = {
        "settings": {"vocab_size": args.vocab_size, "min_frequency": args.min_frequency,
                     "pre_tokenizer": "Qwen2 split regex + ByteLevel", "normalizer": None},
        "tokenizer_json_sha256": tok_sha,
        "vocab_size": tok.get_vocab_size(),
        "merges": len(merges),
        "special_token_ids": ids,
        "longest_tokens": sorted((t for t in vocab), key=lambda t: (-len(tok.decode([vocab[t]])), t))[:10],
        "corpus_tokens": {"train": corpus_stats(train_docs), "valid": corpus_stats(valid_docs)},
        "valid_compression": compression(valid_docs),
        "eval_prompt_tokens": {
            "summarization_first40": prompt_stats(sb_sum[:40]),
            "summarization_all80": prompt_stats(sb_sum),
            "math_reasoning_all80": prompt_stats(sb_math),
        },
        "samples": {"summarization": sample(sb_sum[0]["question_id"]), "math_reasoning": sample(sb_math[0]["question_id"])},
        "checks": {"round_trip_texts": len(texts), "round_trip_failures_tokenizers": rt_tok,
                   "round_trip_failures_transformers": rt_hf, "chat_template_mismatches": bad_render,
                   "determinism_checked": not args.no_determinism_check, "failures": failures},
    }
    (args.out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    print(json.dumps({k: stats[k] for k in ("vocab_size", "merges", "special_token_ids", "corpus_tokens",
                                            "valid_compression", "eval_prompt_tokens")}, indent=1), file=sys.stderr)
    print(f"tokenizer.json sha256 {tok_sha}", file=sys.stderr)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"ok: {len(texts)} texts round-trip exactly (tokenizers and transformers); "
          f"chat template matches all {len(train_docs) + len(valid_docs)} corpus documents", file=sys.stderr)


if __name__ == "__main__":
    main()
