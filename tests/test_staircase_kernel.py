"""The staircase replay attention's Triton kernels (`orl.kernels.staircase`) against their slow twins:
the tile tables against the dense rule of `orl.model.masks.visible` tile by tile; the forward and
dq / dk / dv against SDPA with the dense mask; a loss and its gradients through the whole tiny
`Transformer` against the dense path; and that empty tiles are really skipped (counted from the
tables, and NaN keys behind empty tiles never reach an output).
Layouts: the two-copy SFT layout (block and causal clean attention) and ORL's packed replay built by
`orl.train.pack.pack` (several noisy states per block, two segments per row, padding, a ragged T).
Float32 (bf16 arithmetic is broken in Triton's interpreter), on CPU under ``TRITON_INTERPRET=1``
(set here before Triton loads) or on a GPU when there is one. Skipped when Triton is not importable."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from orl.kernels import staircase as S  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402
from orl.model.masks import Layout, two_copy_layout, visible  # noqa: E402
from orl.train.pack import Selection, pack  # noqa: E402
from orl.train.rollout import Rollout, State  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _rows(*rows: Layout):
    """(block, state, segment) each (B, T) of layouts padded as `orl.train.pack` pads a row: block 0,
    clean, a segment of its own per padding token."""
    T = max(len(r.block) for r in rows)
    out = []
    for r in rows:
        n = T - len(r.block)
        r = r.cat(Layout(torch.zeros(n, dtype=torch.long), torch.full((n,), -1), -1 - torch.arange(n),
                         torch.zeros(n, dtype=torch.long)))
        out.append(torch.stack([r.block, r.state, r.segment]))
    return torch.stack(out).unbind(1)


def _sft():
    """Row 0: two SFT samples packed (segments 0, 1); row 1: one causal-clean sample, padded, its clean
    tokens with state -5 (any negative state is clean). T = 138."""
    r0 = two_copy_layout(7, 40, 8).cat(two_copy_layout(3, 24, 8, segment=1))
    r1 = two_copy_layout(5, 48, 8, "causal")
    r1.state = torch.where(r1.state < 0, -5, r1.state)
    return _rows(r0, r1)


def _packed(responses, K=8, max_row_tokens=150, seed=0):
    """`pack` of synthetic rollouts, one per (prompt length, blocks, noisy states per block)."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(4, 64, (n,), generator=g)

    sels = []
    for P, nb, spb in responses:
        states = [State(block=b, step=s, canvas=ids(K), unresolved=torch.ones(K, dtype=torch.bool), residual=None,
                        residual_where=None, residual_weight=None, entropy=torch.zeros(K))
                  for b in range(nb) for s in range(spb)]
        r = Rollout("p", ids(P).tolist(), ids(nb * K).tolist(), nb * K, "", 1.0, [spb] * nb, states)
        sels.append(Selection(r, list(range(len(states))), []))
    return pack(sels, K, "block", "packed", max_row_tokens=max_row_tokens)


def _replay():
    """Rows [prompt | clean | states] x 2 segments, and 1 segment + padding: T = 146 (ragged)."""
    return _packed([(6, 3, 2), (4, 2, 3), (5, 4, 1)])


