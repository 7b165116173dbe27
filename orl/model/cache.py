"""Static KV cache: buffers allocated once, written in place by the commit forward.

Owns the per-layer key/value buffers (and the absolute positions of cached tokens, which
sliding-window layers need). A forward with ``store=False`` attends to cache + new keys without
writing; ``store=True`` writes the new keys at ``length`` (the cache-commit pass of
docs/method.md 1.3) and the model advances ``length`` after its last layer.
Does not own: which tokens are committed (the decoder decides) or masks (``orl.model.masks``).
"""
from __future__ import annotations

import torch


class KVCache:
    """Per-layer K/V of shape (B, Hkv, max_len, hd); ``length`` tokens are valid."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int | list[int], max_len: int,
                 head_dim: int | list[int], dtype: torch.dtype, device: torch.device | str):
        hkv = num_kv_heads if isinstance(num_kv_heads, list) else [num_kv_heads] * num_layers
        hds = head_dim if isinstance(head_dim, list) else [head_dim] * num_layers
        self.k = [torch.zeros(batch, h, max_len, d, dtype=dtype, device=device) for h, d in zip(hkv, hds)]
        self.v = [torch.zeros(batch, h, max_len, d, dtype=dtype, device=device) for h, d in zip(hkv, hds)]
        self.positions = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.max_len, self.length = max_len, 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, store: bool):
        """k, v (B, Hkv, T, hd) for the new tokens; returns keys/values over cache + new."""
        L, T = self.length, k.shape[2]
        if L + T > self.max_len:
            raise ValueError(f"KV cache overflow: {L} cached + {T} new > max_len {self.max_len}; "
                             "raise max_len (prompt + max_new_tokens + one block)")
        if store:
            self.k[layer][:, :, L:L + T] = k
            self.v[layer][:, :, L:L + T] = v
            return self.k[layer][:, :, :L + T], self.v[layer][:, :, :L + T]
        return torch.cat([self.k[layer][:, :, :L], k], 2), torch.cat([self.v[layer][:, :, :L], v], 2)

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Absolute positions (B, S) of cache + new tokens (``positions`` (B, T))."""
        return torch.cat([self.positions[:, :self.length], positions], 1)

    def advance(self, positions: torch.Tensor) -> None:
        T = positions.shape[1]
        self.positions[:, self.length:self.length + T] = positions
        self.length += T

    def truncate(self, length: int) -> None:
        """Forget everything after ``length`` tokens (buffers are reused, not freed)."""
        self.length = min(self.length, length)
