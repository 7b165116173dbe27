#!/usr/bin/env bash
# The suite's larger runs on one GPU: one suite family at a GPU size, base vs ORL (3 seeds, each its own prompt
# stream) vs RFT vs more SFT at equal rollouts and optimizer steps, the Table 3a ablations, then every model's
# frontier (benchmarks/suite_runs.py).
# Usage (from benchmarks/gpu_checks.sh's `suite` stage, or alone with PYTHONPATH set):
#   bash benchmarks/suite_gpu.sh OUT [SECONDS]
# Every stage resumes from what RUNS (default /tmp/orl_suite_gpu, outside the checkout) already holds, so
# calls of SECONDS each (default 540) continue one another on a machine that stays up; a stage cut at the
# deadline is killed and picks up from its last checkpoint next call. The table, results.json, the
# training curves' tails and the logs are copied to OUT after every call (8 files at most come back).
#   stage 1: the base's SFT (suite_sft_<family> at SIZE with SFT_SETS), the ORL start model and the base's sweep; with CALIB=F
#            also, side by side, F's calibration at the recipe's own (CPU) size (benchmarks/suite_calibrate.py);
#   stage 2: ORL seeds 0, 1, 2 and the baselines (RFT, then more SFT), four processes side by side on the GPU,
#            with (ABLATIONS="no_aec,no_anchor,no_pathway") each ablation at seeds ABL_SEEDS, one process each; each
#            process sweeps its models over the threshold (n = N_SWEEP held-out problems) once they are trained;
#   stage 3: the comparison table (any sweep still missing is run here).
# Settings (environment): FAMILY (chain), SIZE (large), SFT_SETS (the `large` run's: batch 128, LRs 6e-4 /
# 3e-4, the small model's 2e-3 / 1e-3 scaled down for width 768), STEPS (optimizer steps of every method;
# empty: the recipes'), THRESHOLDS (suite_runs.py's grid), N_SWEEP (300).
set -u -o pipefail
OUT=${1:?out dir}; BUDGET=${2:-540}
FAMILY=${FAMILY:-chain}; RUNS=${RUNS:-/tmp/orl_suite_gpu}; N_SWEEP=${N_SWEEP:-300}
SFT_SETS=${SFT_SETS:-"batch_size=128 stages.0.lr=6e-4 stages.1.lr=3e-4"}
START=$(date +%s); mkdir -p "$OUT" "$RUNS"
left() { local l=$(( BUDGET - ($(date +%s) - START) )); [ "$l" -lt 1 ] && l=1; echo "$l"; }   # timeout 0 = none
# SIZE / DEVICE / EXTRA (more suite_runs.py arguments) also serve a smoke run of this script on a CPU
COMMON=(--family "$FAMILY" --out "$RUNS" --size "${SIZE:-large}" --device "${DEVICE:-cuda}" --threads 2 --n-sweep "$N_SWEEP" ${EXTRA:-})
for kv in $SFT_SETS; do COMMON+=(--set-sft "$kv"); done
[ -n "${STEPS:-}" ] && COMMON+=(--steps "$STEPS")
[ -n "${THRESHOLDS:-}" ] && COMMON+=(--thresholds "$THRESHOLDS")
BASE=$RUNS/$FAMILY/sft_s0/final
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/suite_gpu.log"; }
collect() {   # 7 files with gpu_checks.sh's machine.txt (8 at most come back)
  for f in "$RUNS"/*.log; do echo "== $f"; cat "$f"; done > "$OUT/stage_logs.txt" 2>/dev/null
  cp "$RUNS/$FAMILY/results.json" "$OUT/suite_results.json" 2>/dev/null
  cp "$RUNS/$FAMILY/table.markdown" "$OUT/suite_table.markdown" 2>/dev/null
  [ -n "${CALIB:-}" ] && cp "$RUNS/calib/$CALIB/calibration.json" "$OUT/calibration.json" 2>/dev/null
  for d in "$RUNS/$FAMILY"/*/; do   # each trained model's training curve, first and last steps
    [ -f "$d/metrics.jsonl" ] && { head -n 2 "$d/metrics.jsonl"; tail -n 2 "$d/metrics.jsonl"; } \
      | sed "s|^|$(basename "$d"): |"
  done > "$OUT/metrics_ends.txt"
  python3 - "$RUNS/$FAMILY/sft_s0/tb" >> "$OUT/metrics_ends.txt" 2>/dev/null <<'PY'
import sys   # the base SFT's held-out curve (step: accuracy, TPF) from its TensorBoard events: where it plateaus
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1]); ea.Reload()
tags = ea.Tags()["scalars"]
acc = {e.step: e.value for e in ea.Scalars("sft/heldout_accuracy")} if "sft/heldout_accuracy" in tags else {}
tpf = {e.step: e.value for e in ea.Scalars("sft/heldout_tpf")} if "sft/heldout_tpf" in tags else {}
loss = {e.step: e.value for e in ea.Scalars("sft/loss")} if "sft/loss" in tags else {}
sps = {e.step: e.value for e in ea.Scalars("sft/tokens_per_s")} if "sft/tokens_per_s" in tags else {}
for k in sorted(acc):
    print(f"sft_s0 held-out at step {k}: accuracy {acc[k]:.3f}, TPF {tpf.get(k, float('nan')):.2f}")
