"""Parity with transformers' DiffusionGemma (docs/diffusiongemma-spec.md): the tiny random HF model
of tests/dg_reference.py, saved with ``save_pretrained`` and loaded by ``orl.model.load_pretrained``,
gives the same float32 logits (max |diff| <= 1e-4) in both modes of the one model:
  (a) canvas / decoder mode: the prompt (and a committed block) written causally into our KV
      cache, then the canvas bidirectionally over it, with and without self-conditioning; prompts
      shorter and longer than the sliding window W = 8; cached and uncached layouts;
  (b) causal / encoder mode, in one call and chunked through the cache.
The reference uses distinct encoder / decoder ``layer_scalar`` values, so a loader or model that
mixes up the two modes fails here.
"""
import json
import os
import sys
import tempfile

import pytest
import torch

from orl.model import get_config, load_pretrained, save_pretrained
from orl.model.checkpoint.dgemma import config_from_dgemma, dgemma_to_ours, ours_to_dgemma
from orl.model.masks import commit_layout, decode_layout, step_mask

sys.path.insert(0, os.path.dirname(__file__))
from dg_reference import (  # noqa: E402
    checkpoint_state_dict, make_tiny_reference, random_ids, random_self_conditioning_logits,
    reference_decoder_logits, reference_encoder_logits,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOL = 1e-4
B, V, C = 2, 256, 16


@pytest.fixture(scope="module")
def pair():
    hf, _ = make_tiny_reference(seed=0, distinct_layer_scalars=True)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            hf_json = json.load(f)
        ours = load_pretrained(d).eval()
    return hf, ours, hf_json


def _encode(model, ids, cache, clean_len):
    """Causal (encoder-mode) pass writing ``ids`` after ``clean_len`` cached tokens."""
    lay = commit_layout(clean_len, ids.shape[1], C, "causal")
    return model(ids, lay.positions[clean_len:], step_mask(lay, clean_len), cache=cache, store_kv=True)


def _canvas_logits(model, prompt, committed, canvas, z, cached: bool):
    """Our canvas-mode logits (B, C, V): ``residual_where`` = every canvas position."""
    P, n = prompt.shape[1], committed.shape[1]
    where = torch.ones(B, C, dtype=torch.bool)
    lay = decode_layout(P, n, C, C, "causal")
    if cached:
        cache = model.new_cache(B, P + n + C)
        _encode(model, prompt, cache, 0)
        if n:
            _encode(model, committed, cache, P)
        return model(canvas, lay.positions[P + n:], step_mask(lay, P + n), residual=z, residual_where=where,
                     cache=cache)
    tokens = torch.cat([prompt, committed, canvas], 1)
    full_where = torch.cat([torch.zeros(B, P + n, dtype=torch.bool), where], 1)
    full_z = None if z is None else torch.cat([z.new_zeros(B, P + n, z.shape[-1]), z], 1)
    return model(tokens, lay.positions, lay.mask(), residual=full_z, residual_where=full_where)[:, P + n:]


def test_config_is_the_tiny_size(pair):
    _, ours, hf_json = pair
    assert ours.config == get_config("dgemma", "tiny")
    # the constructor form of the per-layer head dims converts to the same config
    t = {k: v for k, v in hf_json["text_config"].items() if k != "per_layer_config"}
    alt = config_from_dgemma({**hf_json, "text_config": {**t, "global_head_dim": 32, "num_global_key_value_heads": 1}})
    assert alt == ours.config


@pytest.mark.parametrize("P,committed", [(3, 0), (7, 0), (12, 0), (30, 0), (5, 16)])
@pytest.mark.parametrize("selfcond", [False, True])
def test_canvas_mode_logits(pair, P, committed, selfcond):
    hf, ours, _ = pair
    prompt, canvas = random_ids(B, P, V, seed=2), random_ids(B, C, V, seed=3)
    done = random_ids(B, committed, V, seed=4)
    sc = random_self_conditioning_logits(B, C, V, seed=1) if selfcond else None
    ref = reference_decoder_logits(hf, prompt, canvas, sc, committed_ids=done if committed else None)
    # z = the soft embedding of the (temperature-processed) previous logits, as the decoder feeds it
    z = None if sc is None else ours.soft_embed(torch.softmax(sc, -1, dtype=torch.float32))
    with torch.no_grad():
        for cached in (True, False):
            got = _canvas_logits(ours, prompt, done, canvas, z, cached)
            assert (got - ref).abs().max().item() <= TOL, (P, committed, selfcond, cached, (got - ref).abs().max())


@pytest.mark.parametrize("chunks", [None, [12, 16], [5, 16, 7]])
def test_causal_mode_logits(pair, chunks):
    hf, ours, _ = pair
    T = 28
    ids = random_ids(B, T, V, seed=5)
    ref = reference_encoder_logits(hf, ids, chunks=chunks)
    with torch.no_grad():
        if chunks is None:
            lay = commit_layout(T, 0, C, "causal")
            got = ours(ids, lay.positions, lay.mask())
        else:
            cache, parts, start = ours.new_cache(B, T), [], 0
            for n in chunks:
                parts.append(_encode(ours, ids[:, start:start + n], cache, start))
                start += n
            got = torch.cat(parts, 1)
    assert (got - ref).abs().max().item() <= TOL, (chunks, (got - ref).abs().max())


def test_key_mapping_round_trip(pair, tmp_path):
    hf, ours, _ = pair
    ck = checkpoint_state_dict(hf)
    text = {k for k in ck if ".vision_tower." not in k and ".embed_vision." not in k}
    state = ours.state_dict()
    state.pop("lm_head.weight")  # tied
    back = ours_to_dgemma(ours.config, state)
    assert set(back) == text
    assert all(torch.equal(back[k], ck[k]) for k in text)
    again = dgemma_to_ours(ours.config, back)
    assert set(again) == set(state) and all(torch.equal(again[k], state[k]) for k in state)
    # our own save (orl format) reloads to the same function
    save_pretrained(ours, str(tmp_path / "m"))
    re = load_pretrained(str(tmp_path / "m")).eval()
    ids = random_ids(1, 9, V, seed=6)
    lay = commit_layout(9, 0, C, "causal")
    with torch.no_grad():
        assert torch.equal(re(ids, lay.positions, lay.mask()), ours(ids, lay.positions, lay.mask()))
