#!/usr/bin/env bash
# Runs on the CUDA machine, from the folder prepare.sh assembled (see README.md):
#
#   OUT=/some/dir bash target/cuda-check/run.sh
#
# Needs: an NVIDIA driver (libcuda.so), python3 with numpy. No network, no compiler: every
# module comes from the carried compile cache (IREE_COMPILER_LIB is pointed at nothing, so
# a miss is reported, never compiled). Makes random checkpoints in $CKPT_DIR, then runs
# `mlx-iree bench --device cuda --json` per case of cases.txt and `mlx-iree gate` (a
# precision against f32 on the GPU, SmolLM2 shape). Everything printed goes to
# $OUT/cuda-check.log, bench's JSON lines to $OUT/bench.jsonl. Each command has a timeout and
# the whole run a budget (BUDGET_S, default 330 s): cases that would start after it are
# listed as skipped. Exit status 0 when every case ran (a failing gate counts as ran).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"

OUT=${OUT:-$PWD/cuda-check-out}
mkdir -p "$OUT"
LOG=$OUT/cuda-check.log
JSONL=$OUT/bench.jsonl
: >"$LOG"
: >"$JSONL"
exec > >(tee -a "$LOG") 2>&1
TEE=$!

BUDGET_S=${BUDGET_S:-330}
START=$(date +%s)
CKPT=${CKPT_DIR:-/tmp/mlx-iree-cuda-check}
BIN=$HERE/mlx-iree
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The carried cache holds xz-compressed modules; they are unpacked next to the checkpoints.
export MLX_IREE_CACHE_DIR=$CKPT/cache
export IREE_COMPILER_LIB=/nonexistent/libIREECompiler.so
# The modules hold sm_80 PTX, which the driver JIT-compiles for the GPU once and keeps in
# its cache (default 256 MiB, too small for several 1B modules).
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}

elapsed() { echo $(($(date +%s) - START)); }
say() { echo "[cuda-check $(elapsed)s] $*"; }

RESULTS=()
result() { RESULTS+=("$(printf '%-34s %s' "$1" "$2")"); }

# run_timed SECONDS LABEL CMD...: runs CMD with a timeout cut to the budget left; its stdout
# goes to $TMP/out, its stderr to $TMP/err, both then into the log. Sets RC.
run_timed() {
    local limit=$1 label=$2 left
    shift 2
    left=$((BUDGET_S - $(elapsed)))
    if [ "$left" -lt 20 ]; then
        say "SKIPPED (time budget of ${BUDGET_S}s spent): $label"
        RC=125
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    say "== $label (timeout ${limit}s)"
    echo "\$ $*"
    local t0
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" </dev/null >"$TMP/out" 2>"$TMP/err"
    RC=$?
    cat "$TMP/err" "$TMP/out"
    say "   exit status $RC after $(($(date +%s) - t0)) s"
    if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
        say "TIMEOUT: $label did not finish within ${limit}s"
    fi
    if grep -q "is not in the compile cache" "$TMP/err"; then
        say "CACHE MISS: $label needs a compile, and there is no compiler here:"
        grep "is not in the compile cache" "$TMP/err" | sed 's/^/    /'
        say "   (prepare.sh must be re-run with this binary and these PRECISIONS)"
        RC=126
    fi
}

# The checkpoint folder of (model, variant), made on first use (a few seconds for SmolLM2,
# tens of seconds for the 1B's 2.4 GB); status 0 when it is there.
ckpt() {
    local model=$1 variant=$2 dir=$CKPT/$1-$2 t0 rc
    [ -f "$dir/.done" ] && return 0
    rm -rf "$dir"
    t0=$(date +%s)
    # shellcheck disable=SC2046
    timeout -k 5 240 "$PY" "$HERE/random_checkpoint.py" --config "$HERE/configs/$model.json" --out "$dir" \
        $(variant_flags "$model" "$variant") </dev/null
    rc=$?
    if [ "$rc" = 0 ]; then
        touch "$dir/.done"
        say "random checkpoint $model $variant: $(($(date +%s) - t0)) s"
        return 0
    fi
    say "random checkpoint $model $variant failed (exit status $rc)"
    return 1
}

