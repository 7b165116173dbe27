"""Our dgemma decoder vs transformers' DiffusionGemma ``generate`` (docs/diffusiongemma-spec.md 9).

Two comparisons, as the spec suggests:
  * replay (exact, independent of float noise): our decode loop runs on HF's own logits. A stand-in
    model returns, for each decoder call, the raw logits HF's traced ``generate`` produced for that
    call, and asserts that our loop feeds exactly HF's canvas, positions and self-conditioning input.
    With ``torch.Generator().manual_seed(s)`` against HF's ``torch.manual_seed(s)`` the random draws
    are the same stream, so every canvas, the number of steps, early stopping, re-noising and the
    committed (argmax) tokens must be identical -- bit for bit.
  * end to end: our loaded model decodes token-for-token like HF in short settings. Longer
    trajectories are not comparable: the self-conditioning loop of this random tiny model
    amplifies float32 noise (~1e-5 per call) by ~2.5x per step, and HF's own eager and SDPA
    attention diverge the same way after ~10 steps.
"""
import os
import sys
import tempfile

import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.decode import samplers as S
from orl.model import load_pretrained

sys.path.insert(0, os.path.dirname(__file__))
from dg_reference import make_tiny_reference, random_ids, reference_generate  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
C = 16


@pytest.fixture(scope="module")
def pair():
    hf, _ = make_tiny_reference(seed=0)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = load_pretrained(d).eval()
    return hf, ours


class Replay:
    """Stands in for the model inside ``decode``: canvas calls return HF's recorded logits after
    checking that the positions are HF's; prefill / commit calls (store_kv) do nothing. The
    canvas and self-conditioning inputs are checked from the trace, on rows still denoising (a
    row that stopped early is frozen; HF keeps feeding its last sampled canvas, ours its
    committed argmax -- either is ignored)."""

    def __init__(self, ours, steps):
        self.config, self.model, self.ours = ours.config, ours.model, ours
        self.steps, self.calls = steps, 0

    def new_cache(self, batch, max_len):
        return object()

    def soft_embed(self, probs):
        return self.ours.soft_embed(probs)

    def __call__(self, tokens, positions, mask, residual=None, residual_where=None, residual_weight=None,
                 cache=None, store_kv=False):
        if store_kv:
            return None
        s = self.steps[self.calls]
        self.calls += 1
        assert torch.equal(positions.view(-1), s["position_ids"].view(-1).long())
        assert (residual is None) == (s["sc_logits_in"] is None) and bool(residual_where.all())
        return s["logits"]


def _hf_tokens(out, P, eos):
    rows = out.sequences[:, P:].tolist()
    if eos is None:
        return rows
    return [r[:r.index(eos) + 1] if eos in r else r for r in rows]


def _decode_cfg(N, new, t_min, t_max, bound, stab, conf, greedy=False):
    return DecodeConfig(rule="dgemma", block_size=C, max_new_tokens=new, steps=N, t_min=t_min, t_max=t_max,
                        entropy_bound=bound, stability_threshold=stab, confidence_threshold=conf,
                        temperature=0.0 if greedy else 0.8)


REPLAYS = {  # name: (B, P, seed, N, max_new_tokens, t_min, t_max, entropy_bound, stability, confidence, eos)
    "schedule, no early stop, B=2": (2, 12, 0, 8, 2 * C, 0.4, 0.8, 0.1, 1, 0.005, None),
    "rows stop at different steps": (2, 30, 1, 16, C, 0.4, 0.8, 1.0, 0, 1.0, None),
    "stable for 2 steps, low temperature": (1, 5, 2, 12, C, 0.01, 0.02, 0.1, 2, 0.005, None),
    "eos ends decoding": (1, 9, 3, 6, 3 * C, 0.4, 0.8, 0.3, 1, 0.005, "probe"),
}


