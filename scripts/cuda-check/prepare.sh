#!/usr/bin/env bash
# Prepares target/cuda-check/, a folder to carry to a CUDA machine that has no network, no
# Rust, no IREE compiler (see README.md next to this file). Run here, from anywhere:
#
#   PRECISIONS="f32 f16 bf16 packed" bash scripts/cuda-check/prepare.sh
#
# 1. `cargo xtask build-iree --target cuda` (no CUDA toolkit needed) and `mlx-iree` linked
#    against that runtime (target/cuda-bin);
# 2. the two model configs (SmolLM2-135M-Instruct's and Llama-3.2-1B's shape) from
#    target/models/ (`cargo xtask model`, `cargo xtask bench` make those folders);
# 3. full-size random checkpoints of those configs under $WORK (not carried) and, for every
#    case run.sh runs, the cuda modules compiled into $WORK/cache by `mlx-iree compile`
#    with the engine flags of the command run.sh will run (no device needed);
# 4. each case checked again with no compiler at all (IREE_COMPILER_LIB pointing nowhere):
#    every module must come from the cache; the cases that pass are written to cases.txt;
# 5. target/cuda-check = mlx-iree (stripped), cache/ (only the modules the cases use, each
#    xz-compressed, plus the compiler identity records), configs/, random_checkpoint.py,
#    common.sh, run.sh, cases.txt.
# A precision the binary refuses, or a case whose graph does not compile for cuda, is
# skipped with a note. Idempotent: compiles and checkpoints are reused from $WORK.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
HERE=scripts/cuda-check
# shellcheck source=common.sh
. "$HERE/common.sh"

PRECISIONS=${PRECISIONS:-"f32 f16 bf16 packed"}
DEST=target/cuda-check
WORK=${WORK:-target/cuda-check-work}
BIN=target/cuda-bin/release/mlx-iree
FILL_CACHE=$WORK/cache
CKPT=$WORK/ckpt
NO_COMPILER=/nonexistent/libIREECompiler.so

say() { echo "[cuda-check prepare] $*"; }
die() { echo "[cuda-check prepare] error: $*" >&2; exit 1; }

say "1/5 IREE runtime with the CUDA HAL driver (target/iree/cuda)"
cargo xtask build-iree --target cuda

say "1/5 mlx-iree linked against it ($BIN)"
IREE_RUNTIME_DIR="$ROOT/target/iree/cuda" CARGO_TARGET_DIR=target/cuda-bin \
    cargo build --release -j2 -p mlx-iree --bin mlx-iree

