#!/usr/bin/env bash
# Every engine check and benchmark on one GPU machine, in stages (each stage fits one 10-minute run):
#   bash benchmarks/engine_all.sh OUT [stage ...]
# stages: kernels-tests (Triton kernels on the GPU), gpu-tests (runtime == reference, LLM on CUDA),
#   sweep (GEMM tiles of the Triton forward; writes OUT/gemm_table.json, later stages use it),
#   attention (the Triton attention's tiles and splits against SDPA),
#   qwen3 (Qwen3-4B shape: compiled vs Triton paths, with profiles), llada, dgemma.
# Default: all of them in that order. Logs and result tables land in OUT.
set -u
OUT=${1:?out dir}; shift
STAGES=${*:-kernels-tests gpu-tests sweep attention qwen3 llada dgemma}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
[ -f "$OUT/gemm_table.json" ] || [ ! -f benchmarks/gemm_table.json ] || cp benchmarks/gemm_table.json "$OUT/"
for st in $STAGES; do
  t0=$(date +%s)
  [ -f "$OUT/gemm_table.json" ] && export ORL_GEMM_TABLE=$OUT/gemm_table.json
  case $st in
    kernels-tests) python -m pytest -q -x tests/test_engine_kernels.py 2>&1 | tee "$OUT/kernels_tests.log" | tail -n 5 ;;
    gpu-tests) python -m pytest -q tests/test_engine_gpu.py tests/test_engine_moe.py tests/test_engine_dgemma.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 8 ;;
    sweep) python benchmarks/kernels_bench.py --out "$OUT" --no-round > "$OUT/kernels_bench.log" 2>&1; tail -n 25 "$OUT/kernels_results.md" ;;
    attention) python benchmarks/kernels_bench.py --out "$OUT" --sections attention > "$OUT/kernels_bench.log" 2>&1
           cat "$OUT/kernels_results.md" ;;
    qwen3) python benchmarks/engine.py --out "$OUT" --quick --kernels both --no-correctness --no-hf > "$OUT/qwen3.log" 2>&1
           tail -n 60 "$OUT/engine_results.md" ;;
    llada) mkdir -p "$OUT/llada"; python benchmarks/engine.py --out "$OUT/llada" --families llada --no-ref > "$OUT/llada.log" 2>&1
           tail -n 45 "$OUT/llada/engine_results.md" ;;
    dgemma) mkdir -p "$OUT/dg"; DG_MODES=while+compile python benchmarks/engine.py --out "$OUT/dg" --families dgemma > "$OUT/dgemma.log" 2>&1
           tail -n 45 "$OUT/dg/engine_results.md" ;;
    *) echo "unknown stage $st"; exit 2 ;;
  esac
  echo "== stage $st: $(( $(date +%s) - t0 )) s"
done
