"""Block-diffusion masks against brute-force definitions written here, independently of the
metadata rule in orl.model.masks (loops over positions, regions spelled out)."""
import itertools

import pytest
import torch

from orl.model.masks import (Layout, commit_layout, decode_layout, step_mask, two_copy_layout,
                             visible)


def brute_two_copy(P, R, K, causal_clean):
    """[prompt | clean | noisy]: the SDAR/TraceRL rule, region by region."""
    n = P + 2 * R
    m = torch.zeros(n, n, dtype=torch.bool)

    def region(j):
        if j < P:
            return "prompt", None, j
        if j < P + R:
            return "clean", (j - P) // K, j - P
        return "noisy", (j - P - R) // K, j - P - R

    for q, k in itertools.product(range(n), range(n)):
        rq, bq, iq = region(q)
        rk, bk, ik = region(k)
        if rq == "prompt":
            ok = rk == "prompt" and k <= q                      # causal prompt
        elif rq == "clean":
            if rk == "prompt":
                ok = True
            elif rk == "clean":
                ok = (ik <= iq) if causal_clean else (bk <= bq)  # staircase / causal
            else:
                ok = False                                        # clean never sees noisy
        else:  # noisy block bq
            if rk == "prompt":
                ok = True
            elif rk == "clean":
                ok = bk < bq                                      # earlier clean blocks only
            else:
                ok = bk == bq                                     # its own noisy block
        m[q, k] = ok
    return m


@pytest.mark.parametrize("P,R,K", [(3, 8, 4), (5, 12, 4), (1, 6, 3), (4, 16, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_two_copy_layout_matches_brute_force(P, R, K, causal):
    lay = two_copy_layout(P, R, K, "causal" if causal else "block")
    assert torch.equal(lay.mask(), brute_two_copy(P, R, K, causal))
    # noisy copy reuses the clean copy's positions
    assert torch.equal(lay.positions[P + R:], lay.positions[P:P + R])


def brute_decode(P, C, K, causal_clean):
    """[prompt | committed (C) | canvas (K)] at inference."""
    n = P + C + K
    m = torch.zeros(n, n, dtype=torch.bool)
    for q, k in itertools.product(range(n), range(n)):
        if q >= P + C:                        # canvas: all committed text + whole canvas
            m[q, k] = True
        elif k >= P + C:                      # committed text never sees the canvas
            m[q, k] = False
        elif q < P or k < P:                  # prompt: causal; committed sees the whole prompt
            m[q, k] = k <= q
        else:                                 # committed vs committed: block-causal (or causal)
            m[q, k] = (k <= q) if causal_clean else ((k - P) // K <= (q - P) // K)
    return m


@pytest.mark.parametrize("P,C,K", [(3, 0, 4), (3, 8, 4), (6, 12, 4), (2, 16, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_decode_layout_matches_brute_force(P, C, K, causal):
    ca = "causal" if causal else "block"
    assert torch.equal(decode_layout(P, C, K, K, ca).mask(), brute_decode(P, C, K, causal))
    # a step over a cache of P + C tokens sees exactly the rows of the full mask
    assert torch.equal(step_mask(decode_layout(P, C, K, K, ca), P + C), brute_decode(P, C, K, causal)[P + C:])
    # the commit pass of the canvas equals the committed-text rows of the next layout
    nxt = brute_decode(P, C + K, K, causal)[:P + C + K, :P + C + K]
    assert torch.equal(step_mask(commit_layout(P, C + K, K, ca), P + C), nxt[P + C:])


def test_segments_never_see_each_other_and_states_are_private():
    a = two_copy_layout(3, 8, 4)
    b = two_copy_layout(2, 8, 4)
    b = Layout(b.block, torch.where(b.state >= 0, b.state + 10, b.state), torch.ones_like(b.segment), b.positions)
    lay = a.cat(b)
    m = lay.mask()
    na = len(a.block)
    assert not m[:na, na:].any() and not m[na:, :na].any()
    # two noisy states of the same block never see each other
    blk = torch.tensor([0, 1, 1, 1, 1])
    st = torch.tensor([-1, 0, 0, 1, 1])
    seg = torch.zeros(5, dtype=torch.long)
    v = visible(blk, st, seg, blk, st, seg)
    assert not v[1, 3] and not v[3, 1] and v[1, 2] and v[3, 4] and v[1, 0] and not v[0, 1]
