#!/usr/bin/env bash
# The suite's larger run on one GPU: the `large` model (56.9M parameters) on one suite family, base vs ORL
# (3 seeds) vs RFT vs more SFT at equal training compute, then every model's frontier (benchmarks/suite_runs.py).
# Usage (from benchmarks/gpu_checks.sh's `suite` stage, or alone with PYTHONPATH set):
#   bash benchmarks/suite_gpu.sh OUT [SECONDS]
# Every stage resumes from what RUNS (default /tmp/orl_suite_gpu, outside the checkout) already holds, so
# calls of SECONDS each (default 540) continue one another on a machine that stays up; a stage cut at the
# deadline is killed and picks up from its last checkpoint next call. The table, results.json, the
# training curves' tails and the logs are copied to OUT after every call (8 files at most come back).
#   stage 1: the base's SFT (suite_sft_<family> at size `large`, batch 128, LRs 6e-4 / 3e-4: the small
#            model's 2e-3 / 1e-3 scaled down for width 768) and the ORL start model;
#   stage 2: ORL seeds 0, 1, 2 and the baselines (RFT, then more SFT), four processes side by side on the GPU;
#   stage 3: the sweeps over the threshold (n = N_SWEEP held-out problems) and the comparison table.
set -u -o pipefail
OUT=${1:?out dir}; BUDGET=${2:-540}
FAMILY=${FAMILY:-chain}; RUNS=${RUNS:-/tmp/orl_suite_gpu}; N_SWEEP=${N_SWEEP:-300}
START=$(date +%s); mkdir -p "$OUT" "$RUNS"
left() { local l=$(( BUDGET - ($(date +%s) - START) )); [ "$l" -lt 1 ] && l=1; echo "$l"; }   # timeout 0 = none
# SIZE / DEVICE / EXTRA (more suite_runs.py arguments) exist for a smoke run of this script on a CPU
COMMON=(--family "$FAMILY" --out "$RUNS" --size "${SIZE:-large}" --device "${DEVICE:-cuda}" --threads 4
        --set-sft batch_size=128 --set-sft stages.0.lr=6e-4 --set-sft stages.1.lr=3e-4 ${EXTRA:-})
BASE=$RUNS/$FAMILY/sft_s0/final
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/suite_gpu.log"; }
collect() {   # 6 files with gpu_checks.sh's machine.txt (8 at most come back)
  for f in "$RUNS"/*.log; do echo "== $f"; cat "$f"; done > "$OUT/stage_logs.txt" 2>/dev/null
  cp "$RUNS/$FAMILY/results.json" "$OUT/suite_results.json" 2>/dev/null
  cp "$RUNS/$FAMILY/table.markdown" "$OUT/suite_table.markdown" 2>/dev/null
  for d in "$RUNS/$FAMILY"/*/; do   # each trained model's training curve, first and last steps
    [ -f "$d/metrics.jsonl" ] && { head -n 2 "$d/metrics.jsonl"; tail -n 2 "$d/metrics.jsonl"; } \
      | sed "s|^|$(basename "$d"): |"
  done > "$OUT/metrics_ends.txt"
}
trap collect EXIT
log "suite_gpu: $FAMILY, budget ${BUDGET}s, runs in $RUNS"
if [ ! -f "$BASE/config.json" ] || [ ! -f "$RUNS/$FAMILY/start/config.json" ]; then
  log "stage 1: base SFT"
  timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --orl-seeds "" --no-baselines --train-only \
    >> "$RUNS/stage1.log" 2>&1 || { log "stage 1 cut or failed (rc $?)"; tail -n 5 "$RUNS/stage1.log"; exit 0; }
  log "stage 1 done"
fi
pids=()
for k in 0 1 2; do
  if [ ! -f "$RUNS/$FAMILY/orl_s$k/final/config.json" ]; then
    timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" --orl-seeds "$k" --no-baselines \
      --train-only >> "$RUNS/stage2_orl_s$k.log" 2>&1 & pids+=($!)
  fi
done
if [ ! -f "$RUNS/$FAMILY/more_sft/final/config.json" ]; then
  timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" --orl-seeds "" --no-orl --train-only \
    >> "$RUNS/stage2_baselines.log" 2>&1 & pids+=($!)
fi
if [ ${#pids[@]} -gt 0 ]; then
  log "stage 2: ${#pids[@]} training processes"
  fail=0; for p in "${pids[@]}"; do wait "$p" || fail=1; done
  [ $fail = 0 ] || { log "stage 2 cut or failed"; tail -n 3 "$RUNS"/stage2_*.log; exit 0; }
  log "stage 2 done"
fi
log "stage 3: sweeps"
timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" --orl-seeds 0,1,2 --n-sweep "$N_SWEEP" \
  >> "$RUNS/stage3.log" 2>&1 || { log "stage 3 cut or failed (rc $?)"; tail -n 5 "$RUNS/stage3.log"; exit 0; }
log "stage 3 done"; tail -n 12 "$RUNS/$FAMILY/table.markdown"
