#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python) on the models `cargo xtask bench` measures.

Run by `cargo xtask bench --peers` with the peers venv's python (target/peers-venv),
one subcommand per call:

    python peers.py convert   --src MLX_F16_DIR --out FILE-f16.gguf [--vocab-gguf ORIGINAL.gguf]
    python peers.py quantize  --src FILE-f16.gguf --out FILE-q4_0.gguf --type q4_0
    python peers.py bench     --gguf FILE.gguf --prompt-ids 1,38,... --steps N --repeats N
    python peers.py bandwidth

Each prints one JSON line on stdout (progress goes to stderr).

  * convert: a Hugging Face / MLX float folder of a Llama-architecture model
    (LlamaForCausalLM) -> GGUF f16, following llama.cpp's own convert_hf_to_gguf.py
    (LlamaModel) without torch: the same tensor names, the same row permutation of
    q_proj / k_proj for ggml's interleaved RoPE, 1-D tensors (norms) as f32, llama3
    RoPE scaling as a `rope_freqs` tensor. The vocabulary is not converted: the
    benchmark feeds token ids, so the file says `tokenizer.ggml.model = none` with
    `llama.vocab_size`, which llama.cpp loads as that many placeholder tokens. With
    --vocab-gguf, every `tokenizer.*` key of that GGUF (SmolLM2's original, which the
    MLX folders were made from) is copied instead, so llama-server can tokenize the text
    prompts of `cargo xtask bench --serve --peers`; the random Llama-3.2-1B shape gets
    the same, padded with unused tokens to its 128,256 rows (its MLX folders carry
    SmolLM2's tokenizer files likewise).
  * quantize: llama.cpp's `llama_model_quantize` (its standard recipe for the type, as
    `llama-quantize` would do it).
  * bench: loads the GGUF on the CPU with n_threads = the CPUs this process may use,
    then per repeat: clear the KV cache, prefill the prompt ids in one batch, greedy
    (argmax) decode `steps` tokens one at a time. Wall clock around the llama_decode
    calls (plus the argmax); medians over the repeats. Peak RSS is the process's
    ru_maxrss; weight bytes are llama_model_size (the GGUF's tensor bytes).
  * bandwidth: memory read bandwidth of this machine now: one numpy thread per CPU,
    each taking the maximum (a vectorised integer reduction, so the reads and not the
    arithmetic set the pace) of its share of a 1 GiB array of written pages, larger than
    the last-level cache of the machine this was written on (480 MiB); bytes read /
    seconds, best of 7 passes.
"""

import argparse
import ctypes
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench_row import print_row


def log(msg):
    print(f"peers.py: {msg}", file=sys.stderr, flush=True)


def threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------
# convert


def safetensors_index(src):
    """{tensor name: (file, header entry)} over the folder's safetensors files."""
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"peers.py: no .safetensors files in {src}")
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        for name, entry in header.items():
            out[name] = (f, 8 + n, entry)
    return out


DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}


