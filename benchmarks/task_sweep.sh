#!/usr/bin/env bash
# Several embedded-task variants at once on a many-core machine: for each base spec, the demo's SFT
# recipe with that spec's overrides, then ORL variants from it (benchmarks/orl_sweep.py, with the same
# task overrides), all evaluated on 500 held-out problems. Usage:
#   VARIANTS="full: t05:decode.temperature=0.5" bash benchmarks/task_sweep.sh OUT \
#       "s50:task_kwargs.shuffle=0.5" "s75:task_kwargs.shuffle=0.75"
# Writes OUT/NAME.sweep.json (final table), OUT/partial.json (curves so far, refreshed every 20 s).
set -u
OUT=${1:?out dir}; shift
LIMIT=${LIMIT:-560}; SFT_THREADS=${SFT_THREADS:-4}; VARIANTS=${VARIANTS:-full:}; WORK=${WORK:-/tmp/ts}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" "$WORK"
for spec in "$@"; do
  name=${spec%%:*}; sets=${spec#*:}
  (
    setargs=(); IFS=, read -ra S <<< "$sets"; for s in "${S[@]}"; do [ -n "$s" ] && setargs+=(--set "$s"); done
    vargs=(); for v in $VARIANTS; do vargs+=(--variant "$v"); done
    OMP_NUM_THREADS=$SFT_THREADS timeout $LIMIT python -m orl sft --recipe arith_sft --out "$WORK/$name/sft" \
        "${setargs[@]}" > "$OUT/$name.sft.log" 2>&1
    OMP_NUM_THREADS=2 timeout $LIMIT python benchmarks/orl_sweep.py --base "$WORK/$name/sft/final" \
        --out "$WORK/$name/sweep" --jobs ${JOBS:-2} --threads 2 --n-eval 500 "${setargs[@]}" "${vargs[@]}" \
        > "$OUT/$name.sweep.log" 2>&1
    cp "$WORK/$name/sweep/sweep.json" "$OUT/$name.sweep.json" 2>/dev/null
  ) &
done
( while sleep 20; do WORK=$WORK python - <<'PY' > "$OUT/partial.json.tmp" 2>/dev/null && mv "$OUT/partial.json.tmp" "$OUT/partial.json"
import glob, json, os
w = os.environ["WORK"]
out = {p[len(w) + 1:]: json.load(open(p)) for p in glob.glob(f"{w}/*/sweep/*/eval.json")}
curves = {}
for p in glob.glob(f"{w}/*/sweep/*/metrics.jsonl"):
    rows = [json.loads(l) for l in open(p) if "eval_accuracy" in l]
    curves[p[len(w) + 1:]] = [(r["step"], round(r["eval_accuracy"], 3), round(r["eval_tpf"], 2)) for r in rows]
sft = {}
for p in glob.glob(f"{w}/*/sft/metrics.jsonl"):
    rows = [json.loads(l) for l in open(p) if "eval_accuracy" in l]
    sft[p[len(w) + 1:]] = rows[-1] if rows else None
print(json.dumps({"final": out, "curves": curves, "sft": sft}, indent=1))
PY
done ) &
POLL=$!
wait $(jobs -p | grep -v "^$POLL$") 2>/dev/null
sleep 1; kill $POLL 2>/dev/null
for f in "$OUT"/*.sweep.log; do echo "== $f"; tail -n 8 "$f"; done
