# Shared by prepare.sh (on the build machine) and run.sh (on the CUDA machine): which
# cases run, with which arguments, on which random checkpoints. prepare.sh fills the compile
# cache for exactly these cases, so run.sh needs no compiler; keep the two in step by
# changing things here only. Sourced, not run.

# Every graph shape is fixed by the engine's plan (engine::Plan) from --max-context and the
# batch sizes, not by the prompt or the steps: one context for every case, so prepare.sh
# and run.sh share the compiled modules, and STEPS may be lowered on the CUDA machine
# without a cache miss (prompt + steps must fit MAX_CONTEXT).
MAX_CONTEXT=256
BENCH_PROMPT_LEN=128
BENCH_STEPS=${STEPS:-128}
BENCH_REPEATS=${REPEATS:-2}

# gate: its default 32 steps with its built-in id prompts (no tokenizer; the longest has
# 12 ids). prepare.sh compiles its graphs with `mlx-iree compile` at the same --max-context,
# which plans the same graphs.
GATE_STEPS=32
GATE_FILL_IDS=1,250,3,77,128,5,199,64,12,230,41,9

# The two model shapes: SmolLM2-135M-Instruct's config and Llama-3.2-1B's.
MODELS="smollm2 llama-1b"

# Checkpoint variants: f16 (dense) and MLX 4/8-bit; the flags random_checkpoint.py takes.
# SmolLM2's 4-bit uses group size 32 like `cargo xtask model`, the 1B's 64 like
# `cargo xtask bench` (xtask/python/make_random_llama.py).
variant_flags() {
    case "$1:$2" in
        *:f16) echo "" ;;
        smollm2:q4) echo "--bits 4 --group-size 32" ;;
        llama-1b:q4) echo "--bits 4 --group-size 64" ;;
        llama-1b:q8) echo "--bits 8 --group-size 64" ;;
        *) echo "unknown variant $1:$2" >&2; return 1 ;;
    esac
}

# The variants a precision runs on: packed runs the quantized checkpoints, the rest f16.
variants_for() {
    local model=$1 precision=$2
    if [ "$precision" = packed ]; then
        case $model in
            smollm2) echo q4 ;;
            llama-1b) echo "q4 q8" ;;
        esac
    else
        echo f16
    fi
}

# Every case, one per line: `bench MODEL VARIANT PRECISION` or `gate MODEL VARIANT
# PRECISION` (PRECISION against f32 on the same checkpoint), most informative first:
# SmolLM2 (small, fast), its gates, then the 1B shape.
all_cases() {
    local precisions=$1 p v
    for p in $precisions; do
        for v in $(variants_for smollm2 "$p"); do echo "bench smollm2 $v $p"; done
    done
    for p in $precisions; do
        [ "$p" = f32 ] && continue
        for v in $(variants_for smollm2 "$p"); do echo "gate smollm2 $v $p"; done
    done
    # The 1B: f16 and packed first (the interesting ones), f32/bf16 last.
    for p in $(for p in $precisions; do case $p in f16 | packed) echo "$p" ;; esac; done) \
        $(for p in $precisions; do case $p in f16 | packed) ;; *) echo "$p" ;; esac; done); do
        for v in $(variants_for llama-1b "$p"); do echo "bench llama-1b $v $p"; done
    done
}

# The mlx-iree arguments of a case after `--model DIR`.
bench_args() {
    echo "--device cuda --precision $1 --prompt-len $BENCH_PROMPT_LEN --steps $BENCH_STEPS --repeats $BENCH_REPEATS --max-context $MAX_CONTEXT --json --cache-only"
}
gate_args() {
    echo "--device cuda --precision $1 --steps $GATE_STEPS --max-context $MAX_CONTEXT"
}

# A python3 with numpy (random_checkpoint.py needs nothing else).
find_python() {
    local py
    for py in ${PYTHON:-} python3 "$@"; do
        if [ -x "$(command -v "$py" 2>/dev/null)" ] && "$py" -c "import numpy" 2>/dev/null; then
            echo "$py"
            return 0
        fi
    done
    echo "no python3 with numpy found (set PYTHON)" >&2
    return 1
}

# pack_modules KEYS CACHE DEST: the modules listed in KEYS (cache files, one a line) into
# DEST, xz-compressed (a cuda module is mostly PTX text: 2-4 MB becomes 70-100 KB), with
# CACHE's compiler identity records. Here, by prepare.sh and fixtures.sh.
pack_modules() {
    local keys=$1 cache=$2 dest=$3 vmfb
    mkdir -p "$dest/compilers"
    sort -u "$keys" | while read -r vmfb; do xz -9 -c "$vmfb" >"$dest/$(basename "$vmfb").xz"; done
    cp "$cache"/compilers/*.id "$dest/compilers/"
}

# unpack_modules PYTHON SRC DST: what pack_modules wrote into SRC, as a compile cache in DST
# (emptied first). There, by run.sh and fixtures.sh, with python's lzma (no xz needed).
unpack_modules() {
    rm -rf "$3"
    "$1" - "$2" "$3" <<'PY'
import lzma, pathlib, shutil, sys
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
shutil.copytree(src / "compilers", dst / "compilers")
for f in sorted(src.glob("*.vmfb.xz")):
    (dst / f.name[: -len(".xz")]).write_bytes(lzma.decompress(f.read_bytes()))
PY
}
