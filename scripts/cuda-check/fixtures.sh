#!/usr/bin/env bash
# Every fixture family at every precision on a CUDA GPU: the accuracy gate of the trained
# fixtures (f16, bf16, packed against f32 on cuda) and the random fixtures against mlx-lm
# (f32 and packed against expected.json, bf16 against expected_bf16.json). See README.md.
#
#   bash scripts/cuda-check/fixtures.sh prepare          # here: compile into target/cuda-fixtures
#   OUT=/dir bash scripts/cuda-check/fixtures.sh run     # on the GPU machine, repository root
#
# prepare needs the CUDA-linked binary that prepare.sh builds (target/cuda-bin); run needs
# only an NVIDIA driver, the carried folder target/cuda-fixtures (the modules; the fixtures
# themselves are in the repository) and the binary prepare.sh put in target/cuda-check
# (one copy carried for both). run never compiles (IREE_COMPILER_LIB points at nothing), gives
# each command a timeout and the whole run a budget (BUDGET_S, default 300 s).
#
# FAMILIES="qwen3_5 lfm2" limits both steps to those fixture folders (of tests/fixtures and
# tests/fixtures-trained, where they exist); give run the same list prepare had. Default:
# every folder.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh" # MAX_CONTEXT (the one the cases are planned at), pack/unpack_modules
cd "$HERE/../.." || exit 1
DEST=target/cuda-fixtures
BIN=target/cuda-check/mlx-iree
NO_COMPILER=/nonexistent/libIREECompiler.so
STEPS=40

say() { echo "[cuda-fixtures] $*"; }

# One case a line: `LABEL MODEL_DIR PRECISION REFERENCE` (REFERENCE `f32` = the f32 path on
# the same device, else a trajectory file). Most informative first: the gate as the issue
# states it (trained, against f32 on cuda), then exactness against mlx-lm.
# The fixture folders of $1 (tests/fixtures or tests/fixtures-trained) that FAMILIES selects.
folders() {
    local d
    for d in "$1"/*/; do
        if [ -z "${FAMILIES:-}" ] || [[ " $FAMILIES " == *" $(basename "$d") "* ]]; then
            echo "$d"
        fi
    done
}

cases() {
    local d v p
    for p in bf16 f16 packed; do
        for d in $(folders tests/fixtures-trained); do
            for v in f32 q4 q8; do
                [ "$p" = packed ] && [ "$v" = f32 ] && continue
                echo "gate:$p:trained/$(basename "$d")/$v ${d}$v $p f32"
            done
        done
    done
    for d in $(folders tests/fixtures); do
        for v in f32 q4 q8; do
            echo "mlx:bf16:$(basename "$d")/$v ${d}$v bf16 ${d}$v/expected_bf16.json"
            echo "mlx:f32:$(basename "$d")/$v ${d}$v f32 ${d}$v/expected.json"
            [ "$v" = f32 ] || echo "mlx:packed:$(basename "$d")/$v ${d}$v packed ${d}$v/expected.json"
        done
    done
}

# Every (model folder, precision) the cases load: the candidate, and f32 where it is the
# reference.
loads() {
    cases | while read -r _ dir p ref; do
        echo "$dir $p"
        [ "$ref" = f32 ] && echo "$dir f32"
    done | sort -u
}

prepare() {
    local bin=target/cuda-bin/release/mlx-iree dir p out n=0 work=target/cuda-fixtures-work
    [ -x "$bin" ] || { say "error: $bin is missing (run scripts/cuda-check/prepare.sh first)"; exit 1; }
    mkdir -p "$work/cache"
    : >"$work/keys.txt"
    # `mlx-iree compile` fills the work cache with the modules a load would compile, without
    # the device (there is none here); a second time without a compiler proves they are
    # served from the cache, and MLX_IREE_DUMP_MLIR makes each hit name its file (only those
    # are carried). The gate plans one sequence at --max-context, as `compile` does.
    while read -r dir p; do
        n=$((n + 1))
        for compiler in "" "$NO_COMPILER"; do
            if ! out=$(
                export MLX_IREE_CACHE_DIR="$work/cache"
                [ -n "$compiler" ] && export IREE_COMPILER_LIB=$compiler MLX_IREE_DUMP_MLIR=1
                "$bin" compile --device cuda --model "$dir" --precision "$p" --max-context $MAX_CONTEXT 2>&1
            ); then
                say "error: $dir $p did not compile${compiler:+ (or was not in the cache, checked without a compiler)}:"
                echo "$out" | tail -5
                exit 1
            fi
        done
        sed -n 's/.*: MLIR written to \(.*\)\.mlir$/\1.vmfb/p' <<<"$out" >>"$work/keys.txt"
        say "$n $dir $p: compiled, served from the cache without a compiler"
    done < <(loads)
    find "$work/cache" -name '*.mlir' -delete
    # Compressed, the folder stays small enough to carry (5 MB, not 126); run unpacks it.
    rm -rf "$DEST"
    pack_modules "$work/keys.txt" "$work/cache" "$DEST/cache"
    say "$(cases | wc -l) cases; $(find "$DEST/cache" -name '*.vmfb.xz' | wc -l) modules; $(du -sh "$DEST" | cut -f1) in $DEST"
}

run() {
    local out=${OUT:-$PWD/cuda-fixtures-out} start label dir p ref rc line left
    mkdir -p "$out"
    [ -x "$BIN" ] || { say "error: $BIN is missing (carry target/cuda-check beside target/cuda-fixtures)"; exit 1; }
    exec > >(tee "$out/fixtures.log") 2>&1
    start=$(date +%s)
    # The carried modules are xz-compressed; they are unpacked into a cache of their own.
    export MLX_IREE_CACHE_DIR=${CKPT_DIR:-/tmp/mlx-iree-cuda-fixtures}/cache IREE_COMPILER_LIB=$NO_COMPILER
    export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
    unpack_modules python3 "$DEST/cache" "$MLX_IREE_CACHE_DIR" || exit 1
    say "compile cache: $(find "$MLX_IREE_CACHE_DIR" -name '*.vmfb' | wc -l) modules unpacked into $MLX_IREE_CACHE_DIR"
    nvidia-smi -L || true
    local pass=0 fail=0 skipped=0
    while read -r label dir p ref; do
        left=$((${BUDGET_S:-300} - ($(date +%s) - start)))
        if [ "$left" -lt 10 ]; then
            skipped=$((skipped + 1))
            say "SKIPPED (budget spent) $label"
            continue
        fi
        line=$(timeout $((left < 60 ? left : 60)) "$BIN" gate --device cuda --model "$dir" \
            --precision "$p" --steps $STEPS --max-context $MAX_CONTEXT --reference "$ref" 2>"$out/err.txt")
        rc=$?
        if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
        say "$(printf '%-40s rc %d  %s' "$label" $rc "$(grep -o 'token-exact on every prompt: [a-z]*; teacher-forced top-1 agreement [0-9.]*%' <<<"$line")")"
        [ $rc -eq 0 ] || { echo "$line"; tail -3 "$out/err.txt"; }
    done < <(cases)
    say "summary: $pass passed, $fail failed, $skipped skipped in $(($(date +%s) - start)) s"
}

case ${1:-} in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