say "mlx-iree CUDA check: $HERE -> $OUT"
for cmd in "nvidia-smi -L" \
    "nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv" \
    "uname -a" "ldd --version" "nproc" "$BIN --version"; do
    echo "\$ $cmd"
    timeout 30 $cmd 2>&1 | head -5
done
PY=$(find_python) || {
    say "no python3 with numpy: cannot make the random checkpoints"
    exit 1
}
mkdir -p "$CKPT"
unpack_modules "$PY" "$HERE/cache" "$MLX_IREE_CACHE_DIR" || exit 1
echo "compile cache: $(find "$MLX_IREE_CACHE_DIR" -name '*.vmfb' | wc -l) modules unpacked into $MLX_IREE_CACHE_DIR"

# The 1B checkpoints (several GB) are written in the background while SmolLM2 runs.
LLAMA_VARIANTS=$(awk '$2 == "llama-1b" { print $3 }' "$HERE/cases.txt" | sort -u | tr '\n' ' ')
if [ -n "$LLAMA_VARIANTS" ]; then
    (
        for v in $LLAMA_VARIANTS; do
            ckpt llama-1b "$v"
        done
    ) >"$TMP/background.log" 2>&1 &
    BG=$!
    say "writing the llama-1b checkpoints ($LLAMA_VARIANTS) in the background"
fi

failed=0
while read -r kind model variant precision; do
    label="$kind $model $variant $precision"
    dir=$CKPT/$model-$variant
    if [ "$model" = llama-1b ] && [ -n "${BG:-}" ]; then
        say "waiting for the llama-1b checkpoints"
        wait "$BG"
        BG=""
        cat "$TMP/background.log"
    fi
    if ! ckpt "$model" "$variant"; then
        result "$label" "no checkpoint"
        failed=1
        continue
    fi
    case $kind in
        bench)
            limit=120
            [ "$model" = llama-1b ] && limit=150
            # shellcheck disable=SC2046
            run_timed "$limit" "$label" "$BIN" bench --model "$dir" $(bench_args "$precision")
            if [ "$RC" = 0 ] && grep -q '^{' "$TMP/out"; then
                grep '^{' "$TMP/out" >>"$JSONL"
                result "$label" "ok: $(grep -m1 '^{' "$TMP/out" | "$PY" -c 'import json,sys; r=json.load(sys.stdin); print("prefill %.0f tok/s, decode %.1f tok/s, ttft %.0f ms, load %.1f s" % (r["prefill_tok_s"], r["decode_tok_s"], r["ttft_ms"], r["weights_load_s"]))')"
            elif [ "$RC" = 0 ]; then
                RC=3 # no JSON line
            fi
            ;;
        gate)
            # shellcheck disable=SC2046
            run_timed 150 "$label" "$BIN" gate --model "$dir" $(gate_args "$precision")
            if [ "$RC" = 0 ] || [ "$RC" = 1 ]; then
                result "$label" "$(grep -m1 'overall' "$TMP/out" | sed 's/^ *//')"
                RC=0
            fi
            ;;
    esac
    case $RC in
        0) ;;
        124 | 137) result "$label" "TIMEOUT" ;;
        125) result "$label" "skipped (time budget)" ;;
        3) result "$label" "error: no JSON line on stdout" ;;
        126) result "$label" "CACHE MISS" ;;
        *)
            if grep -q "invalid value '$precision' for '--precision" "$TMP/err"; then
                result "$label" "skipped: this mlx-iree refuses --precision $precision"
            else
                result "$label" "error: $(grep -m1 'mlx-iree: error' "$TMP/err" | cut -c1-300)"
            fi
            ;;
    esac
    [ "$RC" = 0 ] || failed=1
done <"$HERE/cases.txt"
[ -n "${BG:-}" ] && kill "$BG" 2>/dev/null

say "summary ($(wc -l <"$JSONL") bench lines in $JSONL):"
for r in "${RESULTS[@]}"; do echo "  $r"; done
say "done in $(elapsed) s"
# Let tee write the last lines before the results are collected.
exec >&- 2>&-
wait "$TEE" 2>/dev/null
exit "$failed"