say "2/5 model configs"
mkdir -p "$WORK/configs"
for pair in smollm2:target/models/smollm2-135m-instruct-f16 llama-1b:target/models/llama-1b-random-f16; do
    name=${pair%%:*} src=${pair#*:}/config.json
    [ -f "$src" ] || die "$src is missing (run \`cargo xtask model\` for SmolLM2, \`cargo xtask bench --model llama-1b\` for the 1B)"
    cp "$src" "$WORK/configs/$name.json"
done

PY=$(find_python target/venv/bin/python target/mlx-venv/bin/python) || die "no python3 with numpy (run cargo xtask setup)"

# Which precisions this binary accepts: an unknown one is refused while parsing the flags,
# before the (nonexistent) model folder is looked at.
accepted=""
for p in $PRECISIONS; do
    msg=$("$BIN" trajectory --model /nonexistent --precision "$p" --prompt-ids 1 --steps 1 --out /dev/null 2>&1 || true)
    if grep -q "model folder /nonexistent does not exist" <<<"$msg"; then
        accepted="$accepted $p"
    else
        say "note: skipping precision $p, this mlx-iree refuses it: $msg"
    fi
done
[ -n "$accepted" ] || die "no precision of \"$PRECISIONS\" is accepted"
say "precisions: $accepted"

# A full-size random checkpoint (the graphs depend on its config and, for packed, its
# quantization, never on the values), regenerated when the config or the script changes.
ensure_ckpt() {
    local model=$1 variant=$2 dir=$CKPT/$1-$2 flags stamp
    flags=$(variant_flags "$model" "$variant")
    stamp="$(cat "$WORK/configs/$model.json" xtask/python/random_checkpoint.py | sha256sum) $flags"
    if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
        return 0
    fi
    rm -rf "$dir"
    # shellcheck disable=SC2086
    "$PY" xtask/python/random_checkpoint.py --config "$WORK/configs/$model.json" --out "$dir" $flags </dev/null >&2
    echo "$stamp" >"$dir/.stamp"
}

# The compile commands of a case: `mlx-iree compile` with the engine flags of what run.sh
# runs (bench and trajectory plan one sequence at --max-context), so it fills the cache with
# exactly the modules run.sh loads, without the device (there is none here); for a gate,
# the reference (f32) and the precision checked.
case_commands() {
    local kind=$1 model=$2 variant=$3 precision=$4 dir=$CKPT/$2-$3 p
    if [ "$kind" = bench ]; then
        echo "compile --model $dir --device cuda --precision $precision --max-context $MAX_CONTEXT"
    else
        for p in f32 "$precision"; do
            echo "compile --model $dir --device cuda --precision $p --max-context $MAX_CONTEXT"
        done
    fi
}

say "3/5 + 4/5 compiling each case's modules for cuda into $FILL_CACHE, then checking them without a compiler"
mkdir -p "$FILL_CACHE" "$WORK/logs"
: >"$WORK/keys.txt"
: >"$WORK/cases.txt"
while read -r kind model variant precision; do
    label="$kind $model $variant $precision"
    ensure_ckpt "$model" "$variant"
    ok=1
    while read -r cmdline; do
        # shellcheck disable=SC2086
        set -- $cmdline
        started=$(date +%s)
        # shellcheck disable=SC2086
        rc=0
        env MLX_IREE_CACHE_DIR="$FILL_CACHE" "$BIN" "$@" </dev/null >"$WORK/last.log" 2>&1 || rc=$?
        log="$WORK/logs/${label// /-}.log"
        cp "$WORK/last.log" "$log"
        if [ "$rc" != 0 ]; then
            say "note: skipping $label: $(grep -m1 'mlx-iree: error' "$WORK/last.log" | cut -c1-400 || tail -1 "$WORK/last.log") [...] (all of it: $log)"
            ok=0
            break
        fi
        compiled=$(grep -c "compiled in" "$WORK/last.log" || true)
        # The check: no compiler at all, every module from the cache. MLX_IREE_DUMP_MLIR
        # makes each hit name its cache file (so only those are carried).
        # shellcheck disable=SC2086
        env MLX_IREE_CACHE_DIR="$FILL_CACHE" IREE_COMPILER_LIB=$NO_COMPILER MLX_IREE_DUMP_MLIR=1 \
            "$BIN" "$@" </dev/null >"$WORK/check.log" 2>&1 || true
        if grep -q "is not in the compile cache" "$WORK/check.log" || ! grep -q "compile cache hit" "$WORK/check.log"; then
            say "note: skipping $label: not served from the cache without a compiler:"
            sed 's/^/    /' "$WORK/check.log" >&2
            ok=0
            break
        fi
        sed -n 's/.*: MLIR written to \(.*\)\.mlir$/\1.vmfb/p' "$WORK/check.log" >>"$WORK/keys.txt"
        say "  $label: $1 $(grep -o -- "--precision [a-z0-9]*" <<<"$cmdline") ok ($compiled compiled, $(($(date +%s) - started)) s; then $(grep -c 'compile cache hit' "$WORK/check.log") cache hits without a compiler)"
    done < <(case_commands "$kind" "$model" "$variant" "$precision")
    if [ "$ok" = 1 ]; then echo "$label" >>"$WORK/cases.txt"; fi
done < <(all_cases "$accepted")
find "$FILL_CACHE" -name '*.mlir' -delete
[ -s "$WORK/cases.txt" ] || die "no case could be prepared"

say "5/5 assembling $DEST"
rm -rf "$DEST"
mkdir -p "$DEST/configs"
# Compressed (run.sh unpacks them).
pack_modules "$WORK/keys.txt" "$FILL_CACHE" "$DEST/cache"
strip -o "$DEST/mlx-iree" "$BIN"
cp "$WORK/configs/"*.json "$DEST/configs/"
cp xtask/python/random_checkpoint.py "$HERE/common.sh" "$HERE/run.sh" "$DEST/"
cp "$WORK/cases.txt" "$DEST/cases.txt"
glibc=$(objdump -T "$DEST/mlx-iree" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
say "cases ($(wc -l <"$DEST/cases.txt")):"
sed 's/^/    /' "$DEST/cases.txt"
say "$(find "$DEST/cache" -name '*.vmfb.xz' | wc -l) modules; the binary needs $glibc; total $(du -sh "$DEST" | cut -f1) in $DEST"
say "on the CUDA machine: bash $DEST/run.sh (results in \$OUT/cuda-check.log and \$OUT/bench.jsonl)"
