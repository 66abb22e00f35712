#!/usr/bin/env python3
"""mlx-lm's greedy trajectories with its KV cache rounded as mlx-iree's `--kv-cache q8`.

Run by `cargo xtask fixtures` after make_fixtures.py (see tests/fixtures/README.md):
    python q8_kv_reference.py --fixtures tests/fixtures [--only NAME]

mlx-iree's 8-bit KV cache stores each 16 values of a cached key or value row (along the
head's width) as 16 int8 and one f32 scale, and attention reads them back as q * s
(`kernels::cpu::q8_block`): a = the 16 values' largest magnitude, inv = 127 / a (0 where
a = 0), s = a / 127, q = x * inv rounded to nearest even. Every cached row is rounded so
before any attention reads it, the step's own new rows too. Like bfloat16 weights, that
keeps about 8 significant bits, and the random-weight fixtures' near ties (top-2 gaps down
to 0.003) flip under it, so expected.json (mlx-lm in float32) cannot check it. This script
gives the reference that can: for every `<fixture>/f32/` with an expected.json it

  * loads the folder with mlx-lm's loader in float32 (`oracle.load_f32`),
  * rounds what every attention layer's cache stores through that format as it is stored
    (mlx-lm's `KVCache` and `RotatingKVCache` `update_and_fetch`, the caches every fixture's
    attention layers use; a latent attention layer caches its latents and rotated keys,
    which mlx-iree's cache holds too), recurrent layers' state untouched,
  * records mlx-lm's float32 greedy trajectories (`oracle.trajectory`) for the prompts and
    steps of expected.json,

and writes them as `expected_q8kv.json` next to expected.json. gemma2_window is left out:
its reference recomputes every step without a cache. Deterministic: rerunning gives
byte-identical files.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm.models import cache as mlx_cache

import oracle
import rounded_reference

SCRIPT = "xtask/python/q8_kv_reference.py"
PRECISION = "f32, q8 KV cache"
ABOUT = (
    "mlx-lm's float32 greedy trajectories of this folder's model with every row its attention "
    "layers cache (keys and values; a latent attention's latents and rotated keys) rounded, as it "
    "is stored, through mlx-iree's 8-bit KV cache: per 16 values along the row, a = the largest "
    "magnitude, q = round-to-nearest-even(x * (127 / a)), read back as q * (a / 127), in float32; "
    "weights and all other compute in float32"
)
BLOCK = 16
# Fixtures whose reference is not a cached decode (make_fixtures.py's windowed recompute).
SKIP = {"gemma2_window"}
ROUNDED = (mlx_cache.KVCache, mlx_cache.RotatingKVCache)


def q8_round(x):
    """float32 [.., width] -> each 16 values through the 8-bit format and back, checked bit
    for bit against the same steps written out in numpy."""
    if x.shape[-1] % BLOCK:
        raise SystemExit(f"a cached row of width {x.shape[-1]}: not a multiple of {BLOCK}")
    x = x.astype(mx.float32)
    b = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    a = mx.max(mx.abs(b), axis=-1, keepdims=True)
    inv = mx.where(a > 0, mx.array(127.0, mx.float32) / a, mx.array(0.0, mx.float32))
    q = mx.round(b * inv) + mx.array(0.0, mx.float32)
    out = (q * (a / mx.array(127.0, mx.float32))).reshape(x.shape)
    xn = np.array(b)
    an = np.abs(xn).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        invn = np.where(an > 0, np.float32(127.0) / an, np.float32(0.0)).astype(np.float32)
    want = ((np.rint(xn * invn) + np.float32(0.0)) * (an / np.float32(127.0))).astype(np.float32)
    if not np.array_equal(np.array(out).view(np.uint32), want.reshape(x.shape).view(np.uint32)):
        raise SystemExit("mlx's rounding of a cache row differs from the format written out in numpy")
    return out


class Rounding:
    """While active, every KVCache and RotatingKVCache stores its new rows rounded; counts
    the rows it rounded."""

    def __enter__(self):
        self.saved = {cls: cls.update_and_fetch for cls in ROUNDED}
        self.calls = 0

        def wrap(orig):
            def update_and_fetch(cache, keys, values):
                self.calls += 1
                return orig(cache, q8_round(keys), q8_round(values))

            return update_and_fetch

        for cls, orig in self.saved.items():
            cls.update_and_fetch = wrap(orig)
        return self

    def __exit__(self, *exc):
        for cls, orig in self.saved.items():
            cls.update_and_fetch = orig
        return False


def record(model_dir):
    """expected_q8kv.json for one folder, for the prompts and steps of its expected.json."""
    expected = json.loads((Path(model_dir) / "expected.json").read_text())
    model, _ = oracle.load_f32(model_dir)
    # Every cache the model makes is one this script rounds, or a recurrent layer's state.
    for c in mlx_cache.make_prompt_cache(model):
        if not isinstance(c, ROUNDED + (mlx_cache.ArraysCache,)):
            raise SystemExit(f"{model_dir}: a {type(c).__name__}, which this script does not round")
    steps = expected["steps"]
    trajs = []
    with Rounding() as rounding:
        for t in expected["trajectories"]:
            rec = oracle.trajectory(model, t["prompt_ids"], steps)
            rec["precision"] = PRECISION
            trajs.append(rec)
    if rounding.calls == 0:
        raise SystemExit(f"{model_dir}: no cache row was rounded")
    return rounded_reference.reference_doc(expected, ABOUT, SCRIPT, trajs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", required=True, help="tests/fixtures")
    ap.add_argument("--only", action="append", help="only this fixture (repeatable)")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    dirs = sorted(p.parent for p in Path(args.fixtures).glob("*/f32/expected.json"))
    if not dirs:
        raise SystemExit(f"no <fixture>/f32/expected.json under {args.fixtures}")
    for d in dirs:
        name = d.parent.name
        if name in SKIP or (args.only and name not in args.only):
            continue
        rounded_reference.write_reference(d, "expected_q8kv.json", "q8 KV cache", *record(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
