"""Compute-balanced packing of replay rows, and their split across ranks (docs/method.md 3.6).

A replay unit (one response's [prompt | clean response | states]) costs its MLP work, linear in its
tokens, plus its attention work, linear in the query-key pairs its staircase mask lets through:

    cost = 2 T P_tok + 4 A H hd        per layer (matmul FLOPs), T tokens, A visible pairs,
                                       P_tok the dense weights a token meets, H heads, hd head dim

`estimate_cost` is that number. `pack_by_cost` fills rows up to a token budget, costliest units
first (first-fit decreasing), so rows come out of similar cost; `karmarkar_karp` splits items into
k sets of near-equal total cost (the largest differencing method, as VERL balances sequence
lengths across data-parallel ranks), and `imbalance` measures the result (max / mean - 1).
Pure functions of Python numbers and lists: no tensors, no state.
Does not own: the layout of a row (`orl.train.pack`), the ranks (`orl.train.loop`).
"""
from __future__ import annotations

import heapq


def estimate_cost(n_tokens: int, n_pairs: int, cfg) -> float:
    """Matmul FLOPs per layer of replaying a unit of ``n_tokens`` tokens whose mask lets ``n_pairs``
    query-key pairs through, for a model config ``cfg`` (dense layer shapes; the experts of a MoE
    layer count at ``num_experts_per_tok`` of them)."""
    D, H, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    attn_w = D * (H + 2 * cfg.num_kv_heads) * hd + H * hd * D
    if getattr(cfg, "num_experts", 0):
        mlp_w = 3 * D * cfg.moe_intermediate_size * cfg.num_experts_per_tok
    else:
        mlp_w = 3 * D * cfg.intermediate_size
    return 2.0 * n_tokens * (attn_w + mlp_w) + 4.0 * n_pairs * H * hd


def pack_by_cost(costs: list[float], lengths: list[int], max_row_tokens: int) -> list[list[int]]:
    """Units into rows of at most ``max_row_tokens`` tokens (a unit longer than that gets its own
    row), costliest first, each into the first row it fits: first-fit decreasing. Returns the unit
    indices of each row, rows in order of creation."""
    if len(costs) != len(lengths):
        raise ValueError(f"{len(costs)} costs for {len(lengths)} lengths")
    rows: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        for r, n in enumerate(used):
            if n + lengths[i] <= max_row_tokens:
                rows[r].append(i)
                used[r] += lengths[i]
                break
        else:
            rows.append([i])
            used.append(lengths[i])
    return rows


def karmarkar_karp(costs: list[float], k: int) -> list[list[int]]:
    """Indices of ``costs`` split into ``k`` sets of near-equal sum (largest differencing): every
    item starts as a k-way partition holding it alone; the two partitions with the largest spread
    are merged, largest set with smallest, until one partition is left. Sets may be empty when
    there are fewer items than k."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    heap = []
    for i, c in enumerate(costs):
        sets = [(float(c), [i])] + [(0.0, []) for _ in range(k - 1)]
        heapq.heappush(heap, (-float(c), i, sets))
    if not heap:
        return [[] for _ in range(k)]
    tie = len(costs)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = sorted(((sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))), key=lambda s: -s[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    return [sorted(ix) for _, ix in heap[0][2]]


def imbalance(costs: list[float], groups: list[list[int]]) -> float:
    """max group cost / mean group cost - 1 (0: perfectly balanced)."""
    sums = [sum(costs[i] for i in g) for g in groups]
    mean = sum(sums) / len(sums)
    return max(sums) / mean - 1 if mean else 0.0
