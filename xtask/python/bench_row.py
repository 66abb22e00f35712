"""The JSON line a peer prints for `cargo xtask bench --peers`: the fields of an
`mlx-iree bench` row plus `engine`, from the per-repeat timings (medians)."""

import json
import resource


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def print_row(engine, model, precision, ids, steps, prefill_s, decode_s, weight_bytes, load_s, tokens, **extra):
    """Prints the row; `extra` fields (e.g. `threads`) follow the shared ones."""
    prefill = median(prefill_s)
    row = {
        "engine": engine,
        "model": model,
        "device": "cpu",
        "precision": precision,
        "prefill_tok_s": len(ids) / prefill,
        "decode_tok_s": steps / median(decode_s),
        "ttft_ms": prefill * 1e3,
        "weight_bytes": int(weight_bytes),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "dispatches_per_decode_step": None,
        **extra,
        "weights_load_s": load_s,
        "prompt_len": len(ids),
        "decode_steps": steps,
        "repeats": len(prefill_s),
        "first_tokens": tokens[:8],
    }
    print(json.dumps(row, separators=(",", ":")))