@pytest.mark.parametrize("name", list(REPLAYS))
def test_sampler_replays_hf_generate(pair, name):
    hf, ours = pair
    B, P, seed, N, new, t_min, t_max, bound, stab, conf, eos = REPLAYS[name]
    prompt = random_ids(B, P, 256, seed=10 + seed)
    kw = dict(max_new_tokens=new, max_denoising_steps=N, t_min=t_min, t_max=t_max, stability_threshold=stab,
              confidence_threshold=conf)
    if eos == "probe":  # a token HF commits in the first canvas becomes the EOS
        first = reference_generate(hf, prompt, seed=seed, entropy_bound=bound, eos_token_id=None,
                                   **{**kw, "max_new_tokens": C})
        eos = int(first.sequences[0, P + 5])
    out, steps = reference_generate(hf, prompt, seed=seed, entropy_bound=bound, trace=True, eos_token_id=eos,
                                    pad_token_id=0, **kw)
    rep = Replay(ours, steps)
    g = torch.Generator().manual_seed(seed)
    got = decode(rep, prompt, _decode_cfg(N, new, t_min, t_max, bound, stab, conf),
                 eos_ids=() if eos is None else [eos], trace=True, generator=g)
    assert rep.calls == len(steps)
    assert got.tokens == _hf_tokens(out, P, eos)
    if B == 1:
        assert sum(got.steps_per_block[0]) == len(steps)
    # every step fed HF's canvas and HF's self-conditioning input, and the trace records exactly
    # the z consumed: z = c softmax(processed logits) @ E, as HF's decoder computes it
    for i, (rec, s) in enumerate(zip(got.trace, steps)):
        a = rec.active
        assert torch.equal(rec.canvas[a], s["canvas_in"][a]), f"canvas differs at decoder call {i}"
        if s["sc_logits_in"] is not None:
            want = ours.soft_embed(torch.softmax(s["sc_logits_in"], -1, dtype=torch.float32))
            assert torch.equal(rec.residual[a], want[a]), f"self-conditioning input differs at call {i}"
    if name == "rows stop at different steps":
        assert got.steps_per_block[0] != got.steps_per_block[1] and max(got.steps_per_block[0]) < N
    if name == "stable for 2 steps, low temperature":
        assert got.steps_per_block[0][0] < N
    if name == "eos ends decoding":
        assert got.finish_reason == ["stop"] and len(got.steps_per_block[0]) < 3


@pytest.mark.parametrize("t_min,t_max,N,new", [(0.4, 0.8, 8, 2 * C), (0.01, 0.02, 12, 2 * C)])
def test_end_to_end_matches_hf_generate(pair, t_min, t_max, N, new):
    hf, ours = pair
    P, seed = 12, 0
    prompt = random_ids(1, P, 256, seed=2)
    out, steps = reference_generate(hf, prompt, seed=seed, entropy_bound=0.1, trace=True, eos_token_id=None,
                                    max_new_tokens=new, max_denoising_steps=N, t_min=t_min, t_max=t_max)
    g = torch.Generator().manual_seed(seed)
    got = decode(ours, prompt, _decode_cfg(N, new, t_min, t_max, 0.1, 1, 0.005), trace=True, trace_logits=True,
                 generator=g)
    assert got.tokens == out.sequences[:, P:].tolist()
    assert len(got.trace) == len(steps)
    # the first step of each canvas sees identical inputs: logits agree to float32 noise
    for rec, s in zip(got.trace, steps):
        if s["sc_logits_in"] is None:
            assert (rec.logits - s["logits"]).abs().max().item() <= 1e-4


def test_temperature_is_bitwise_hf():
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import LinearTemperatureScheduleLogitsProcessor
    x = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    for N in (7, 48):
        proc = LinearTemperatureScheduleLogitsProcessor(0.4, 0.8, N)
        for n in range(1, N + 1):
            want = proc(None, x, torch.tensor(n, dtype=torch.int32))
            assert torch.equal(x / S.dgemma_temperature(n, N, 0.4, 0.8), want)
