#!/usr/bin/env python3
"""A random-weight MLX checkpoint for a Llama-layout config.json, with numpy only.

    python3 random_checkpoint.py --config CONFIG.json --out DIR [--bits 4|8 --group-size N]
                                 [--dtype float16|bfloat16|float32] [--seed S]

Writes DIR/config.json, DIR/model.safetensors and DIR/model.safetensors.index.json laid
out as `mlx_lm.convert` leaves them, so `mlx-iree` (and mlx-lm) load the folder like a
converted model: the same tensor names, dtypes and shapes.

- Dense (no --bits): every tensor in --dtype; the config loses any "quantization" block.
- --bits B --group-size G: MLX affine quantization of every 2-D weight (projections and
  the embedding table, as mlx-lm's `quantize_model` does) whose input size G divides:
  `<name>.weight` uint32 [out, in*B/32] (element j of a row in bits (j%(32/B))*B of word
  j/(32/B), little-endian), `<name>.scales` and `<name>.biases` [out, in/G] in --dtype, so
  w = q * scale + bias. The config gains "quantization" and "quantization_config" =
  {"group_size": G, "bits": B, "mode": "affine"}.

Values are random but tame, so activations stay finite through every layer at any
precision: matrices ~ N(0, 0.02) (dense) or uniform in about +-0.035 (quantized: q uniform,
scale ~ 0.07/(2^B-1), bias = -scale*(2^B-1)/2), norm weights 1 + N(0, 0.02). No tokenizer is
written: benchmarks and the gate feed token ids. The safetensors files are written by hand
(8-byte little-endian header length, JSON header, raw little-endian data); the weights
only depend on --seed, not on the machine.
"""

import argparse
import hashlib
import json
import statistics
import struct
import sys
from pathlib import Path

import numpy as np

SUPPORTED = ("llama", "mistral", "qwen2")
WEIGHT_STD = 0.02
NORM_STD = 0.02
# Half-width of the quantized weights' range (a uniform of std ~0.02).
QUANT_AMP = 0.035
DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "U32": 4}
# Rows generated at a time (bounds memory for the 128k x 2048 embedding table).
CHUNK_ELEMS = 1 << 24


def fail(msg):
    sys.exit(f"random_checkpoint: error: {msg}")


def param_list(cfg):
    """(name, shape, kind) of every parameter, kind in {"matrix", "norm", "bias"}."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED:
        fail(f"model_type {model_type!r} is not supported (expected one of {', '.join(SUPPORTED)})")
    try:
        hidden = int(cfg["hidden_size"])
        inter = int(cfg["intermediate_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        fail(f"config.json: missing or bad field {e}")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    qkv_bias = bool(cfg.get("attention_bias", False)) or model_type == "qwen2"
    o_bias = bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    out = [("model.embed_tokens.weight", (vocab, hidden), "matrix")]
    for i in range(layers):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (hidden,), "norm"))
        out.append((p + "post_attention_layernorm.weight", (hidden,), "norm"))
        for name, rows, cols, bias in [
            ("self_attn.q_proj", heads * head_dim, hidden, qkv_bias),
            ("self_attn.k_proj", kv_heads * head_dim, hidden, qkv_bias),
            ("self_attn.v_proj", kv_heads * head_dim, hidden, qkv_bias),
            ("self_attn.o_proj", hidden, heads * head_dim, o_bias),
            ("mlp.gate_proj", inter, hidden, mlp_bias),
            ("mlp.up_proj", inter, hidden, mlp_bias),
            ("mlp.down_proj", hidden, inter, mlp_bias),
        ]:
            out.append((p + name + ".weight", (rows, cols), "matrix"))
            if bias:
                out.append((p + name + ".bias", (rows,), "bias"))
    out.append(("model.norm.weight", (hidden,), "norm"))
    if not cfg.get("tie_word_embeddings", True):
        out.append(("lm_head.weight", (vocab, hidden), "matrix"))
    return out


_NORMAL_TABLE = []


def normal_table():
    """65536 standard-normal quantiles, built once."""
    if not _NORMAL_TABLE:
        nd = statistics.NormalDist()
        _NORMAL_TABLE.append(np.array([nd.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32))
    return _NORMAL_TABLE[0]


class Gen:
    """Fast random values seeded by (seed, tensor name): uniform bits from PCG64, normals by
    a 65536-entry inverse-CDF table (one gather per element, no Box-Muller)."""

    def __init__(self, seed, name):
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        self.rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))
        self.table = normal_table()

    def u16(self, n):
        return np.frombuffer(self.rng.bytes(2 * n), dtype="<u2")

    def u32(self, n):
        return np.frombuffer(self.rng.bytes(4 * n), dtype="<u4")

    def normal(self, n):
        return self.table[self.u16(n)]

    def uniform(self, n):
        return self.u16(n).astype(np.float32) * (1.0 / 65536)


_ENCODED = {}


def encoded_table(std, tag):
    """The normal table times `std`, already in `tag`'s byte layout (as a numpy array)."""
    key = (std, tag)
    if key not in _ENCODED:
        dt = {"F16": "<f2", "BF16": "<u2", "F32": "<f4"}[tag]
        _ENCODED[key] = np.frombuffer(encode(std * normal_table(), tag), dtype=dt)
    return _ENCODED[key]


