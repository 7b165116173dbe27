"""Block-diffusion attention masks as pure functions of per-token metadata.

Every layout the project uses (the two-copy SFT layout, inference over cache + block, ORL's packed
replay with many noisy states) is described by three integers per token and ONE visibility rule:

  block   -- the block the token belongs to (a noisy token: the block it denoises). Prompt tokens
             and, for ``clean_attention="causal"``, committed response tokens get one block each,
             so block-causal visibility is plain causal there.
  state   -- -1 for clean/committed tokens, else the id of the noisy state (canvas) it belongs to.
  segment -- packed sample id; tokens of different segments never see each other.

Rule (docs/method.md 1.2 generalised as in 3.5): query q may attend key k iff same segment and
  clean q: k clean and block(k) <= block(q)                        (staircase / block-causal)
  noisy q: (k clean and block(k) < block(q)) or state(k) == state(q)  (prefix + own canvas)
Clean tokens never see noisy ones; a noisy canvas never sees its own clean copy, later blocks or
other noisy states.

Does not own: position ids beyond the layouts below, or how the mask is executed: a dense (T, T)
bool mask for SDPA (`Layout.mask`), or the same rule as a FlexAttention ``mask_mod`` over per-token
metadata (`staircase_block_mask`), whose BlockMask skips the tiles no query of a tile can see.
Shapes: B batch, T tokens, P prompt length, R response length, K block length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Layout:
    """Per-token metadata (each (T,) int64) plus absolute positions for RoPE."""

    block: torch.Tensor
    state: torch.Tensor
    segment: torch.Tensor
    positions: torch.Tensor

    def mask(self) -> torch.Tensor:
        """(T, T) bool visibility of this layout."""
        return visible(self.block, self.state, self.segment, self.block, self.state, self.segment)

    def cat(self, other: "Layout") -> "Layout":
        return Layout(*(torch.cat([a, b]) for a, b in zip(
            (self.block, self.state, self.segment, self.positions),
            (other.block, other.state, other.segment, other.positions))))


def visible(q_block, q_state, q_segment, k_block, k_state, k_segment) -> torch.Tensor:
    """The block-diffusion visibility rule; q_* (..., Tq), k_* (..., Tk) -> (..., Tq, Tk) bool."""
    qb, qs, qg = q_block[..., :, None], q_state[..., :, None], q_segment[..., :, None]
    kb, ks, kg = k_block[..., None, :], k_state[..., None, :], k_segment[..., None, :]
    k_clean, q_clean = ks < 0, qs < 0
    clean_rule = k_clean & (kb <= qb)
    noisy_rule = (k_clean & (kb < qb)) | (ks == qs)
    return (qg == kg) & torch.where(q_clean, clean_rule, noisy_rule)


def clean_blocks(prompt_len: int, resp_len: int, K: int, clean_attention: str = "block") -> torch.Tensor:
    """Block ids (P+R,) of committed text: one id per prompt token, then one per K-block of the
    response (``"block"``) or one per response token (``"causal"``). Blocks start at the prompt end."""
    j = torch.arange(resp_len)
    resp = prompt_len + (j // K if clean_attention == "block" else j)
    return torch.cat([torch.arange(prompt_len), resp])


def canvas_block(prompt_len: int, block_index: int, K: int, clean_attention: str = "block") -> int:
    """Block id carried by every noisy token of response block ``block_index``."""
    return prompt_len + (block_index if clean_attention == "block" else block_index * K)


def two_copy_layout(prompt_len: int, resp_len: int, K: int, clean_attention: str = "block",
                    segment: int = 0, pos_offset: int = 0) -> Layout:
    """[prompt | clean response | noisy response] for block-diffusion SFT (one noisy state per
    block, state id = block index); noisy tokens reuse the clean copy's positions."""
    P, R = prompt_len, resp_len
    clean = clean_blocks(P, R, K, clean_attention)
    nb = torch.arange(R) // K
    noisy_block = torch.tensor([canvas_block(P, int(b), K, clean_attention) for b in nb], dtype=torch.long)
    block = torch.cat([clean, noisy_block])
    state = torch.cat([torch.full((P + R,), -1), nb])
    pos = torch.cat([torch.arange(P + R), P + torch.arange(R)]) + pos_offset
    return Layout(block, state, torch.full_like(block, segment), pos)


def decode_layout(prompt_len: int, committed_len: int, canvas_len: int, K: int,
                  clean_attention: str = "block") -> Layout:
    """[prompt | committed blocks | canvas]: the uncached view of one denoising step."""
    clean = clean_blocks(prompt_len, committed_len, K, clean_attention)
    b = committed_len // K
    cb = canvas_block(prompt_len, b, K, clean_attention)
    block = torch.cat([clean, torch.full((canvas_len,), cb)])
    state = torch.cat([torch.full((prompt_len + committed_len,), -1), torch.zeros(canvas_len, dtype=torch.long)])
    pos = torch.arange(prompt_len + committed_len + canvas_len)
    return Layout(block, state, torch.zeros_like(block), pos)


def step_mask(layout: Layout, new_from: int) -> torch.Tensor:
    """Rows ``new_from:`` of ``layout.mask()``: what the tokens after a cache of ``new_from``
    tokens see when the cache holds the first ``new_from`` tokens. (T_new, T) bool."""
    m = layout
    return visible(m.block[new_from:], m.state[new_from:], m.segment[new_from:], m.block, m.state, m.segment)


def commit_layout(prompt_len: int, committed_len: int, K: int, clean_attention: str = "block") -> Layout:
    """All tokens clean: the layout whose rows ``cache_len:`` a commit pass computes."""
    block = clean_blocks(prompt_len, committed_len, K, clean_attention)
    n = prompt_len + committed_len
    return Layout(block, torch.full((n,), -1), torch.zeros(n, dtype=torch.long), torch.arange(n))


def staircase_block_mask(block: torch.Tensor, state: torch.Tensor, segment: torch.Tensor, block_size: int = 128):
    """The rule of `visible` as a FlexAttention BlockMask over B rows of per-token metadata
    (block, state, segment each (B, T) int64), for `orl.model.transformer.Transformer.forward`'s
    ``mask``: the packed replay of docs/method.md 3.5 without a (B, T, T) tensor, and with the tiles
    no query can see skipped. ``block_size`` is FlexAttention's tile (128; smaller for tiny tests)."""
    from torch.nn.attention.flex_attention import create_block_mask  # noqa: PLC0415

    def mask_mod(b, h, q, k):
        qb, qs, qg = block[b, q], state[b, q], segment[b, q]
        kb, ks, kg = block[b, k], state[b, k], segment[b, k]
        k_clean = ks < 0
        clean_rule = k_clean & (kb <= qb)
        noisy_rule = (k_clean & (kb < qb)) | (ks == qs)
        return (qg == kg) & torch.where(qs < 0, clean_rule, noisy_rule)

    B, T = block.shape
    return create_block_mask(mask_mod, B, None, T, T, device=block.device, BLOCK_SIZE=block_size)

