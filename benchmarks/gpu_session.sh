#!/usr/bin/env bash
# One GPU-machine session: the larger ORL run on the GPU and, on the machine's CPU cores at the same
# time, a sweep of ORL variants from a given small base. Usage:
#   bash benchmarks/gpu_session.sh OUT BASE_DIR [variant ...]      (variants as in orl_sweep.py)
set -u
OUT=${1:?out dir}; BASE=${2:?base model dir}; shift 2
LIMIT=${LIMIT:-540}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
( timeout $LIMIT python benchmarks/orl_gpu.py --out /tmp/gpu --size medium --sft-steps ${SFT_STEPS:-1500} \
    ${ORL_STEPS:+--orl-steps $ORL_STEPS} ${GPU_ORL_SETS:-} > "$OUT/orl_gpu.log" 2>&1
  cp /tmp/gpu/summary.json "$OUT/orl_gpu_summary.json" 2>/dev/null
  cp /tmp/gpu/orl/metrics.jsonl "$OUT/orl_gpu_metrics.jsonl" 2>/dev/null ) &
args=(); for v in "$@"; do args+=(--variant "$v"); done
( while sleep 20; do python - <<'PY' > "$OUT/sweep_partial.json" 2>/dev/null
import glob, json, os
out = {os.path.basename(os.path.dirname(p)): json.load(open(p)) for p in glob.glob("/tmp/sweep/*/eval.json")}
curves = {}
for p in glob.glob("/tmp/sweep/*/metrics.jsonl"):
    rows = [json.loads(l) for l in open(p) if "eval_accuracy" in l]
    curves[os.path.basename(os.path.dirname(p))] = [(r["step"], round(r["eval_accuracy"], 3), round(r["eval_tpf"], 2)) for r in rows]
print(json.dumps({"final": out, "curves": curves}, indent=1))
PY
done ) &
POLL=$!
OMP_NUM_THREADS=2 timeout $LIMIT python benchmarks/orl_sweep.py --base "$BASE" --out /tmp/sweep --jobs ${JOBS:-6} \
    --threads 2 --n-eval 500 "${args[@]}" > "$OUT/sweep.log" 2>&1
cp /tmp/sweep/sweep.json "$OUT/" 2>/dev/null
wait %1 2>/dev/null
kill $POLL 2>/dev/null
tail -n 20 "$OUT/sweep.log"; tail -n 25 "$OUT/orl_gpu.log"
