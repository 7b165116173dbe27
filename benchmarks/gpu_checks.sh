#!/usr/bin/env bash
# The GPU checks the open rollout / training-system work still owes, in one call of <= 10 minutes on
# one H200 (run it with the ignored .whl/ folder carried along: see benchmarks/gpu_tests.sh):
#   1. the CUDA equivalence tests fixed since their last GPU run (DiffusionGemma / LLaDA batches, the
#      fused mask sampler);
#   2. the rollout benchmark with the fused logits pass, Qwen3-4B shape, B = 16 and 64;
#   3. the 4B ORL step: full, Triton staircase, and all-off in the same run (the eager rows take
#      ~4 minutes each: no-runtime is left out so that all-off fits; run it alone with --warmup 0).
# Usage: bash benchmarks/gpu_checks.sh OUT
set -u -o pipefail
OUT=${1:?out dir}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py \
  -k "batch_sampled or fused_mask" > "$OUT/gpu_tests.log" 2>&1; tail -n 3 "$OUT/gpu_tests.log"
timeout 90 python3 benchmarks/rollout.py --out "$OUT/rollout" --families sdar --batches 16,64 --ref-batch 0 \
  --sampler triton > "$OUT/rollout.log" 2>&1; tail -n 6 "$OUT/rollout.log"
timeout 400 python3 benchmarks/train_step.py --out "$OUT/step" --rows full,triton,all-off > "$OUT/train_step.log" 2>&1
tail -n 12 "$OUT/train_step.log"
