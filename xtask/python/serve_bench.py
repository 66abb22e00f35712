"""Load generator for `cargo xtask bench --serve`: N concurrent streams against an
OpenAI-compatible server, greedy, each request streamed so its time to first token is seen.
Every request asks for `ignore_eos` (an extension both mlx-iree serve and llama-server take),
so each generates exactly MAX_TOKENS and the servers compare the same work.

Usage: serve_bench.py BASE_URL MODEL STREAMS REQUESTS MAX_TOKENS PROMPTS_FILE
Prints one JSON object: streams, requests, tokens, wall_s, tok_s, ttft_p50_s, ttft_p99_s,
latency_p50_s, latency_p99_s. Runs in target/client-venv (pinned openai).
"""

import json
import sys
import threading
import time

import openai


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    base_url, model, streams, requests, max_tokens, prompts_file = sys.argv[1:7]
    streams, requests, max_tokens = int(streams), int(requests), int(max_tokens)
    with open(prompts_file) as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=600, max_retries=0)
    lock = threading.Lock()
    todo = list(range(requests))
    results = []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            started = time.perf_counter()
            first, tokens = None, 0
            for chunk in client.completions.create(
                model=model, prompt=prompts[i % len(prompts)], max_tokens=max_tokens, temperature=0,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            ):
                if chunk.choices and chunk.choices[0].text and first is None:
                    first = time.perf_counter() - started
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
            with lock:
                results.append((first if first is not None else time.perf_counter() - started,
                                time.perf_counter() - started, tokens))

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if len(results) != requests:
        sys.exit(f"only {len(results)} of {requests} requests completed")
    tokens = sum(r[2] for r in results)
    print(json.dumps({
        "streams": streams, "requests": requests, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
        "ttft_p50_s": percentile([r[0] for r in results], 50), "ttft_p99_s": percentile([r[0] for r in results], 99),
        "latency_p50_s": percentile([r[1] for r in results], 50),
        "latency_p99_s": percentile([r[1] for r in results], 99),
    }))


if __name__ == "__main__":
    main()
