"""Time to first token of `specfit serve` with and without its prompt cache (issue 15,
BENCHMARKS.md "Server"): four chat requests sharing a long system prompt (the first CNN/DM
article of data/spec_bench, about 1,000 tokens) with different short questions, greedy, 16
tokens, against the defaults and against `--no-prompt-cache`. Prints, per request, the prompt
tokens, the cached ones, prefill ms and time to first token ms as the server reports them.

    cargo build --release && python3 tools/bench/prompt_cache.py
"""
import json
import subprocess
import time
import urllib.request

from protocol import ROOT, free_port

QUESTIONS = ["Summarize the article.", "Who is the article about?", "List three facts from it.",
             "What happened first?"]


def post(port: int, messages: list) -> dict:
    body = json.dumps({"messages": messages, "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


def main() -> None:
    article = json.loads((ROOT / "data/spec_bench/summarization.jsonl").open().readline())["turns"][0]
    for flags in [[], ["--no-prompt-cache"]]:
        port = free_port()
        proc = subprocess.Popen([str(ROOT / "target/release/specfit"), "serve", "--port", str(port)]
                                + flags, cwd=ROOT, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
                    break
                except OSError:
                    time.sleep(0.1)
            for q in QUESTIONS:
                r = post(port, [{"role": "system", "content": article}, {"role": "user", "content": q}])
                u, s = r["usage"], r["specfit"]
                print(" ".join(flags) or "(defaults)", u["prompt_tokens"],
                      u["prompt_tokens_details"]["cached_tokens"], f"{s['prefill_ms']:.1f}",
                      f"{s['time_to_first_token_ms']:.1f}", flush=True)
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
