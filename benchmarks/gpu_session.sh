#!/usr/bin/env bash
# One GPU-machine session: the larger ORL run on the GPU and, on the machine's CPU cores at the same
# time, a sweep of ORL variants from a given small base. Usage:
#   bash benchmarks/gpu_session.sh OUT BASE_DIR [variant ...]
set -u
OUT=${1:?out dir}; BASE=${2:?base model dir}; shift 2
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
( python benchmarks/orl_gpu.py --out /tmp/gpu --size medium --sft-steps ${SFT_STEPS:-1500} \
    --orl-steps ${ORL_STEPS:-100} > "$OUT/orl_gpu.log" 2>&1; cp /tmp/gpu/summary.json "$OUT/orl_gpu_summary.json" ) &
args=(); for v in "$@"; do args+=(--variant "$v"); done
OMP_NUM_THREADS=2 python benchmarks/orl_sweep.py --base "$BASE" --out /tmp/sweep --jobs ${JOBS:-6} --threads 2 \
    --n-eval 500 "${args[@]}" > "$OUT/sweep.log" 2>&1
cp /tmp/sweep/sweep.json "$OUT/" 2>/dev/null
wait
tail -n 30 "$OUT/sweep.log"; tail -n 30 "$OUT/orl_gpu.log"
