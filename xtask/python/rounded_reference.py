#!/usr/bin/env python3
"""mlx-lm's greedy trajectories with bfloat16-rounded weights, for checking bf16 precision.

Run by `cargo xtask fixtures` after make_fixtures.py (see tests/fixtures/README.md):
    python rounded_reference.py --fixtures tests/fixtures [--only NAME]

The engine's bf16 precision rounds every weight matrix (linear weights, embedding,
lm_head, and each expert's of stacked expert weights) to bfloat16, round-to-nearest-even, keeps 1-D tensors (norms, biases) in
float32 and computes everything in float32. A quantized matrix is first dequantized to
float32 (`scale * q + bias`) and that is rounded. The random-weight fixtures have
near-tie logits (top-2 gaps down to 0.003), so such rounding flips some of their greedy
steps and expected.json (mlx-lm in float32) cannot check it. This script gives the
reference that can: for every `<fixture>/<variant>/` with an expected.json it

  * loads the folder with mlx-lm's loader, widened to float32 (`oracle.load_f32`),
  * applies exactly that rounding to the weights and puts them into a fresh unquantized
    float32 instance of the same mlx-lm model class (built from the folder's config.json
    as make_fixtures.py builds it),
  * records mlx-lm's float32 greedy trajectories (`oracle.trajectory`; for gemma2_window
    make_fixtures.py's windowed recompute) for the prompts and steps of expected.json,

and writes them as `expected_bf16.json` next to expected.json. Deterministic: rerunning
gives byte-identical files.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.models.mla import QuantizedMultiLinear

import make_fixtures
import oracle

SCRIPT = "xtask/python/rounded_reference.py"
PRECISION = "bf16"
ABOUT = (
    "mlx-lm's float32 greedy trajectories of this folder's model with every 2-D weight "
    "and 3-D stacked expert or per-head weight "
    "(linear weights, embedding, lm_head, experts, latent attention's embed_q and unembed_out; quantized ones first dequantized to float32 as "
    "scale * q + bias) rounded to bfloat16 (round-to-nearest-even) and widened back to "
    "float32, 1-D tensors (norms, biases) and convolution weights unchanged in float32, all compute in float32"
)
QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear, QuantizedMultiLinear)
# 3-D weights rounded like 2-D ones: stacked experts, and per-head matrices (mlx-lm's MultiLinear).
STACKED = (".switch_mlp.", ".switch_glu.", ".mlp.experts.", ".embed_q.", ".unembed_out.")
# Fixtures whose reference is make_fixtures.py's windowed recompute, by name.
WINDOWED = {f["name"]: f.get("reference") == "gemma2_even_layer_window" for f in make_fixtures.FIXTURES}


def bf16_round(w):
    """float32 -> nearest bfloat16 (ties to even) -> float32, checked bit for bit
    against the rounding written out on the float32 bit patterns."""
    out = w.astype(mx.bfloat16).astype(mx.float32)
    u = np.array(w).view(np.uint32).astype(np.uint64)
    want = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
    if not np.array_equal(np.array(out).view(np.uint32), want):
        raise SystemExit("mlx's float32 -> bfloat16 cast is not round-to-nearest-even here")
    return out


def dequantize_f32(module):
    """A quantized module's weight as float32 (`scale * q + bias`), checked bit for bit
    against that formula written out in numpy."""
    if module.mode != "affine":
        raise SystemExit(f"only affine quantization is handled, got mode {module.mode!r}")
    if module.scales.dtype != mx.float32 or module.biases.dtype != mx.float32:
        raise SystemExit("quantization scales and biases should be float32 after load_f32")
    w = mx.dequantize(
        module.weight,
        module.scales,
        module.biases,
        group_size=module.group_size,
        bits=module.bits,
        mode=module.mode,
    )
    packed = np.array(module.weight)
    bits = module.bits
    q = np.stack([(packed >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)], -1)
    q = q.reshape(*packed.shape[:-1], -1).astype(np.float32)
    scales = np.repeat(np.array(module.scales), module.group_size, -1)
    biases = np.repeat(np.array(module.biases), module.group_size, -1)
    if w.dtype != mx.float32 or not np.array_equal(np.array(w).view(np.uint32), (scales * q + biases).view(np.uint32)):
        raise SystemExit("mx.dequantize differs from float32 scale * q + bias")
    return w


def rounded_weights(loaded):
    """{parameter name: float32 array} for an unquantized model: every 2-D weight and 3-D
    stacked expert or per-head weight rounded through bfloat16, every 1-D tensor as it is."""
    params = dict(tree_flatten(loaded.parameters()))
    out = {}
    for path, module in loaded.named_modules():
        if isinstance(module, QUANTIZED):
            for key in ("weight", "scales", "biases"):
                del params[f"{path}.{key}"]
            out[f"{path}.weight"] = bf16_round(dequantize_f32(module))
    for name, p in params.items():
        if p.dtype != mx.float32:
            raise SystemExit(f"{name}: {p.dtype} after load_f32, expected float32")
        # Biases stay float32 at every precision, gpt-oss's stacked expert biases `[E, out]` too.
        if name.endswith(".bias"):
            out[name] = p
        elif p.ndim == 2 or (p.ndim == 3 and any(part in name for part in STACKED)):
            out[name] = bf16_round(p)
        elif p.ndim == 1 or name.endswith("conv1d.weight") or name.endswith("conv.conv.weight"):
            # 1-D tensors and the depthwise convolutions' weights (a gated DeltaNet's, LFM2's
            # short convolutions), which mlx-iree keeps in float32 at every precision.
            out[name] = p
        else:
            raise SystemExit(f"{name}: a {p.ndim}-D parameter {p.shape}; the rounding is defined for 1-D, 2-D, experts and per-head matrices")
    return out


def rounded_model(model_dir):
    """The folder's model as float32 mlx-lm model with bfloat16-rounded 2-D weights."""
    loaded, _ = oracle.load_f32(model_dir)
    weights = rounded_weights(loaded)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    model = make_fixtures.new_model(config)
    fresh = dict(tree_flatten(model.parameters()))
    missing = sorted(set(fresh) - set(weights))
    extra = sorted(set(weights) - set(fresh))
    if missing or extra:
        raise SystemExit(f"{model_dir}: parameters without a value {missing}, values without a parameter {extra}")
    for name, p in fresh.items():
        if p.shape != weights[name].shape:
            raise SystemExit(f"{model_dir}: {name} is {p.shape} in the model, {weights[name].shape} rounded")
    model.update(tree_unflatten(sorted(weights.items())))
    mx.eval(model.parameters())
    for name, p in tree_flatten(model.parameters()):
        if p.dtype != mx.float32 or not mx.array_equal(p, weights[name]).item():
            raise SystemExit(f"{model_dir}: {name} did not take its rounded value")
    return model, config


