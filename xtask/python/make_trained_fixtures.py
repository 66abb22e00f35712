#!/usr/bin/env python3
"""Tiny *trained* MLX checkpoints plus mlx-lm's greedy trajectories, for precision gating.

Run by `cargo xtask fixtures` (see tests/fixtures-trained/README.md):
    python make_trained_fixtures.py --out tests/fixtures-trained

The random-weight fixtures (make_fixtures.py) have near-flat logits: their top-2 gaps go
down to 0.003, so any change of rounding (bfloat16's 8-bit mantissa) flips some steps.
Real checkpoints are trained: their greedy steps are confident. These fixtures are the
same architectures (the configs of make_fixtures.py) trained with mlx until they are
confident, on a synthetic corpus every position of which is predictable:

  a cyclic sequence of CYCLE token ids in which every pair of consecutive ids occurs
  once, so the next id is a function of the two before it.

Training (mlx's Adam on random windows of the cycle) stops when, over every position of
the cycle and every window offset, the correct next id wins by at least MARGIN_GOAL
logits. The saved variants are made and recorded exactly as make_fixtures.py does
(f32, q4 with bfloat16 rest, q8 with float16 rest; mlx-lm's float32 trajectories), and the
prompts are pieces of the cycle.
"""

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

import make_fixtures as mf
import oracle

CYCLE = 160
WINDOW = 64
BATCH = 8
LEARNING_RATE = 3e-3
MARGIN_GOAL = 1.0
MAX_STEPS = 4000
EVAL_EVERY = 50
# Recorded trajectories must stay confident after quantization, too.
MIN_MARGIN = 0.5
# Prompt lengths as in the random fixtures (1, 5, 12), cut from the cycle; the one-id
# prompt is an id that occurs once in the cycle, so it determines what follows.
PROMPT_STARTS = [(None, 1), (40, 5), (100, 12)]
STEPS = mf.STEPS
# Every architecture of the random fixtures; gemma2_window's point is its reference for
# the window, which needs no second copy here.
NAMES = [
    "llama_llama3_tied",
    "llama_linear_untied",
    "mistral",
    "mixtral",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "qwen3_5",
    "lfm2",
]


def corpus(rng, vocab):
    """A cycle of CYCLE ids with every consecutive (cyclic) pair distinct."""
    while True:
        seq = rng.integers(0, min(vocab, 256), CYCLE)
        pairs = {(int(seq[i]), int(seq[(i + 1) % CYCLE])) for i in range(CYCLE)}
        counts = np.bincount(seq, minlength=256)
        if len(pairs) == CYCLE and (counts == 1).any():
            return seq


def prompts(seq):
    out = []
    counts = np.bincount(seq, minlength=256)
    for start, length in PROMPT_STARTS:
        if start is None:
            start = int(np.flatnonzero(counts[seq] == 1)[0])
        out.append([int(seq[(start + i) % CYCLE]) for i in range(length)])
    return out


def windows(seq, offsets):
    """(inputs, targets) for windows of the cycle starting at `offsets`."""
    idx = (np.asarray(offsets)[:, None] + np.arange(WINDOW + 1)[None, :]) % CYCLE
    batch = seq[idx]
    return mx.array(batch[:, :-1], dtype=mx.int32), mx.array(batch[:, 1:], dtype=mx.int32)


def fresh(config, seed):
    """mlx-lm's model for `config` with its own default initialisation, seeded."""
    mx.random.seed(seed)
    model = mf.new_model(config)
    mx.eval(model.parameters())
    return model


def margin(model, seq):
    """Smallest (correct logit - best other logit) over every window offset and every
    position from the second on (the first sees one id, which need not determine the next)."""
    x, y = windows(seq, np.arange(CYCLE))
    logits = model(x).astype(mx.float32)[:, 1:]
    y = y[:, 1:]
    right = mx.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    others = mx.where(mx.arange(logits.shape[-1]) == y[..., None], -mx.inf, logits)
    return float(mx.min(right - mx.max(others, axis=-1)).item())


def train(model, seq, rng, name):
    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y, reduction="mean")

    opt = optim.Adam(learning_rate=LEARNING_RATE)
    grad_fn = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state]

    # One compiled graph per step: uncompiled, mlx's per-op overhead dominates at this size.
    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x, y):
        loss, grads = grad_fn(model, x, y)
        opt.update(model, grads)
        return loss

    started = time.time()
    for step in range(1, MAX_STEPS + 1):
        x, y = windows(seq, rng.integers(0, CYCLE, BATCH))
        loss = step_fn(x, y)
        mx.eval(state, loss)
        if step % EVAL_EVERY == 0:
            m = margin(model, seq)
            print(
                f"[fixtures-trained] {name}: step {step} loss {loss.item():.4f} margin {m:.2f} "
                f"({time.time() - started:.0f} s)",
                flush=True,
            )
            if m >= MARGIN_GOAL:
                return step, m
    raise SystemExit(f"{name}: margin below {MARGIN_GOAL} after {MAX_STEPS} steps")


def make_one(fixture, out_root, seed):
    name = fixture["name"]
    config = fixture["config"]
    rng = np.random.default_rng(seed)
    seq = corpus(rng, config["vocab_size"])
    model = fresh(config, seed)
    steps, m = train(model, seq, rng, name)
    trained = list(tree_flatten(model.parameters()))
    ps = prompts(seq)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        docs = {}
        for variant, q in mf.VARIANTS.items():
            variant_model = fresh(config, seed)
            variant_model.load_weights(trained)
            bits, dtype = q if q else (None, None)
            mf.save_variant(variant_model, config, tmp / variant, bits, dtype, fixture["group_size"])
            doc = record(tmp / variant, fixture, variant, seed, ps, seq, steps, m)
            worst = min(t["min_top2_margin"] for t in doc["trajectories"])
            print(f"[fixtures-trained] {name} {variant}: min top-2 margin {worst:.3f}", flush=True)
            if worst < MIN_MARGIN:
                raise SystemExit(f"{name} {variant}: a recorded step has a top-2 margin below {MIN_MARGIN}")
            docs[variant] = doc
        mf.install(tmp, out_root / name, docs)


def record(model_dir, fixture, variant, seed, ps, seq, train_steps, train_margin):
    model, _ = oracle.load_f32(model_dir)
    trajs = [oracle.trajectory(model, p, STEPS) for p in ps]
    training = {"cycle": [int(i) for i in seq], "steps": train_steps, "margin": round(train_margin, 3)}
    return mf.expected_doc(
        fixture,
        variant,
        seed,
        trajs,
        "xtask/python/make_trained_fixtures.py",
        about_suffix="; trained on a cycle of ids",
        extra={"training": training},
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="tests/fixtures-trained")
    ap.add_argument("--only", action="append", help="make only this fixture (repeatable)")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    by_name = {f["name"]: f for f in mf.FIXTURES}
    for name in NAMES:
        if args.only and name not in args.only:
            continue
        make_one(by_name[name], out_root, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
