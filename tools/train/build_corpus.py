#!/usr/bin/env python3
"""Build the training corpus for the shipped target model (issue 5): GSM8K train + CNN/DailyMail.

Inputs (defaults; run from anywhere):
  ../shared/data/gsm8k/train.jsonl                  GSM8K train, 7,473 question/answer pairs (MIT)
  ../shared/data/cnn_dm/cnn_dailymail_0shot.jsonl   the first 1,000 CNN/DM 3.0.0 test articles + highlights
  data/spec_bench/summarization.jsonl               evaluation prompts (Spec-Bench, 80 CNN/DM articles)
  data/spec_bench/math_reasoning.jsonl              evaluation prompts (Spec-Bench, 80 GSM8K test questions)
  ../shared/data/gsm8k/eagle_gsm8k_question.jsonl   EAGLE's 80 GSM8K questions (an extra decontamination set)

Every training document that matches an evaluation prompt is removed. All 80 + 80 Spec-Bench prompts
are used, not only the bench's subset. Matching uses normalised text: Unicode NFKC, lower case, and
the text reduced to its runs of letters and digits joined by single spaces. This makes "Clinton’s"
and "clinton's", or "at 92 ." and "at 92.", compare equal. The rules are applied in order, and the
first that fires is recorded:
  GSM8K   question: (1) exact normalised question  (2) shares an N-word n-gram (default 13) with an eval question
  CNN/DM  article:  (1) exact normalised article   (2) same normalised prefix (default 200 chars)
                    (3) shares an N-word n-gram with an eval article (the GPT-3 decontamination rule;
                        catches other articles that quote the same passages)
Exact duplicates inside a source (by normalised text) are dropped before the split, so validation
and training never share a document. The validation split is a seeded random sample of each source,
taken after removal. It is used for held-out perplexity and route-predictor accuracy.

Documents are rendered the way the model sees them at inference: ChatML, a single user turn built as
Spec-Bench builds it, then the assistant answer:
  CNN/DM: user = "Summarize: " + article   assistant = highlights, " ." -> ".", joined by spaces
          (this is exactly the format of Spec-Bench's `reference`; checked on the overlapping articles)
  GSM8K:  user = question (verbatim)         assistant = the GSM8K answer, verbatim: the reasoning with its
          <<calc>> annotations and the final "#### N" line (as in Spec-Bench's `reference`;
          use --gsm8k-strip-calc to delete the <<...>> spans)
  text  = "<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n{assistant}<|im_end|>\\n"
This is the chat template's rendering of the two messages. train_tokenizer.py checks that it is identical.

Outputs (in --out, default tools/train/out/corpus/):
  train.jsonl, valid.jsonl   {"id","source","source_index","messages":[user,assistant],"text"}
  removed.jsonl              every removed or duplicate document: id, reason, matched eval question_ids
  stats.json                 counts, characters, removal counts by rule, input sha256s, parameters
Python standard library only. The output is deterministic for a given --seed and set of inputs.
"""

import argparse
import collections
import hashlib
import json
import os
import random
import re
import sys
import unicodedata
from pathlib import Path

from common import REPO, add_eval_arguments, read_jsonl, render

SHARED = REPO.parent / "shared" / "data"

CNN_PREFIX = "###\nArticle: "
CNN_SUFFIX = "\n\nSummarize the above article in 3 sentences."
SB_SUM_PREFIX = "Summarize: "
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CALC_RE = re.compile(r"<<[^<>]*>>")
WORD_RE = re.compile(r"[^\W_]+")


def norm(s):
    """Normalised text for matching: NFKC, lower case, letter/digit runs joined by single spaces."""
    return " ".join(WORD_RE.findall(unicodedata.normalize("NFKC", s).lower()))


def ngrams(normalised, n):
    w = normalised.split()
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def highlights_to_reference(summary_gt):
    """CNN/DM highlights ("... .\\n... .") -> Spec-Bench reference style ("... . ...")."""
    lines = [l.strip() for l in summary_gt.split("\n") if l.strip()]
    return " ".join(l[:-2] + "." if l.endswith(" .") else l for l in lines)