def _brute_classes(dense: torch.Tensor, tm: int, tn: int) -> torch.Tensor:
    """Tile classes by slicing the dense (B, T, T) mask tile by tile (a ragged tile is never FULL)."""
    B, T, _ = dense.shape
    NM, NN = -(-T // tm), -(-T // tn)
    out = torch.zeros(B, NM, NN, dtype=torch.int8)
    for b in range(B):
        for i in range(NM):
            for j in range(NN):
                t = dense[b, i * tm:(i + 1) * tm, j * tn:(j + 1) * tn]
                out[b, i, j] = S.FULL if t.all() and t.numel() == tm * tn else S.PARTIAL if t.any() else S.EMPTY
    return out


def _from_lists(num_p, idx_p, num_f, idx_f, C):
    """Classes (B, R, C) written back from `tile_lists`."""
    B, R = num_p.shape
    out = torch.zeros(B, R, C, dtype=torch.int8)
    for b in range(B):
        for r in range(R):
            out[b, r, idx_p[b, r, :num_p[b, r]].long()] = S.PARTIAL
            out[b, r, idx_f[b, r, :num_f[b, r]].long()] = S.FULL
            assert torch.equal(idx_p[b, r, :num_p[b, r]].sort().values, idx_p[b, r, :num_p[b, r]])  # ascending
    return out


def test_tile_tables_are_exact():
    """Every tile class equals the dense rule's, at the base tile and coarsened to each kernel tile,
    for every layout (chunked evaluation too); the sparse lists hold exactly those classes, per
    query tile and transposed per key tile; padding tokens see themselves only."""
    b = _replay()
    layouts = {"sft": _sft(), "replay": (b.meta[:, 0], b.meta[:, 1], b.meta[:, 2])}
    for name, (blk, st, seg) in layouts.items():
        dense = visible(blk, st, seg, blk, st, seg)
        if name == "replay":
            assert torch.equal(dense, b.mask)
        assert dense.diagonal(dim1=1, dim2=2).all()   # every token sees itself: no empty row
        cfg = S.StaircaseConfig(S.Tiles(32, 16), S.Tiles(16, 32), S.Tiles(32, 32))
        m = S.StaircaseMask(blk, st, seg, tile=16, config=cfg)
        assert torch.equal(m.dense(), dense)
        assert torch.equal(m.classes, _brute_classes(dense, 16, 16)), name
        assert torch.equal(S.tile_classes(blk, st, seg, 16, 16, max_elements=1), m.classes)  # one tile per chunk
        seen = set()
        for tm, tn in [(16, 16), (32, 16), (16, 32), (32, 32), (64, 32)]:
            tb = m.tables(tm, tn)
            want = _brute_classes(dense, tm, tn)
            assert torch.equal(tb.classes, want), (name, tm, tn)
            NM, NN = want.shape[1:]
            assert torch.equal(_from_lists(*tb.by_query, NN), want)
            assert torch.equal(_from_lists(*tb.by_key, NM), want.transpose(1, 2))
            seen |= set(want.unique().tolist())
        assert seen == {S.EMPTY, S.PARTIAL, S.FULL}, name   # the layouts exercise all three classes
    with pytest.raises(ValueError, match="multiples of the mask's base"):
        m.tables(24, 16)


def _qkv(B, H, Hkv, T, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, T, d, generator=g).to(DEV) for h in (H, Hkv, Hkv))
    return q, k, v, torch.randn(B, H, T, d, generator=g).to(DEV)


def _sdpa(q, k, v, dense, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense[:, None], scale=scale, enable_gqa=True)