for k in sorted(loss)[::10] + sorted(loss)[-1:]:
    print(f"sft_s0 step {k}: loss {loss[k]:.4f} tokens/s {sps.get(k, 0):.0f}")
PY
}
trap collect EXIT
log "suite_gpu: $FAMILY at ${SIZE:-large}, budget ${BUDGET}s, runs in $RUNS"
if [ -n "${CALIB:-}" ] && [ ! -f "$RUNS/calib/$CALIB/calibration.json" ]; then
  timeout "$(left)" python3 benchmarks/suite_calibrate.py --family "$CALIB" --out "$RUNS/calib/$CALIB" --device cuda \
    --n-eval 300 --thresholds 0.1,0.3,0.5,0.7,0.8,0.9,0.95 --set device=cuda --quiet >> "$RUNS/calib.log" 2>&1 &
  calib_pid=$!
fi
if [ ! -f "$BASE/config.json" ] || [ ! -f "$RUNS/$FAMILY/start/config.json" ]; then
  log "stage 1: base SFT"
  timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --orl-seeds "" --no-baselines --sweep-only base \
    >> "$RUNS/stage1.log" 2>&1 || { log "stage 1 cut or failed (rc $?)"; tail -n 5 "$RUNS/stage1.log"; exit 0; }
  log "stage 1 done"
fi
[ -n "${calib_pid:-}" ] && { wait "$calib_pid"; tail -n 16 "$RUNS/calib.log"; }
pids=()
for k in 0 1 2; do
  if [ ! -f "$RUNS/$FAMILY/orl_s$k/final/config.json" ]; then
    timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" --orl-seeds "$k" --no-baselines \
      --sweep-only "orl_s$k" >> "$RUNS/stage2_orl_s$k.log" 2>&1 & pids+=($!)
  fi
done
if [ ! -f "$RUNS/$FAMILY/more_sft/final/config.json" ]; then
  timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" --orl-seeds "" --no-orl \
    --sweep-only rft,more_sft >> "$RUNS/stage2_baselines.log" 2>&1 & pids+=($!)
fi
ABL_SEEDS=${ABL_SEEDS:-0,1}
ABLATIONS=${ABLATIONS:-}
for ab in ${ABLATIONS//,/ }; do   # side by side with stage 2 (the GPU is far from full with one model)
  last=${ABL_SEEDS##*,}
  if [ ! -f "$RUNS/$FAMILY/${ab}_s$last/final/config.json" ]; then
    timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" --orl-seeds "$ABL_SEEDS" \
      --ablations "$ab" --no-orl --no-baselines --sweep-only "$(echo "$ABL_SEEDS" | sed "s/\([0-9]*\)/${ab}_s\1/g")" \
      >> "$RUNS/stage2_$ab.log" 2>&1 & pids+=($!)
  fi
done
if [ ${#pids[@]} -gt 0 ]; then
  log "stage 2: ${#pids[@]} training processes"
  fail=0; for p in "${pids[@]}"; do wait "$p" || fail=1; done
  [ $fail = 0 ] || { log "stage 2 cut or failed"; tail -n 3 "$RUNS"/stage2_*.log; exit 0; }
  log "stage 2 done"
fi
log "stage 3: comparison"
SWEEP=(--orl-seeds 0,1,2)
[ -n "${ABLATIONS:-}" ] && SWEEP+=(--ablations "$ABLATIONS" --ablation-seeds "$ABL_SEEDS")
timeout "$(left)" python3 benchmarks/suite_runs.py "${COMMON[@]}" --base "$BASE" "${SWEEP[@]}" \
  >> "$RUNS/stage3.log" 2>&1 || { log "stage 3 cut or failed (rc $?)"; tail -n 5 "$RUNS/stage3.log"; exit 0; }
log "stage 3 done"; tail -n 12 "$RUNS/$FAMILY/table.markdown"
