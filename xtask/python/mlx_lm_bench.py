#!/usr/bin/env python3
"""mlx-lm's float32 speed on the bench prompt, for `cargo xtask bench --peers`.

Run with the mlx venv's python (target/mlx-venv):
    python mlx_lm_bench.py --model MLX_DIR --prompt-ids 1,38,... --steps N --repeats N

mlx-lm on Linux is the accuracy oracle of this project, not a speed peer: its CPU
backend runs single-threaded there. The row is the oracle's own set-up (oracle.py's
`load_f32`: mlx-lm's loader, every float parameter widened to float32), timed like
`mlx-iree bench`: per repeat a fresh KV cache, the prompt in one forward pass, then
`steps` greedy single-token steps, each evaluated before the next; wall clock,
medians over the repeats. Prints one JSON line with the fields of a bench row.
"""

import argparse
import sys
import time

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from bench_row import print_row
from oracle import load_f32


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-ids", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    ids = [int(x) for x in args.prompt_ids.split(",")]

    started = time.perf_counter()
    model, _ = load_f32(args.model)
    load_s = time.perf_counter() - started
    weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))

    prefill_s, decode_s, tokens = [], [], []
    for r in range(args.repeats):
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        token = mx.argmax(model(mx.array([ids], dtype=mx.uint32), cache=cache)[0, -1])
        mx.eval(token)
        t1 = time.perf_counter()
        out = [int(token)]
        for _ in range(args.steps):
            token = mx.argmax(model(token.reshape(1, 1), cache=cache)[0, -1])
            mx.eval(token)
            out.append(int(token))
        t2 = time.perf_counter()
        print(
            f"mlx_lm_bench.py: repeat {r + 1}/{args.repeats}: prefill {t1 - t0:.3f} s, "
            f"{args.steps} decode steps {t2 - t1:.3f} s",
            file=sys.stderr,
            flush=True,
        )
        prefill_s.append(t1 - t0)
        decode_s.append(t2 - t1)
        tokens = out
    print_row("mlx-lm", args.model, "f32", ids, args.steps, prefill_s, decode_s, weight_bytes, load_s, tokens)


if __name__ == "__main__":
    main()