def write_jsonl(path, rows):
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gsm8k-train", type=Path, default=SHARED / "gsm8k" / "train.jsonl")
    ap.add_argument("--cnn-dm", type=Path, default=SHARED / "cnn_dm" / "cnn_dailymail_0shot.jsonl")
    add_eval_arguments(ap)
    ap.add_argument("--eval-extra-gsm8k", type=Path, default=SHARED / "gsm8k" / "eagle_gsm8k_question.jsonl",
                    help="an extra GSM8K question set to decontaminate against (EAGLE's 80); '' to skip")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "corpus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--valid-gsm8k", type=int, default=300, help="GSM8K documents held out for validation")
    ap.add_argument("--valid-cnn-dm", type=int, default=50, help="CNN/DM documents held out for validation")
    ap.add_argument("--ngram", type=int, default=13, help="n-gram length (words) for overlap removal; 0 disables")
    ap.add_argument("--prefix-chars", type=int, default=200, help="normalised prefix length for CNN/DM matching")
    ap.add_argument("--gsm8k-strip-calc", action="store_true", help="delete <<...>> calculator annotations")
    args = ap.parse_args()

    # ---- evaluation sets -------------------------------------------------------------------
    sb_sum = read_jsonl(args.eval_summarization)
    sb_math = read_jsonl(args.eval_math)
    assert all(r["category"] == "summarization" and r["turns"][0].startswith(SB_SUM_PREFIX) for r in sb_sum)
    assert all(r["category"] == "math_reasoning" for r in sb_math)
    eval_articles = [(f"spec_bench:{r['question_id']}", norm(r["turns"][0][len(SB_SUM_PREFIX):])) for r in sb_sum]
    eval_questions = [(f"spec_bench:{r['question_id']}", norm(r["turns"][0])) for r in sb_math]
    extra = []
    if str(args.eval_extra_gsm8k):
        extra = read_jsonl(args.eval_extra_gsm8k)
        eval_questions += [(f"eagle_gsm8k:{r['question_id']}", norm(r["turns"][0])) for r in extra]

    def index(evals):
        exact = collections.defaultdict(list)
        prefix = collections.defaultdict(list)
        grams = collections.defaultdict(set)
        for qid, t in evals:
            exact[t].append(qid)
            prefix[t[:args.prefix_chars]].append(qid)
            if args.ngram:
                for g in ngrams(t, args.ngram):
                    grams[g].add(qid)
        return exact, prefix, grams

    q_exact, _, q_grams = index(eval_questions)
    a_exact, a_prefix, a_grams = index(eval_articles)

    def match(t, exact, prefix, grams, use_prefix):
        """-> (rule, matched ids, shared n-grams) or None."""
        if t in exact:
            return "exact", sorted(exact[t]), None
        if use_prefix and len(t) >= args.prefix_chars and t[:args.prefix_chars] in prefix:
            return "prefix", sorted(prefix[t[:args.prefix_chars]]), None
        if args.ngram:
            hit = collections.Counter()
            for g in ngrams(t, args.ngram):
                for qid in grams.get(g, ()):
                    hit[qid] += 1
            if hit:
                return "ngram", sorted(hit), sum(hit.values())
        return None

    # ---- sources ----------------------------------------------------------------------------
    docs = {"gsm8k": [], "cnn_dm": []}
    removed = []
    seen = {"gsm8k": {}, "cnn_dm": {}}
    counts = {s: collections.Counter() for s in docs}

    def kept(src, did, t, head, m):
        """Counts a document of src (normalised text t) and says whether it stays: not when it matches an
        eval prompt (m, from match) or repeats an earlier document of src; removed records either."""
        counts[src]["input"] += 1
        if m:
            counts[src][f"removed_{m[0]}"] += 1
            removed.append({"id": did, "source": src, "reason": f"eval_{m[0]}", "matched": m[1],
                            "shared_ngrams": m[2], "prompt_head": head[:100]})
            return False
        if t in seen[src]:
            counts[src]["duplicate"] += 1
            removed.append({"id": did, "source": src, "reason": "duplicate", "matched": [seen[src][t]],
                            "shared_ngrams": None, "prompt_head": head[:100]})
            return False
        seen[src][t] = did
        return True

    for i, r in enumerate(read_jsonl(args.gsm8k_train)):
        did = f"gsm8k-train-{i:05d}"
        q, a = r["question"], r["answer"]
        if args.gsm8k_strip_calc:
            a = CALC_RE.sub("", a)
        t = norm(q)
        if not kept("gsm8k", did, t, q, match(t, q_exact, None, q_grams, use_prefix=False)):
            continue
        docs["gsm8k"].append({"id": did, "source": "gsm8k", "source_index": i,
                              "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})

    for i, r in enumerate(read_jsonl(args.cnn_dm)):
        did = f"cnn_dm-test-{i:04d}"
        art = r["article"]
        assert art.startswith(CNN_PREFIX) and art.endswith(CNN_SUFFIX), did
        art = art[len(CNN_PREFIX):-len(CNN_SUFFIX)].strip()
        t = norm(art)
        if not kept("cnn_dm", did, t, art, match(t, a_exact, a_prefix, a_grams, use_prefix=True)):
            continue
        docs["cnn_dm"].append({"id": did, "source": "cnn_dm", "source_index": i,
                               "messages": [{"role": "user", "content": SB_SUM_PREFIX + art},
                                            {"role": "assistant", "content": highlights_to_reference(r["summary_gt"])}]})

    # ---- render, split -----------------------------------------------------------------------
    for src in docs:
        for d in docs[src]:
            for msg in d["messages"]:
                assert not any(s in msg["content"] for s in SPECIAL_TOKENS), d["id"]
                assert msg["content"] and msg["content"] == msg["content"].strip(), d["id"]
            d["text"] = render(d["messages"])

    rng = random.Random(args.seed)
    train, valid = [], []
    n_valid = {"gsm8k": args.valid_gsm8k, "cnn_dm": args.valid_cnn_dm}
    for src in ("gsm8k", "cnn_dm"):  # fixed order: the seeded stream is consumed identically every run
        idx = list(range(len(docs[src])))
        rng.shuffle(idx)
        held = set(idx[:n_valid[src]])
        for k, d in enumerate(docs[src]):  # each split keeps the source order
            (valid if k in held else train).append(d)

    # ---- leakage report: validation documents sharing an n-gram with training documents ------
    # (informational only; GSM8K problems are templated, and CNN/DM has several articles per story)
    leak = collections.Counter()
    if args.ngram:
        for src in docs:
            tg = set()
            for d in train:
                if d["source"] == src:
                    tg.update(hash(g) for g in ngrams(norm(d["messages"][0]["content"]), args.ngram))
            for d in valid:
                if d["source"] == src and any(hash(g) in tg for g in
                                              ngrams(norm(d["messages"][0]["content"]), args.ngram)):
                    leak[src] += 1

    # ---- write -------------------------------------------------------------------------------
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "valid.jsonl", valid)
    write_jsonl(args.out / "removed.jsonl", removed)

    def split_stats(rows):
        out = {}
        for src in ("gsm8k", "cnn_dm", "all"):
            rs = [d for d in rows if src == "all" or d["source"] == src]
            out[src] = {
                "documents": len(rs),
                "chars_text": sum(len(d["text"]) for d in rs),
                "chars_user": sum(len(d["messages"][0]["content"]) for d in rs),
                "chars_assistant": sum(len(d["messages"][1]["content"]) for d in rs),
                "words": sum(len(m["content"].split()) for d in rs for m in d["messages"]),
            }
        return out

    eval_ids = collections.Counter(q for r in removed if r["reason"] != "duplicate" for q in r["matched"])
    stats = {
        "parameters": {k: os.path.relpath(v, REPO) if isinstance(v, Path) and str(v) else v
                       for k, v in vars(args).items()},
        "inputs_sha256": {p.name: sha256(p) for p in (args.gsm8k_train, args.cnn_dm, args.eval_summarization,
                                                      args.eval_math) + ((args.eval_extra_gsm8k,) if extra else ())},
        "eval_sets": {"spec_bench_summarization": len(sb_sum), "spec_bench_math_reasoning": len(sb_math),
                      "eagle_gsm8k": len(extra)},
        "normalisation": "NFKC, lower case, runs of letters/digits ([^\\W_]+) joined by single spaces",
        "sources": {s: dict(sorted(c.items())) for s, c in counts.items()},
        "removed_by_rule": dict(sorted(collections.Counter(f"{r['source']}:{r['reason']}" for r in removed).items())),
        "eval_prompts_matched": sorted(eval_ids),
        "train": split_stats(train),
        "valid": split_stats(valid),
        "valid_docs_sharing_an_ngram_with_train": dict(sorted(leak.items())),
        "outputs_sha256": {n: sha256(args.out / n) for n in ("train.jsonl", "valid.jsonl", "removed.jsonl")},
    }
    tmp = args.out / "stats.json.tmp"
    tmp.write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, args.out / "stats.json")

    # ---- report -------------------------------------------------------------------------------
    print(f"wrote {args.out}/train.jsonl ({len(train)} docs), valid.jsonl ({len(valid)} docs), "
          f"removed.jsonl ({len(removed)}), stats.json", file=sys.stderr)
    for src, c in counts.items():
        print(f"  {src}: {dict(sorted(c.items()))}", file=sys.stderr)
    for r in removed:
        print(f"  removed {r['id']:<18} {r['reason']:<11} {','.join(r['matched'])}"
              + (f" ({r['shared_ngrams']} shared {args.ngram}-grams)" if r["shared_ngrams"] else ""),
              file=sys.stderr)
    for split, s in (("train", stats["train"]), ("valid", stats["valid"])):
        print(f"  {split}: " + ", ".join(f"{k} {v['documents']} docs / {v['chars_text']:,} chars" for k, v in s.items()),
              file=sys.stderr)


if __name__ == "__main__":
    main()
