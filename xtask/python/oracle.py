#!/usr/bin/env python3
"""mlx-lm float32 greedy oracle: trajectories and first-step logits for MLX model folders.

Used two ways:
  * imported by make_fixtures.py (functions `load_f32`, `greedy`), and
  * run by `cargo xtask model` on a converted real model:
      python oracle.py --model DIR --steps 48 --out DIR/oracle.json
    which records a chat prompt (chat template applied) and a raw prompt.

The oracle is mlx-lm itself: its model classes, its loader, its KV caches and its
`generate_step` loop with the argmax sampler. The only change is that every floating
parameter is widened to float32 (`model.set_dtype(mx.float32)`); packed quantized
weights are integers and stay as they are, scales and biases widen exactly.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model

DEVICE = "mlx-cpu"
PRECISION = "f32"


def load_f32(model_dir):
    """Loads a model folder with mlx-lm's own loader and widens it to float32."""
    model, config = load_model(Path(model_dir))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model, config


def f32_list(values):
    """float32 values as the shortest decimals that read back to the same float32s."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32)]


def greedy(model, prompt_ids, steps):
    """Greedy continuation of `prompt_ids` for exactly `steps` tokens (EOS ignored).

    Returns (token_ids, first_logits, min_margin): the generated ids, the float32
    logits of the first generated step (full vocabulary) and the smallest gap between
    the best and the second-best logit over all steps (how close a step was to a tie).
    """
    first = []
    margins = []

    # A logits processor sees the raw logits of every step before sampling; it records
    # and returns them unchanged, so the loop is mlx-lm's own.
    def record(_tokens, logits):
        row = logits[0].astype(mx.float32)
        top2 = mx.topk(row, 2)
        mx.eval(row, top2)
        if not first:
            first.append(np.array(row))
        t = np.sort(np.array(top2))
        margins.append(float(t[-1] - t[-2]))
        return logits

    prompt = mx.array(prompt_ids, dtype=mx.uint32)
    out = []
    for token, _ in generate_step(
        prompt,
        model,
        max_tokens=steps,
        sampler=make_sampler(temp=0.0),
        logits_processors=[record],
    ):
        out.append(int(token))
    if len(out) != steps:
        raise RuntimeError(f"generate_step gave {len(out)} tokens, wanted {steps}")
    # generate_step computes one step ahead of what it yields; only the yielded
    # steps count.
    return out, first[0], min(margins[:steps])


def trajectory(model, prompt_ids, steps):
    """One trajectory record in the CLI contract's field names, plus first_logits."""
    ids, logits, margin = greedy(model, prompt_ids, steps)
    return {
        "prompt_ids": [int(i) for i in prompt_ids],
        "token_ids": ids,
        "device": DEVICE,
        "precision": PRECISION,
        "min_top2_margin": round(margin, 6),
        "first_logits": f32_list(logits),
    }


CHAT_PROMPT = "What is the capital of France?"
RAW_PROMPT = "The capital of France is"


def real_model_oracle(model_dir, steps):
    """Chat and raw prompt trajectories for a real model folder (with tokenizer)."""
    from mlx_lm.utils import load_tokenizer

    model, config = load_f32(model_dir)
    tokenizer = load_tokenizer(Path(model_dir), eos_token_ids=config.get("eos_token_id"))
    chat_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHAT_PROMPT}], add_generation_prompt=True, tokenize=False
    )
    cases = [
        ("chat", CHAT_PROMPT, chat_text),
        ("raw", RAW_PROMPT, RAW_PROMPT),
    ]
    records = []
    for kind, message, text in cases:
        ids = tokenizer.encode(text, add_special_tokens=False)
        rec = trajectory(model, ids, steps)
        rec = {
            "kind": kind,
            "message": message,
            "prompt_text": text,
            **rec,
            "text": tokenizer.decode(rec["token_ids"]),
        }
        records.append(rec)
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="MLX model folder")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", required=True, help="where to write oracle.json")
    args = ap.parse_args()
    import mlx_lm

    records = real_model_oracle(args.model, args.steps)
    doc = {
        "model": Path(args.model).name,
        "steps": args.steps,
        "generator": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "script": "xtask/python/oracle.py"},
        "trajectories": records,
    }
    tmp = Path(args.out).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    for r in records:
        print(f"[oracle] {r['kind']}: {r['prompt_text']!r} -> {r['text']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
