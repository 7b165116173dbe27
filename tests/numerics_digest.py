"""Digest of the smoke recipes' numerics: SFT -> ORL start (gamma 8) -> ORL, through the `orl` CLI.

Used by tests/test_refactor_invisible.py (docs/STYLE.md 13: a refactor is numerically invisible). Runs
``orl sft --recipe arith_sft_smoke``, ``orl convert scrp`` and ``orl train --recipe orl_arith_smoke``
in a child process whose floating point does not depend on the CPU: one thread, ATen's portable
kernels (``ATEN_CPU_CAPABILITY=default``) and MKL's conditional numerical reproducibility
(``MKL_CBWR=COMPATIBLE``), so two machines with different vector units give the same bits.
Prints one JSON object: sha256 of every final tensor (read with safetensors, not through orl) and
the ORL step metrics (losses, rewards, TPF; not timings) as float hex strings.

    python tests/numerics_digest.py [--write]     # --write: record tests/fixtures/numerics.json
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

def _vendor() -> str:
    """The CPU vendor (/proc/cpuinfo's vendor_id; "" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


# One fixture per CPU vendor: even in the child's portable setting (below), the smoke recipes' last bits
# differ between Intel and AMD processors (measured 2026-12-02 on the code of 1d5960a: a few ulps in the
# SFT's weights), so each vendor is held to its own record, both recorded from the same commit's code.
_FIXTURES = {"AuthenticAMD": "numerics_amd.json"}
FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", _FIXTURES.get(_vendor(), "numerics.json"))
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ORL_THREADS": "1", "ATEN_CPU_CAPABILITY": "default",
       "MKL_CBWR": "COMPATIBLE", "CUDA_VISIBLE_DEVICES": "", "PYTHONHASHSEED": "0"}


def _tensors(model_dir: str) -> dict:
    from safetensors.torch import load_file
    out = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        for k, v in load_file(f).items():
            out[k] = hashlib.sha256(v.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes()).hexdigest()[:16]
    return out


def digest(work: str) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, **ENV,
           "PYTHONPATH": os.path.join(here, "fixtures") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    orl = [sys.executable, "-m", "orl.cli"]

    def run(*args):
        r = subprocess.run([*orl, *args], env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"orl {' '.join(args)} failed:\n{r.stderr[-3000:]}")

    sft, start, orl_out = (os.path.join(work, d) for d in ("sft", "start", "orl"))
    run("sft", "--recipe", "arith_sft_smoke", "--out", sft, "--quiet")
    run("convert", "scrp", "--in", os.path.join(sft, "final"), "--out", start, "--gamma", "8")
    # the coin task verifies about half of any output, so a barely trained model still updates
    run("train", "--recipe", "orl_arith_smoke", "--init", start, "--out", orl_out, "--quiet",
        "--task", "coin_task:make_task", "--set", "steps=4", "--set", "decode.max_new_tokens=32")
    losses = []
    with open(os.path.join(orl_out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            losses.append({k: float(v).hex() for k, v in sorted(r.items())  # rollout stats and losses
                           if not k.endswith("_per_s") and isinstance(v, (int, float))})
    return {"sft_final": _tensors(os.path.join(sft, "final")), "orl_final": _tensors(os.path.join(orl_out, "final")),
            "orl_losses": losses}


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        d = digest(work)
    if "--write" in sys.argv:
        os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
        tmp = FIXTURE + ".tmp"
        with open(tmp, "w") as f:
            json.dump(d, f, indent=1, sort_keys=True)
        os.replace(tmp, FIXTURE)
    print(json.dumps(d, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
