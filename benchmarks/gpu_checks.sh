#!/usr/bin/env bash
# The GPU checks the rollout / training-system work owes, in calls of <= 10 minutes on one H200 (run
# with the ignored .whl/ folder carried along: see benchmarks/gpu_tests.sh). Usage:
#   bash benchmarks/gpu_checks.sh OUT STAGE
# STAGE:
#   engine  the CUDA equivalence tests (runtime == reference decoder, batched and sampled, the fused
#           mask sampler, the kernels, the staircase kernels: ~290 s);
#   rollout the rollout benchmark with the fused logits pass: the Qwen3-4B shape (B = 1, 8, 16, 64; the
#           eager reference at B = 16; profiles at 1, 8, 64) and the LLaDA-2.1-mini shape (B = 1, 8, 16,
#           64; profiles at 1, 8, 16);
#   step    the 4B ORL step (rollouts with the fused logits pass): full, the torch logits pass and
#           all-off in the same run (all-off stopped at 300 s: its time and the ratio are then bounds);
#   moe     the grouped-GEMM expert test, then the LLaDA-2.1-mini-width ORL step (MoE path): full and
#           dense (150 s a row at most);
#   cpu     the whole CPU test suite (CUDA hidden) on this machine's CPU and torch;
#   suite   the suite's larger run (benchmarks/suite_gpu.sh: the 56.9M `large` model, base vs ORL vs RFT vs
#           more SFT, frontiers), 540 s a call; calls in a row on a machine that stays up continue it.
set -u -o pipefail
OUT=${1:?out dir}; STAGE=${2:?stage: engine, rollout, step, moe, cpu or suite}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep "Model name"; nproc
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
case "$STAGE" in
engine)
  timeout 540 python3 -m pytest -q -p no:cacheprovider -rs --durations=10 tests/test_engine_gpu.py \
    tests/test_engine_batch.py tests/test_engine_kernels.py tests/test_staircase_kernel.py \
    > "$OUT/gpu_tests.log" 2>&1; tail -n 14 "$OUT/gpu_tests.log" ;;
rollout)
  timeout 300 python3 benchmarks/rollout.py --out "$OUT/rollout" --families sdar --batches 1,8,16,64 \
    --ref-batch 16 --sampler triton --profile 1,8,16,64 > "$OUT/rollout.log" 2>&1; tail -n 12 "$OUT/rollout.log"
  timeout 260 python3 benchmarks/rollout.py --out "$OUT/rollout_llada" --families llada --batches 1,8,16,64 \
    --ref-batch 0 --sampler triton --profile 1,8,16,64 > "$OUT/rollout_llada.log" 2>&1; tail -n 8 "$OUT/rollout_llada.log" ;;
step)
  timeout 560 python3 benchmarks/train_step.py --out "$OUT/step" --rows full,torch-sampler,all-off --row-limit 300 --sampler triton \
    > "$OUT/train_step.log" 2>&1; tail -n 12 "$OUT/train_step.log" ;;
moe)
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_moe_grouped.py > "$OUT/moe_tests.log" 2>&1; tail -n 3 "$OUT/moe_tests.log"
  timeout 480 python3 benchmarks/train_step.py --out "$OUT/moe" --family llada --layers 6 \
    --rows full,dense --row-limit 150 > "$OUT/train_step_moe.log" 2>&1; tail -n 12 "$OUT/train_step_moe.log" ;;
cpu)
  CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=8 timeout 560 python3 -m pytest -q -p no:cacheprovider tests \
    > "$OUT/cpu_tests.log" 2>&1; tail -n 5 "$OUT/cpu_tests.log" ;;
suite)
  bash benchmarks/suite_gpu.sh "$OUT" "${SUITE_SECONDS:-540}" ;;
*) echo "unknown stage $STAGE (engine, rollout, step, moe, cpu or suite)"; exit 2 ;;
esac