def load(index, name):
    """One tensor as a numpy array (float16 or float32), memory-mapped where possible."""
    if name not in index:
        raise SystemExit(f"peers.py: tensor {name} not found")
    f, base, e = index[name]
    dtype = e["dtype"]
    if dtype not in DTYPES:
        raise SystemExit(
            f"peers.py: {f}: tensor {name} has dtype {dtype}; conversion needs a float "
            "checkpoint (an MLX quantized folder cannot be converted, use its f16 folder)"
        )
    start, end = e["data_offsets"]
    a = np.memmap(f, dtype=DTYPES[dtype], mode="r", offset=base + start, shape=tuple(e["shape"]))
    assert a.nbytes == end - start, name
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute (HF half-split RoPE rows -> ggml's)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg, rope):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    base = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rope.get("factor", 8.0)
    low = rope.get("low_freq_factor", 1.0)
    high = rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def copy_tokenizer(w, path, vocab_size):
    """Every `tokenizer.*` key of the GGUF at `path`, with its value types, into writer `w`.

    A model with more embedding rows than the tokenizer has tokens (the random 1B shape,
    128,256 rows, given SmolLM2's 49,152 tokens) gets the rest as unused `[PAD<id>]`
    tokens, as llama.cpp's convert_hf_to_gguf.py pads a short vocabulary."""
    import gguf

    fields = gguf.GGUFReader(path).fields
    tokens = fields.get("tokenizer.ggml.tokens")
    have = None if tokens is None else len(tokens.contents())
    if have is None or have > vocab_size:
        raise SystemExit(f"peers.py: {path} has {have or 'no'} tokens; the model's vocab_size is {vocab_size}")
    pad = range(have, vocab_size)
    for key, field in fields.items():
        if not key.startswith("tokenizer."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            contents = field.contents()
            if key == "tokenizer.ggml.tokens":
                contents = contents + [f"[PAD{i}]" for i in pad]
            elif key == "tokenizer.ggml.token_type":
                contents = contents + [int(gguf.TokenType.UNUSED)] * len(pad)
            elif key == "tokenizer.ggml.scores":
                contents = contents + [0.0] * len(pad)
            w.add_key_value(key, contents, field.types[0], sub_type=field.types[1])
        else:
            w.add_key_value(key, field.contents(), field.types[0])


def convert(args):
    import gguf

    src = Path(args.src)
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"peers.py: {src}: model_type {cfg.get('model_type')!r}; only llama is converted")
    if "quantization" in cfg or "quantization_config" in cfg:
        raise SystemExit(f"peers.py: {src} is a quantized MLX folder; convert its float (f16) folder")
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    n_embd = cfg["hidden_size"]
    n_layer = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or n_embd // n_head
    index = safetensors_index(src)

    out = Path(args.out)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name(src.name)
    w.add_block_count(n_layer)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(head_dim)
    if head_dim != n_embd // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if args.vocab_gguf:
        copy_tokenizer(w, args.vocab_gguf, cfg["vocab_size"])
    else:
        # Ids only: llama.cpp makes vocab_size placeholder tokens (see the module docstring).
        w.add_tokenizer_model("none")

    def f16(a):
        return np.ascontiguousarray(a, dtype=np.float16)

    def f32(a):
        return np.ascontiguousarray(a, dtype=np.float32)

    w.add_tensor("token_embd.weight", f16(load(index, "model.embed_tokens.weight")))
    w.add_tensor("output_norm.weight", f32(load(index, "model.norm.weight")))
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" in index:
        w.add_tensor("output.weight", f16(load(index, "lm_head.weight")))
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if str(rope.get("rope_type", rope.get("type", ""))).lower() == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg, rope))
    for i in range(n_layer):
        for hf, gg in LAYER_TENSORS.items():
            a = load(index, f"model.layers.{i}.{hf}")
            if hf.startswith("self_attn.q_proj"):
                a = permute(np.asarray(a), n_head, n_head)
            elif hf.startswith("self_attn.k_proj"):
                a = permute(np.asarray(a), n_head, n_kv)
            w.add_tensor(f"blk.{i}.{gg}", f32(a) if a.ndim == 1 else f16(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(json.dumps({"gguf": str(out), "bytes": out.stat().st_size}))


# ---------------------------------------------------------------------------------------
# llama.cpp


def quiet_llama_cpp():
    """llama_cpp, with llama.cpp's log reduced to warnings and errors."""
    import llama_cpp

    last = [0]

    @llama_cpp.llama_log_callback
    def callback(level, text, _user):
        # ggml_log_level: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line).
        if level != 5:
            last[0] = level
        if last[0] >= 3:
            sys.stderr.write(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    quiet_llama_cpp.callback = callback  # the C side keeps only the pointer
    llama_cpp.llama_backend_init()
    return llama_cpp


QUANT_TYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def quantize(args):
    llama_cpp = quiet_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_TYPES[args.type])
    params.nthread = threads()
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.out.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"peers.py: llama_model_quantize({args.src} -> {args.out}, {args.type}) returned {rc}")
    print(json.dumps({"gguf": args.out, "bytes": Path(args.out).stat().st_size}))


def bench(args):
    llama_cpp = quiet_llama_cpp()
    ids = [int(x) for x in args.prompt_ids.split(",")]
    n_threads = args.threads or threads()

    started = time.perf_counter()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(args.gguf.encode(), mparams)
    if not model:
        raise SystemExit(f"peers.py: llama.cpp could not load {args.gguf}")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = len(ids) + args.steps + 1
    cparams.n_batch = max(len(ids), 1)
    cparams.n_ubatch = max(len(ids), 1)
    cparams.n_seq_max = 1
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit(f"peers.py: llama.cpp could not make a context for {args.gguf}")
    load_s = time.perf_counter() - started
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    memory = llama_cpp.llama_get_memory(ctx)

    def step(tokens):
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise SystemExit(f"peers.py: llama_decode returned {rc}")
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    prefill_s, decode_s, tokens = [], [], []
    for r in range(args.repeats):
        llama_cpp.llama_memory_clear(memory, True)
        t0 = time.perf_counter()
        token = step(ids)
        t1 = time.perf_counter()
        out = [token]
        for _ in range(args.steps):
            token = step([token])
            out.append(token)
        t2 = time.perf_counter()
        log(f"repeat {r + 1}/{args.repeats}: prefill {t1 - t0:.3f} s, {args.steps} decode steps {t2 - t1:.3f} s")
        prefill_s.append(t1 - t0)
        decode_s.append(t2 - t1)
        tokens = out
    weight_bytes = llama_cpp.llama_model_size(model)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    print_row(
        "llama.cpp", args.gguf, args.precision, ids, args.steps, prefill_s, decode_s, weight_bytes, load_s, tokens,
        threads=n_threads,
    )


def bandwidth(args):
    n = threads()
    # Ones, not zeros: np.zeros maps the shared zero page, which reads from the cache.
    a = np.ones(args.mib * (1 << 20) // 8, dtype=np.int64)
    chunks = np.array_split(a, n)
    best = math.inf
    for _ in range(7):
        barrier = threading.Barrier(n + 1)

        def work(c):
            barrier.wait()
            c.max()

        ts = [threading.Thread(target=work, args=(c,)) for c in chunks]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"bandwidth_bytes_s": a.nbytes / best, "threads": n, "array_bytes": a.nbytes}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--src", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--vocab-gguf", help="copy the tokenizer.* keys of this GGUF (default: ids only)")
    q = sub.add_parser("quantize")
    q.add_argument("--src", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--type", required=True, choices=sorted(QUANT_TYPES))
    b = sub.add_parser("bench")
    b.add_argument("--gguf", required=True)
    b.add_argument("--precision", required=True, help="label of the row (f16, q8_0, q4_0)")
    b.add_argument("--prompt-ids", required=True)
    b.add_argument("--steps", type=int, required=True)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--threads", type=int, default=0)
    w = sub.add_parser("bandwidth")
    w.add_argument("--mib", type=int, default=1024)
    args = p.parse_args()
    {"convert": convert, "quantize": quantize, "bench": bench, "bandwidth": bandwidth}[args.cmd](args)


if __name__ == "__main__":
    main()
