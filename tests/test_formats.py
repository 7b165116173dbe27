"""Checkpoints in each family's own format (docs/formats.md): what orl saves opens in transformers as
its config says (Qwen3ForCausalLM: the same causal logits; DiffusionGemmaForBlockDiffusion: the
same canvas and causal logits), save -> load gives the same state dict and logits (LLaDA-2.x too;
its parity with the published architecture is tests/test_parity_llada2.py), re-saving keeps the
source format, orl's own fields sit in config.json's ``orl`` block and ``orl_extra.safetensors``,
missing diffusion fields are an error naming them, named sizes get a tokenizer that fits or a
clear error, and nothing of this prints a transformers warning."""
import json
import logging
import os
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion, Qwen3Config, Qwen3ForCausalLM

from orl import LLM
from orl.model import CheckpointError, build_model, find_size, get_config, load_pretrained, save_pretrained
from orl.model.checkpoint import read_tensors
from orl.model.masks import commit_layout
from orl.model.pathway import rescale_pathway
from orl.tokenizer import build_char_tokenizer, tokenizer_for

sys.path.insert(0, os.path.dirname(__file__))
from dg_reference import (  # noqa: E402
    make_tiny_reference, random_ids, random_self_conditioning_logits, reference_decoder_logits,
    reference_encoder_logits,
)
from test_parity_dgemma import _canvas_logits  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOL = 1e-4


