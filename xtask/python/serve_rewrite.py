"""Load generator for `cargo xtask bench --draft --streams`: N concurrent greedy chat
requests, each asking an OpenAI-compatible server to rewrite the same Python module with one
change (xtask/testdata/rewrite_prompt.txt), not streamed.

Usage: serve_rewrite.py BASE_URL MODEL STREAMS MAX_TOKENS PROMPT_FILE
Prints one JSON object: streams, tokens (completion tokens of all requests), wall_s (first
request sent to last answer read), tok_s (tokens / wall_s) and answers (a digest of the
answers in request order, to tell whether two servers answered alike). Runs in
target/client-venv (pinned openai).
"""

import hashlib
import json
import sys
import threading
import time

import openai


def main():
    base, model, streams, max_tokens, prompt_file = sys.argv[1:6]
    streams, max_tokens = int(streams), int(max_tokens)
    prompt = open(prompt_file, encoding="utf-8").read()
    client = openai.OpenAI(base_url=base, api_key="none", timeout=1200, max_retries=0)
    answers = [None] * streams
    tokens = [0] * streams
    errors = []

    def one(i):
        try:
            r = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens,
                temperature=0,
            )
            answers[i] = r.choices[0].message.content
            tokens[i] = r.usage.completion_tokens
        except Exception as e:  # reported below, as the row's error
            errors.append(f"request {i}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    digest = hashlib.sha256("\x00".join(answers).encode()).hexdigest()[:16]
    total = sum(tokens)
    print(json.dumps({"streams": streams, "tokens": total, "wall_s": wall, "tok_s": total / wall, "answers": digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
