#!/usr/bin/env bash
# The whole test suite on the GPU machine: CUDA tests (runtime == reference decoder, kernels, LLM on
# CUDA) and every CPU test on a second CPU model with torch 2.11. Wheels the image lacks (fastapi,
# uvicorn, openai, math-verify, ...) travel in .whl (see docs/LOG.md). Usage:
#   bash benchmarks/gpu_tests.sh OUT [pytest args]
set -u -o pipefail
OUT=${1:?out dir}; shift
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep "Model name"; nproc
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 -m pytest -q -p no:cacheprovider -rs --durations=15 "${@:-tests}" 2>&1 | tee "$OUT/tests.log" | tail -n 60