def _noisy(model, seed=0):
    """Every weight moved off its init (norms off 1, the pathway's zero W_down non-zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


def _same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return a.config == b.config and set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def test_sdar_saves_as_a_qwen3_checkpoint(tmp_path):
    tok = build_char_tokenizer()
    m = _noisy(build_model(get_config("sdar", "tiny", vocab_size=len(tok))))
    rescale_pathway(m, 8.0)
    d = str(tmp_path / "m")
    save_pretrained(m, d, tokenizer=tok)
    hc = AutoConfig.from_pretrained(d)
    assert isinstance(hc, Qwen3Config) and hc.architectures == ["Qwen3ForCausalLM"]
    assert (hc.intermediate_size, hc.rms_norm_eps, hc.tie_word_embeddings, hc.rope_parameters["rope_theta"],
            hc.head_dim, hc.num_key_value_heads) == (128, 1e-6, True, 10_000.0, 16, 2)
    assert (hc.mask_token_id, hc.block_size) == (tok.mask_token_id, 8)  # SDAR-style top-level keys
    assert json.load(open(os.path.join(d, "generation_config.json")))["eos_token_id"] == tok.eos_token_id
    assert hc.orl == {"pathway": "mlp", "pathway_gamma": 8.0, "pathway_intermediate": 64}
    pathway = {k for k in m.state_dict() if k.startswith("residual_pathway.")}
    assert set(load_file(os.path.join(d, "orl_extra.safetensors"))) == pathway  # other tools ignore this file
    assert not pathway & set(load_file(os.path.join(d, "model.safetensors"))) and pathway <= set(read_tensors(d))
    hf, info = Qwen3ForCausalLM.from_pretrained(d, output_loading_info=True)  # the pathway is in orl_extra
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.randint(0, len(tok), (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, ref = m(ids, torch.arange(13), _causal(13)), hf.eval()(ids).logits
    assert (got - ref).abs().max().item() <= TOL and ref.std() > 0.5
    again = load_pretrained(d)
    assert _same_model(again, m) and again.config.pathway_gamma == 8.0
    z = torch.randn(2, 13, 64, generator=torch.Generator().manual_seed(2))
    where = torch.rand(2, 13, generator=torch.Generator().manual_seed(3)) > 0.5
    with torch.no_grad():
        a = m(ids, torch.arange(13), _causal(13), residual=z, residual_where=where)
        assert torch.equal(a, again(ids, torch.arange(13), _causal(13), residual=z, residual_where=where))


def _hf_qwen3(d, **config):
    cfg = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        Qwen3ForCausalLM(cfg).save_pretrained(d)
    c = {**json.load(open(os.path.join(d, "config.json"))), **config}
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    return c


def test_missing_diffusion_fields_are_an_error_naming_them(tmp_path):
    d = str(tmp_path / "causal")
    _hf_qwen3(d)
    with pytest.raises(CheckpointError, match="no 'mask_token_id' and no 'block_size'.*load_pretrained"):
        load_pretrained(d)
    tok = build_char_tokenizer()
    tok.save_pretrained(d)  # the checkpoint's own tokenizer declares its mask token: only K is missing
    with pytest.raises(CheckpointError, match="no 'block_size'") as e:
        load_pretrained(d)
    assert "mask_token_id" not in str(e.value).split(":")[0]
    assert load_pretrained(d, block_size=4).config.mask_token_id == tok.mask_token_id == 3


def test_resaving_keeps_the_source_format(tmp_path):
    src = _hf_qwen3(str(tmp_path / "hf"), mask_token_id=95, block_size=4, bos_token_id=1, use_cache=False)
    m = load_pretrained(str(tmp_path / "hf"))
    save_pretrained(m, str(tmp_path / "again"))
    out = json.load(open(tmp_path / "again" / "config.json"))
    assert {k: v for k, v in out.items() if k != "transformers_version"} == \
        {k: v for k, v in src.items() if k != "transformers_version"}
    assert _same_model(load_pretrained(str(tmp_path / "again")), m)
    # an SDAR config (its own model_type and modeling code, transformers-4 RoPE keys) stays SDAR
    sdar = {k: v for k, v in src.items() if k not in ("rope_parameters", "layer_types")}
    sdar.update(model_type="sdar", architectures=["SDARForCausalLM"], rope_theta=10_000.0, rope_scaling=None,
                auto_map={"AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"})
    json.dump(sdar, open(tmp_path / "hf" / "config.json", "w"))
    m = load_pretrained(str(tmp_path / "hf"))
    save_pretrained(m, str(tmp_path / "sdar"))
    out = json.load(open(tmp_path / "sdar" / "config.json"))
    assert out == {**sdar, "dtype": "float32"} and "rope_parameters" not in out
    # a LLaDA-2.x model stays llada2_moe (its key map: tests/test_parity_llada2.py)
    lm = _noisy(build_model(get_config("llada", "tiny")))
    save_pretrained(lm, str(tmp_path / "llada"))
    names = read_tensors(str(tmp_path / "llada"))
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in names and "model.word_embeddings.weight" in names
    again = load_pretrained(str(tmp_path / "llada"))
    assert _same_model(again, lm)
    save_pretrained(again, str(tmp_path / "llada2"))
    assert json.load(open(tmp_path / "llada2" / "config.json"))["model_type"] == "llada2_moe"
    # orl's former own format (model_type "orl" + our whole config) loads, and saves as its family's
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    ours = {k: v for k, v in lm.config.to_dict().items() if k != "source"}
    json.dump({"model_type": "orl", "orl": ours}, open(legacy / "config.json", "w"))
    save_file({k: v for k, v in lm.state_dict().items() if k != "lm_head.weight"}, str(legacy / "model.safetensors"))
    old = load_pretrained(str(legacy))
    assert _same_model(old, lm)
    save_pretrained(old, str(tmp_path / "from_legacy"))
    assert json.load(open(tmp_path / "from_legacy" / "config.json"))["model_type"] == "llada2_moe"


def test_a_config_the_format_cannot_hold_is_refused():
    m = build_model(get_config("sdar", "tiny", embed_scale=8.0))
    with pytest.raises(CheckpointError, match="qwen3 format cannot hold .*embed_scale=8.0"):
        save_pretrained(m, "/nonexistent/never-written")


@pytest.mark.parametrize("gamma", [1.0, 8.0])
def test_dgemma_saves_as_a_diffusiongemma_checkpoint(tmp_path, gamma):
    hf, _ = make_tiny_reference(seed=0, distinct_layer_scalars=True)
    hf.save_pretrained(str(tmp_path / "hf"))
    ours = load_pretrained(str(tmp_path / "hf")).eval()
    if gamma != 1.0:
        rescale_pathway(ours, gamma)  # stored x gamma in ours; transformers gets the function's weight
    save_pretrained(ours, str(tmp_path / "ours"))
    back, info = DiffusionGemmaForBlockDiffusion.from_pretrained(str(tmp_path / "ours"), output_loading_info=True)
    back = back.eval()
    back.set_experts_implementation("eager")
    assert not info["unexpected_keys"] and all(".vision_tower." in k or ".embed_vision." in k
                                               for k in info["missing_keys"])  # text only
    prompt, canvas = random_ids(2, 7, 256, seed=2), random_ids(2, 16, 256, seed=3)
    sc = random_self_conditioning_logits(2, 16, 256, seed=1)
    z = ours.soft_embed(torch.softmax(sc, -1, dtype=torch.float32))
    with torch.no_grad():
        got = _canvas_logits(ours, prompt, prompt[:, :0], canvas, z, cached=False)
        ids = random_ids(2, 20, 256, seed=5)
        lay = commit_layout(20, 0, 16, "causal")
        causal = ours(ids, lay.positions, lay.mask())
    assert (got - reference_decoder_logits(back, prompt, canvas, sc)).abs().max().item() <= TOL
    assert (causal - reference_encoder_logits(back, ids)).abs().max().item() <= TOL
    again = load_pretrained(str(tmp_path / "ours"))
    assert _same_model(again, ours) and again.config.pathway_gamma == gamma


def test_named_sizes_get_a_fitting_tokenizer_or_a_clear_error():
    for name in ("qwen3-4b", "qwendlm-4b"):
        cfg = find_size(name)
        assert tokenizer_for(cfg.vocab_size, cfg.mask_token_id) == "qwen3" and cfg.mask_token_id == 151_669
    for name in ("sdar/tiny", "sdar/medium", "llada/tiny", "dgemma/tiny"):
        assert tokenizer_for(find_size(name).vocab_size, 3) == "char"
    with pytest.raises(ValueError, match="157184 with mask id 156895.*LLaDA-2.x.*tokenizer="):
        LLM("llada2.1-mini")  # before building 16B random weights
    with pytest.raises(ValueError, match="262144.*Gemma"):
        LLM("diffusiongemma-26b-a4b")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _loud(fn) -> list[str]:
    """What ``fn()`` printed through transformers' logger or the warnings module."""
    h, log = _Records(), logging.getLogger("transformers")
    log.addHandler(h)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn()
    finally:
        log.removeHandler(h)
    return [r.getMessage() for r in h.records] + [str(x.message) for x in w]


def test_checkpoints_and_their_own_tokenizers_load_without_a_warning(tmp_path):
    tok = build_char_tokenizer("0123456789abc+= \n")  # not the default alphabet: LLM must use this one
    for fam in ("sdar", "llada", "dgemma"):
        m = build_model(get_config(fam, "tiny", vocab_size=len(tok),
                                   **({} if fam == "dgemma" else {"mask_token_id": tok.mask_token_id})))
        d = str(tmp_path / fam)
        save_pretrained(m, d, tokenizer=tok)
        out = []
        assert not _loud(lambda d=d, out=out: out.append(LLM(d))), fam
        assert out[0].tokenizer.get_vocab() == tok.get_vocab() and out[0].model.config.family == fam
        assert not _loud(lambda d=d: load_pretrained(d))
    # the capture hears transformers: its own AutoTokenizer warns on a model type it has no class for
    assert any("llada2_moe" in s for s in _loud(lambda: AutoTokenizer.from_pretrained(str(tmp_path / "llada"))))