def record(model_dir):
    """expected_bf16.json for one folder, for the prompts and steps of its expected.json."""
    expected = json.loads((Path(model_dir) / "expected.json").read_text())
    model, config = rounded_model(model_dir)
    steps = expected["steps"]
    trajs = []
    for t in expected["trajectories"]:
        if WINDOWED[expected["fixture"]]:
            rec = make_fixtures.recompute_trajectory(model, t["prompt_ids"], steps, config["sliding_window"])
        else:
            rec = oracle.trajectory(model, t["prompt_ids"], steps)
        rec["precision"] = PRECISION
        trajs.append(rec)
    return reference_doc(expected, ABOUT, SCRIPT, trajs)


def reference_doc(expected, about, script, trajs):
    """A rounded reference file (`expected.json`'s shape, its fixture, weights and steps,
    this about, script and trajectories) and how many trajectories differ from expected.json's;
    q8_kv_reference.py's too."""
    doc = {
        "fixture": expected["fixture"],
        "variant": expected["variant"],
        "model_type": expected["model_type"],
        "about": about,
        "weights": expected["weights"],
        "steps": expected["steps"],
        "generator": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "script": script},
        "trajectories": trajs,
    }
    differing = sum(a["token_ids"] != b["token_ids"] for a, b in zip(trajs, expected["trajectories"]))
    return doc, differing


def write_reference(folder, file, what, doc, differing):
    """Writes a reference_doc into `folder`/`file` and says so in a progress line."""
    (folder / file).write_text(json.dumps(doc, indent=1) + "\n")
    margin = min(t["min_top2_margin"] for t in doc["trajectories"])
    print(
        f"[fixtures] {folder.parent.name}/{folder.name} {what}: min top-2 margin {margin:.4f}, "
        f"trajectories differing from expected.json: {differing} of {len(doc['trajectories'])}",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", required=True, help="tests/fixtures")
    ap.add_argument("--only", action="append", help="only this fixture (repeatable)")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    # The affine variants (f32, q4, q8); the floating-point mode variants have no bf16 test.
    dirs = sorted(p.parent for p in Path(args.fixtures).glob("*/*/expected.json") if p.parent.name in ("f32", "q4", "q8"))
    if not dirs:
        raise SystemExit(f"no <fixture>/<variant>/expected.json under {args.fixtures}")
    for d in dirs:
        if args.only and d.parent.name not in args.only:
            continue
        write_reference(d, "expected_bf16.json", "bf16 weights", *record(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