CASES = {  # layout, tile, config, H, Hkv, d
    "sft-gqa2-t32": (_sft, 32, None, 4, 2, 16),
    "replay-gqa2-t16": (lambda: _packed([(6, 3, 2), (5, 2, 1)], max_row_tokens=80), 16, None, 2, 1, 32),
    "replay-mixed-tiles": (_replay, 16, S.StaircaseConfig(S.Tiles(32, 16), S.Tiles(16, 32), S.Tiles(32, 32)),
                           4, 1, 16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_equal_sdpa(case):
    """Output (<= 1e-5) and dq, dk, dv (<= 1e-4) equal SDPA with the dense mask, on random q, k, v
    with a scale that makes the softmax peaked; the mask matters (unmasked attention differs)."""
    make, tile, cfg, H, Hkv, d = CASES[case]
    lay = make()
    blk, st, seg = (lay.meta[:, 0], lay.meta[:, 1], lay.meta[:, 2]) if hasattr(lay, "meta") else lay
    m = S.StaircaseMask(blk, st, seg, tile=tile, config=cfg).to(DEV)
    B, T = m.shape
    scale = 0.6
    q, k, v, do = _qkv(B, H, Hkv, T, d, seed=len(case))
    dense = visible(blk, st, seg, blk, st, seg).to(DEV)
    ours = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    o = S.staircase_attention(*ours, m, scale)
    r = _sdpa(*ref, dense, scale)
    torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    assert (r - _sdpa(q, k, v, torch.ones_like(dense), scale)).abs().max() > 0.1   # not a degenerate comparison
    (o * do).sum().backward()
    (r * do).sum().backward()
    for name, a, b_ in zip("qkv", ours, ref):
        assert a.grad.abs().max() > 0.1, name
        torch.testing.assert_close(a.grad, b_.grad, rtol=1e-4, atol=1e-4, msg=lambda s, n=name: f"d{n}: {s}")


def test_transformer_loss_and_gradients_equal_the_dense_path():
    """The tiny model (4 heads over 2 KV heads, head dim 16) on a packed replay batch: logits, a
    cross-entropy and every parameter's gradient equal the dense SDPA path."""
    b = _packed([(4, 2, 2), (3, 2, 1)], max_row_tokens=60, seed=1)
    assert b.tokens.shape[0] == 2 and bool((b.meta[:, 2] < 0).any())   # two rows, one padded
    model = build_model(get_config("sdar", "tiny", pathway="none"), seed=3).to(DEV)
    targets = torch.randint(0, model.config.vocab_size, b.tokens.shape, generator=torch.Generator().manual_seed(0))
    bb = b.to(DEV)
    out = {}
    for name, mask in (("dense", bb.mask), ("staircase", bb.staircase_mask(tile=16))):
        model.zero_grad()
        logits = model(bb.tokens, bb.positions, mask)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.to(DEV).flatten())
        loss.backward()
        out[name] = (logits.detach(), loss.item(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(out["staircase"][0], out["dense"][0], rtol=1e-5, atol=1e-5)
    assert out["staircase"][1] == pytest.approx(out["dense"][1], rel=1e-6)
    for gs, gd in zip(out["staircase"][2], out["dense"][2]):
        torch.testing.assert_close(gs, gd, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:All-NaN slice")   # the NaN segment's own row maxima
def test_empty_tiles_are_skipped():
    """A staircase row visits fewer tiles than a dense pass; and with two tile-aligned segments, NaN
    queries, keys and values in the second never reach the first's outputs or gradients (a visited
    but masked tile would: 0 * NaN), which equal SDPA on the first segment alone."""
    b = _replay()
    m = b.staircase_mask(tile=16)
    for tm, tn in m.config.shapes():
        tb = m.tables(tm, tn)
        assert tb.visited() < 0.7 * tb.total()
    blk, st, seg = _rows(two_copy_layout(4, 14, 7).cat(two_copy_layout(2, 15, 5, segment=1)))   # 32 + 32 tokens
    m = S.StaircaseMask(blk, st, seg, tile=16).to(DEV)
    q, k, v, do = _qkv(1, 4, 2, 64, 16, seed=5)
    for x in (q, k, v):
        x[:, :, 32:] = float("nan")
    ours = [x.clone().requires_grad_() for x in (q, k, v)]
    o = S.staircase_attention(*ours, m, 0.6)
    (o * do).sum().backward()
    ref = [x[:, :, :32].clone().requires_grad_() for x in (q, k, v)]
    r = _sdpa(*ref, m.dense()[:, :32, :32], 0.6)
    (r * do[:, :, :32]).sum().backward()
    torch.testing.assert_close(o[:, :, :32], r, rtol=1e-5, atol=1e-5)
    assert o[:, :, 32:].isnan().all()
    for a, b_ in zip(ours, ref):
        torch.testing.assert_close(a.grad[:, :, :32], b_.grad, rtol=1e-4, atol=1e-4)


def test_clear_errors():
    blk, st, seg = _sft()
    m = S.StaircaseMask(blk, st, seg, tile=32)
    q, k, v, _ = _qkv(2, 4, 2, m.shape[1], 16, seed=0)
    with pytest.raises(ValueError, match="power of two in 16..128"):
        S.staircase_attention(q[..., :12], k[..., :12], v[..., :12], m.to(DEV))
    with pytest.raises(ValueError, match="multiple of Hkv"):
        S.staircase_attention(q[:, :3], k, v, m.to(DEV))
    with pytest.raises(ValueError, match="share one dtype"):
        S.staircase_attention(q, k.double(), v, m.to(DEV))
    with pytest.raises(ValueError, match=r"mask is for \(B, T\)"):
        S.staircase_attention(q[:, :, :100], k[:, :, :100], v[:, :, :100], m.to(DEV))
    with pytest.raises(ValueError, match="power of two >= 16"):
        S.StaircaseMask(blk, st, seg, tile=24)