def encode(x, tag):
    """float32 array -> little-endian bytes of dtype `tag`."""
    if tag == "F32":
        return x.astype("<f4").tobytes()
    if tag == "F16":
        return x.astype("<f2").tobytes()
    if tag == "BF16":
        # Round to nearest even on the upper 16 bits of the float32.
        bits = x.astype("<f4").view("<u4")
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype("<u2").tobytes()
    raise ValueError(tag)


def plan(params, dtype_tag, bits, group_size):
    """The tensors to write: (name, dtype tag, shape, maker(gen) -> iterator of bytes)."""
    tensors = []
    for name, shape, kind in params:
        if kind == "matrix" and bits and shape[1] % group_size == 0:
            rows, cols = shape
            base = name[: -len(".weight")]
            levels = (1 << bits) - 1
            per_word = 32 // bits
            words = cols // per_word
            groups = cols // group_size
            tensors.append((base + ".weight", "U32", (rows, words), ("qweight", rows, words)))
            tensors.append((base + ".scales", dtype_tag, (rows, groups), ("scales", rows, groups, levels)))
            tensors.append((base + ".biases", dtype_tag, (rows, groups), ("biases", rows, groups, levels)))
        else:
            tensors.append((name, dtype_tag, shape, (kind,)))
    return tensors


def chunks(total_rows, row_elems):
    step = max(1, CHUNK_ELEMS // max(1, row_elems))
    for r in range(0, total_rows, step):
        yield min(step, total_rows - r)


def data(gen, tag, shape, how):
    """Yields the tensor's bytes in pieces."""
    kind = how[0]
    n = 1
    for d in shape:
        n *= d
    if kind == "norm":
        yield encode(1.0 + NORM_STD * gen.normal(n), tag)
    elif kind == "bias":
        yield encode(WEIGHT_STD * gen.normal(n), tag)
    elif kind == "matrix":
        # The bulk of the bytes: one gather from a table of already-encoded values.
        rows, cols = shape
        table = encoded_table(WEIGHT_STD, tag)
        for r in chunks(rows, cols):
            yield table[gen.u16(r * cols)].tobytes()
    elif kind == "qweight":
        _, rows, words = how
        for r in chunks(rows, words):
            yield gen.u32(r * words).tobytes()
    elif kind in ("scales", "biases"):
        # The scales and the biases of one layer come from the same per-group draw (both
        # get a generator seeded by the layer's name), so bias = -scale*levels/2 centres
        # every group on zero.
        _, rows, groups, levels = how
        n = rows * groups
        scale = (2 * QUANT_AMP / levels) * (0.75 + 0.5 * gen.uniform(n))
        if kind == "scales":
            yield encode(scale, tag)
        else:
            yield encode(-scale * (levels / 2.0), tag)
    else:
        raise ValueError(kind)


def write(out_dir, cfg, tensors, seed, dense_params):
    header = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, tag, shape, _ in tensors:
        size = ITEMSIZE[tag]
        for d in shape:
            size *= d
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path = out_dir / "model.safetensors"
    partial = out_dir / "model.safetensors.partial"
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, (name, tag, shape, how) in enumerate(tensors):
            # One seed per tensor (scales and biases of a layer share one), so a tensor's
            # values do not depend on which other tensors were written before it.
            base = name.rsplit(".", 1)[0] if how[0] in ("scales", "biases") else name
            gen = Gen(seed, base)
            written = 0
            for piece in data(gen, tag, shape, how):
                f.write(piece)
                written += len(piece)
            want = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if written != want:
                raise AssertionError(f"{name}: wrote {written} bytes, expected {want}")
    partial.replace(path)
    index = {
        "metadata": {"total_size": offset, "total_parameters": dense_params},
        "weight_map": {name: "model.safetensors" for name, _, _, _ in sorted(tensors)},
    }
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=4) + "\n")
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a Hugging Face / MLX config.json")
    ap.add_argument("--out", required=True, help="the model folder to write (created)")
    ap.add_argument("--bits", type=int, choices=(4, 8), help="MLX affine quantization bits")
    ap.add_argument("--group-size", type=int, default=64, help="quantization group size (default 64)")
    ap.add_argument("--dtype", default="float16", choices=sorted(DTYPES), help="dense/scale dtype")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.group_size <= 0 or args.group_size % (32 // (args.bits or 4)):
        fail(f"--group-size {args.group_size} must be a positive multiple of {32 // (args.bits or 4)}")
    cfg = json.loads(Path(args.config).read_text())
    params = param_list(cfg)
    dense_params = sum(int(np.prod(s)) for _, s, _ in params)
    tag = DTYPES[args.dtype]
    tensors = plan(params, tag, args.bits, args.group_size)

    cfg = dict(cfg)
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    if args.bits:
        q = {"group_size": args.group_size, "bits": args.bits, "mode": "affine"}
        cfg["quantization"] = q
        cfg["quantization_config"] = dict(q)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = write(out, cfg, tensors, args.seed, dense_params)
    # As mlx-lm's save_config: keys sorted, 4-space indent.
    (out / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=4) + "\n")
    what = f"{args.bits}-bit (group {args.group_size})" if args.bits else "dense"
    print(f"wrote {out}: {what} {args.dtype}, {len(tensors)} tensors, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
