"""Load generator for `cargo xtask bench --serve`: N concurrent streams against an
OpenAI-compatible server, greedy, each request streamed so its time to first token is seen.
Every request asks for `ignore_eos` (an extension both mlx-iree serve and llama-server take),
so each generates exactly MAX_TOKENS and the servers compare the same work.

Usage: serve_bench.py BASE_URL MODEL STREAMS REQUESTS MAX_TOKENS PROMPTS_FILE [CONSTRAINED]
With CONSTRAINED (a count, 0 included) every request is a chat request (the prompt as the
user's message), and that many of the streams ask for JSON valid against SCHEMA
(constrained decoding), which no answer can complete within MAX_TOKENS, so they generate
exactly MAX_TOKENS as the others do; without it, plain completions.
Prints one JSON object: streams, constrained, chat, requests, tokens, prompt_tokens_mean (as
the server counted them), wall_s, tok_s, ttft_p50_s, ttft_p99_s, latency_p50_s,
latency_p99_s. Runs in target/client-venv (pinned openai).
"""

import json
import sys
import threading
import time

import openai

# A list of at least 1000 short strings: never complete within a bench's MAX_TOKENS.
SCHEMA = {"type": "object", "properties": {"lines": {"type": "array", "minItems": 1000,
          "items": {"type": "string", "maxLength": 40}}}, "required": ["lines"], "additionalProperties": False}


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    base_url, model, streams, requests, max_tokens, prompts_file = sys.argv[1:7]
    streams, requests, max_tokens = int(streams), int(requests), int(max_tokens)
    chat = len(sys.argv) > 7
    constrained = int(sys.argv[7]) if chat else 0
    with open(prompts_file) as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=600, max_retries=0)
    lock = threading.Lock()
    todo = list(range(requests))
    results = []

    def request(i, json_answer):
        prompt = prompts[i % len(prompts)]
        if json_answer:
            return client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
                stream=True, stream_options={"include_usage": True},
                response_format={"type": "json_schema", "json_schema": {"name": "lines", "schema": SCHEMA}},
            )
        if chat:
            return client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )
        return client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )

    def text_of(chunk):
        if not chunk.choices:
            return None
        choice = chunk.choices[0]
        return choice.delta.content if hasattr(choice, "delta") else choice.text

    def worker(json_answer):
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            started = time.perf_counter()
            first, tokens, prompt_tokens = None, 0, 0
            for chunk in request(i, json_answer):
                if text_of(chunk) and first is None:
                    first = time.perf_counter() - started
                if chunk.usage:
                    tokens, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
            with lock:
                results.append((first if first is not None else time.perf_counter() - started,
                                time.perf_counter() - started, tokens, prompt_tokens))

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k < constrained,)) for k in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if len(results) != requests:
        sys.exit(f"only {len(results)} of {requests} requests completed")
    tokens = sum(r[2] for r in results)
    print(json.dumps({
        "streams": streams, "constrained": constrained, "chat": chat, "requests": requests, "tokens": tokens,
        "prompt_tokens_mean": sum(r[3] for r in results) / len(results), "wall_s": wall, "tok_s": tokens / wall,
        "ttft_p50_s": percentile([r[0] for r in results], 50), "ttft_p99_s": percentile([r[0] for r in results], 99),
        "latency_p50_s": percentile([r[1] for r in results], 50),
        "latency_p99_s": percentile([r[1] for r in results], 99),
    }))


if __name__ == "__main__":
    main()
