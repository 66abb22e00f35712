"""Multi-turn load for `cargo xtask bench --serve --turns N`: CONVERSATIONS concurrent chats
against an OpenAI-compatible server, each TURNS turns long, every one behind the same long
system prompt (about SYSTEM_WORDS words, some 1,500 tokens), as an agent loop or a chat UI
sends them: each turn resends the whole conversation so far. Greedy, streamed (time to
first token seen per turn), `ignore_eos` so each answer is exactly MAX_TOKENS long.

Usage: serve_turns.py BASE_URL MODEL CONVERSATIONS TURNS MAX_TOKENS PROMPTS_FILE
Prints one JSON object: streams (the conversations), turns, requests, tokens, wall_s, tok_s,
ttft_p50_s and ttft_p99_s (every turn), ttft_first_p50_s (first turns), ttft_later_p50_s
(the others), latency_p50_s, latency_p99_s, prompt_tokens_first (the first turn's prompt),
cached_tokens (prompt tokens the server said it read from its cache). Runs in
target/client-venv (pinned openai).
"""

import json
import sys
import threading
import time

import openai

SYSTEM_WORDS = 1100


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def system_prompt(prompts):
    """A long, fixed system prompt: numbered rules built from the prompt lines."""
    words, rules, i = 0, [], 0
    while words < SYSTEM_WORDS:
        line = f"Rule {i + 1}: when asked about \"{prompts[i % len(prompts)]}\", answer plainly and briefly."
        rules.append(line)
        words += len(line.split())
        i += 1
    return "You are a careful assistant. Follow these rules.\n" + "\n".join(rules)


def main():
    base_url, model, conversations, turns, max_tokens, prompts_file = sys.argv[1:7]
    conversations, turns, max_tokens = int(conversations), int(turns), int(max_tokens)
    with open(prompts_file) as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    system = system_prompt(prompts)
    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=900, max_retries=0)
    lock = threading.Lock()
    results = []  # (turn, ttft, latency, tokens, prompt_tokens, cached)

    def conversation(c):
        messages = [{"role": "system", "content": system}]
        for turn in range(turns):
            messages.append({"role": "user", "content": prompts[(c + turn) % len(prompts)]})
            started = time.perf_counter()
            first, pieces, usage = None, [], None
            for chunk in client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    if first is None:
                        first = time.perf_counter() - started
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.usage:
                    usage = chunk.usage
            latency = time.perf_counter() - started
            messages.append({"role": "assistant", "content": "".join(pieces)})
            details = getattr(usage, "prompt_tokens_details", None)
            cached = (getattr(details, "cached_tokens", 0) or 0) if details else 0
            with lock:
                results.append((turn, first if first is not None else latency, latency, usage.completion_tokens,
                                usage.prompt_tokens, cached))

    started = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if len(results) != conversations * turns:
        sys.exit(f"only {len(results)} of {conversations * turns} turns completed")
    tokens = sum(r[3] for r in results)
    ttft = [r[1] for r in results]
    print(json.dumps({
        "streams": conversations, "turns": turns, "requests": len(results), "tokens": tokens, "wall_s": wall,
        "tok_s": tokens / wall, "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "ttft_first_p50_s": percentile([r[1] for r in results if r[0] == 0], 50),
        "ttft_later_p50_s": percentile([r[1] for r in results if r[0] > 0], 50),
        "latency_p50_s": percentile([r[2] for r in results], 50),
        "latency_p99_s": percentile([r[2] for r in results], 99),
        "prompt_tokens_first": max(r[4] for r in results if r[0] == 0),
        "cached_tokens": sum(r[5] for r in results),
    }))


if __name__ == "__main__":
    main()
