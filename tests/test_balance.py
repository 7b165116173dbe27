"""Compute-balanced packing and the Karmarkar-Karp split across ranks: hand-checked cases, the
imbalance bound on random workloads, and the cost model against the mask it estimates."""
import random

import pytest

from orl.model import get_config
from orl.train.balance import estimate_cost, imbalance, karmarkar_karp, pack_by_cost


def test_karmarkar_karp_hand_cases():
    # two-way differencing on {8, 7, 6, 5, 4}: 8-7 -> 1, 6-5 -> 1, {4, 1, 1} -> 3 -> 2: sets of 16 and 14
    g = karmarkar_karp([8, 7, 6, 5, 4], 2)
    assert sorted(sum([8, 7, 6, 5, 4][i] for i in s) for s in g) == [14, 16]
    assert sorted(i for s in g for i in s) == [0, 1, 2, 3, 4]   # a partition: every item once
    assert sorted(map(tuple, karmarkar_karp([5, 5, 5, 5], 4))) == [(0,), (1,), (2,), (3,)]
    assert sorted(len(s) for s in karmarkar_karp([3, 1], 3)) == [0, 1, 1]
    with pytest.raises(ValueError, match="k must be"):
        karmarkar_karp([1.0], 0)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_karmarkar_karp_bounds_the_imbalance(k):
    """Random long-tailed workloads (64-256 units): every rank within the largest unit of the mean,
    and on average far better balanced than dealing the units round-robin."""
    rng = random.Random(k)
    ours, naive = [], []
    for trial in range(30):
        costs = [rng.paretovariate(1.5) for _ in range(rng.randint(64, 256))]
        g = karmarkar_karp(costs, k)
        sums = [sum(costs[i] for i in s) for s in g]
        assert max(sums) - sum(sums) / k <= max(costs) + 1e-9
        ours.append(imbalance(costs, g))
        naive.append(imbalance(costs, [list(range(r, len(costs), k)) for r in range(k)]))
    assert sum(ours) / len(ours) < 0.25 * sum(naive) / len(naive)


def test_pack_by_cost_respects_the_budget():
    rng = random.Random(0)
    lengths = [rng.randint(10, 400) for _ in range(100)]
    costs = [n * n for n in lengths]  # attention-heavy: cost grows faster than length
    rows = pack_by_cost(costs, lengths, 512)
    assert sorted(i for r in rows for i in r) == list(range(100))
    assert all(sum(lengths[i] for i in r) <= 512 for r in rows)
    assert len(rows) <= 1.3 * sum(lengths) / 512 + 1  # first-fit decreasing: close to the volume bound
    assert pack_by_cost([1.0], [900], 512) == [[0]]  # a unit over the budget gets its own row


def test_cost_model_counts_the_mask():
    """The attention term is the visible pairs of the unit's own mask: a staircase row costs less
    than a dense causal row of the same length, and the MLP term is linear in tokens."""
    import torch  # noqa: PLC0415

    from orl.model.masks import Layout, canvas_block, clean_blocks  # noqa: PLC0415
    cfg = get_config("sdar", "qwen3-4b")
    P, K, n_clean = 64, 32, 128
    lay = Layout(clean_blocks(P, n_clean, K, "block"), torch.full((P + n_clean,), -1),
                 torch.zeros(P + n_clean, dtype=torch.long), torch.arange(P + n_clean))
    for j, b in enumerate((1, 3)):
        lay = lay.cat(Layout(torch.full((K,), canvas_block(P, b, K, "block")), torch.full((K,), j),
                             torch.zeros(K, dtype=torch.long), P + b * K + torch.arange(K)))
    T, pairs = lay.positions.numel(), int(lay.mask().sum())
    assert pairs < T * (T + 1) // 2
    c = estimate_cost(T, pairs, cfg)
    assert c < estimate_cost(T, T * (T + 1) // 2, cfg)
    assert estimate_cost(2 * T, 0, cfg) == pytest.approx(2 * estimate_cost(T, 0, cfg))
