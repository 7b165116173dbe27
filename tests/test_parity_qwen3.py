"""Parity with transformers' Qwen3: same random weights, same logits under the causal mask."""
import os
import tempfile

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from orl.model import load_pretrained
from orl.model.masks import Layout, clean_blocks

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _reference(tie: bool):
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=tie, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with torch.random.fork_rng(devices=[]):  # HF's init draws from the global RNG: keep it off the caller's
        ref = Qwen3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every weight redrawn from an explicit generator; random norm weights so the test sees them
        for n, p in ref.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(cfg.initializer_range * torch.randn(p.shape, generator=g))
    return ref


def test_qwen3_logits_match_transformers():
    for tie in (True, False):
        ref = _reference(tie)
        with tempfile.TemporaryDirectory() as d:
            ref.save_pretrained(d)
            ours = load_pretrained(d, mask_token_id=255, block_size=4).eval()  # a causal Qwen3 has neither
        tokens = torch.randint(0, 256, (2, 23), generator=torch.Generator().manual_seed(1))
        T = tokens.shape[1]
        # causal == block-causal with one block per token (prompt-style block ids)
        blk = clean_blocks(T, 0, 4)
        lay = Layout(blk, torch.full((T,), -1), torch.zeros(T, dtype=torch.long), torch.arange(T))
        with torch.no_grad():
            a = ref(tokens).logits
            b = ours(tokens, lay.positions, lay.mask())
        assert (a - b).abs().max().item() <= 1e-4, (tie, (a - b).abs().max())
