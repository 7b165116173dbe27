"""State selection and packed replay (docs/method.md 3.2 step 2-3, 3.5, 3.6).

Owns: choosing adjacent state pairs per verified rollout (a budget per response, so long responses
do not dominate), and laying them out as rows [prompt | clean response | state | state | ...] with
the staircase visibility of 3.5: a state of block b sees the prompt, the clean blocks < b and
itself only; clean tokens see the prompt and clean blocks <= b; states never see each other.
Several responses share a row as separate segments ("packed"); "per_response" gives each response
its own row and "per_state" gives each state its own minimal row [prompt | clean < b | state] --
the slow twin that packed replay must match (same per-response losses and gradients; tested).
The replayed input of a state is exactly what the rollout consumed: canvas ids and captured z.
Does not own: the rollout (`rollout`), the losses (`losses`), the model.
Shapes: B rows, T tokens per row, S states, K block length, D hidden, N pairs.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..model.masks import Layout, canvas_block, clean_blocks
from .rollout import Rollout


@dataclass
class Selection:
    rollout: Rollout
    states: list[int]              # indices into rollout.states, ordered
    pairs: list[tuple[int, int]]   # (source, next) positions in ``states``


@dataclass
class PackedBatch:
    tokens: torch.Tensor           # (B, T)
    positions: torch.Tensor        # (B, T)
    mask: torch.Tensor             # (B, T, T) bool
    residual: torch.Tensor | None  # (B, T, D)
    residual_where: torch.Tensor | None  # (B, T) bool
    residual_weight: torch.Tensor | None  # (B, T)
    state_row: torch.Tensor        # (S,) row of each state
    state_start: torch.Tensor      # (S,) column of each state's first token
    targets: torch.Tensor          # (S, K) verified final tokens of the state's block
    unresolved: torch.Tensor       # (S, K) bool
    resp: torch.Tensor             # (S,) response index
    pairs: torch.Tensor            # (N, 2) state ids
    n_responses: int
    ref_ids: torch.Tensor | None = None     # (S, K, k)
    ref_logp: torch.Tensor | None = None    # (S, K, k)
    ref_entropy: torch.Tensor | None = None  # (S, K)
    committed: torch.Tensor | None = None    # (S, K) bool what the rollout committed at each state
    meta: torch.Tensor | None = None         # (B, 3, T) per-token block, state, segment (the mask's inputs)

    def block_mask(self, block_size: int = 128):
        """The rows' visibility as a FlexAttention BlockMask (`orl.model.masks.staircase_block_mask`):
        the fast twin of ``mask`` (dense (B, T, T))."""
        from ..model.masks import staircase_block_mask  # noqa: PLC0415
        return staircase_block_mask(self.meta[:, 0], self.meta[:, 1], self.meta[:, 2], block_size)

    def staircase_mask(self, tile: int = 32):
        """The rows' visibility as an `orl.kernels.staircase.StaircaseMask` (tile tables for the
        Triton kernels): the other fast twin of ``mask``. ``tile``: the tables' base tile (32; 16
        for tiny tests)."""
        from ..kernels.staircase import StaircaseMask  # noqa: PLC0415
        return StaircaseMask(self.meta[:, 0], self.meta[:, 1], self.meta[:, 2], tile)

    def to(self, device) -> "PackedBatch":
        """The same batch with every tensor on ``device``."""
        import dataclasses  # noqa: PLC0415
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})

    def gather(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, T, V) logits -> (S, K, V) logits at the states' tokens."""
        K = self.targets.shape[1]
        cols = self.state_start[:, None] + torch.arange(K, device=logits.device)
        return logits[self.state_row[:, None], cols]


def select_states(rollout: Rollout, budget: int, rng: random.Random) -> Selection:
    """Adjacent pairs (k, k+1) of the same block, drawn at random until ``budget`` states; a block
    that finished in one step contributes its single state. Only states with unresolved positions."""
    by_block: dict[int, list[int]] = {}
    for i, s in enumerate(rollout.states):
        if bool(s.unresolved.any()):
            by_block.setdefault(s.block, []).append(i)
    cand_pairs = [(a, b) for idx in by_block.values() for a, b in zip(idx, idx[1:])]
    singles = [idx[0] for idx in by_block.values() if len(idx) == 1]
    rng.shuffle(cand_pairs)
    chosen, pairs = [], []
    for a, b in cand_pairs:
        new = [x for x in (a, b) if x not in chosen]
        if len(chosen) + len(new) > budget:
            continue
        chosen += new
        pairs.append((a, b))
    for s in singles:
        if len(chosen) < budget:
            chosen.append(s)
    order = sorted(chosen)
    pos = {s: i for i, s in enumerate(order)}
    return Selection(rollout, order, [(pos[a], pos[b]) for a, b in pairs])


def _row_pieces(sel: Selection, K: int, clean_attention: str, minimal_for: int | None = None):
    """Tokens, layout, residual pieces of one response (or of one of its states when minimal_for)."""
    r = sel.rollout
    P = len(r.prompt)
    states = sel.states if minimal_for is None else [sel.states[minimal_for]]
    n_clean = len(r.response) if minimal_for is None else r.states[states[0]].block * K
    toks = list(r.prompt) + list(r.response[:n_clean])
    lay = Layout(clean_blocks(P, n_clean, K, clean_attention), torch.full((P + n_clean,), -1),
                 torch.zeros(P + n_clean, dtype=torch.long), torch.arange(P + n_clean))
    starts = []
    for j, si in enumerate(states):
        s = r.states[si]
        starts.append(len(toks))
        toks += s.canvas.tolist()
        cb = canvas_block(P, s.block, K, clean_attention)
        lay = lay.cat(Layout(torch.full((K,), cb), torch.full((K,), j), torch.zeros(K, dtype=torch.long),
                             P + s.block * K + torch.arange(K)))
    return toks, lay, states, starts


def pack(selections: list[Selection], K: int, clean_attention: str = "block", mode: str = "packed",
         max_row_tokens: int = 2048, pad_id: int = 0, cost_cfg=None) -> PackedBatch:
    """Lay selected states out as rows; ``mode`` in {"packed", "per_response", "per_state"}.
    ``cost_cfg`` (a model config; "packed" only): fill rows by estimated cost, costliest units
    first (`orl.train.balance.pack_by_cost`), instead of in order."""
    if mode not in ("packed", "per_response", "per_state"):
        raise ValueError(f"unknown pack mode {mode!r}")
    units = []  # (response index, selection, minimal_for)
    for ri, sel in enumerate(selections):
        if mode == "per_state":
            units += [(ri, sel, j) for j in range(len(sel.states))]
        else:
            units.append((ri, sel, None))
    rows: list[list] = [[]]
    lengths = [0]
    if cost_cfg is not None and mode == "packed":
        from .balance import estimate_cost, pack_by_cost  # noqa: PLC0415
        pieces = [(u, *_row_pieces(u[1], K, clean_attention, u[2])) for u in units]
        costs = [estimate_cost(len(p[1]), int(p[2].mask().sum()), cost_cfg) for p in pieces]
        order = pack_by_cost(costs, [len(p[1]) for p in pieces], max_row_tokens)
        rows = [[pieces[i] for i in r] for r in order]
        lengths = [sum(len(pieces[i][1]) for i in r) for r in order]
        units = []
    for u in units:
        toks, lay, st, starts = _row_pieces(u[1], K, clean_attention, u[2])
        if mode == "packed" and lengths[-1] and lengths[-1] + len(toks) > max_row_tokens:
            rows.append([])
            lengths.append(0)
        elif mode != "packed" and rows[-1]:
            rows.append([])
            lengths.append(0)
        rows[-1].append((u, toks, lay, st, starts))
        lengths[-1] += len(toks)
    T = max(lengths)
    B = len(rows)
    D = next((s.residual.shape[-1] for sel in selections for s in (sel.rollout.states[i] for i in sel.states)
              if s.residual is not None), None)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    positions = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, T, dtype=torch.bool)
    meta = torch.zeros(B, 3, T, dtype=torch.long)
    residual = torch.zeros(B, T, D) if D else None
    where = torch.zeros(B, T, dtype=torch.bool)
    weight = torch.zeros(B, T)
    any_weight = any_where = False
    st_row, st_start, targets, unres, resp, ref_ids, ref_logp, ref_h = [], [], [], [], [], [], [], []
    commits = []
    pairs, sid = [], 0
    for b, row in enumerate(rows):
        lay_all, col = None, 0
        for seg, ((ri, sel, minimal), toks, lay, st, starts) in enumerate(row):
            lay = Layout(lay.block, torch.where(lay.state >= 0, lay.state + sid, lay.state),
                         torch.full_like(lay.block, seg), lay.positions)
            lay_all = lay if lay_all is None else lay_all.cat(lay)
            tokens[b, col:col + len(toks)] = torch.tensor(toks)
            first = sid
            for si, start in zip(st, starts):
                s = sel.rollout.states[si]
                c = col + start
                if s.residual is not None:
                    residual[b, c:c + K] = s.residual.float()
                if s.residual_where is not None:
                    where[b, c:c + K] = s.residual_where
                    any_where = True
                if s.residual_weight is not None:
                    weight[b, c:c + K] = s.residual_weight
                    any_weight = True
                st_row.append(b)
                st_start.append(c)
                targets.append(torch.tensor(sel.rollout.response[s.block * K:(s.block + 1) * K]))
                unres.append(s.unresolved)
                commits.append(s.committed if s.committed is not None else torch.zeros_like(s.unresolved))
                resp.append(ri)
                ref_h.append(s.entropy)
                if s.ref_ids is not None:
                    ref_ids.append(s.ref_ids)
                    ref_logp.append(s.ref_logp)
                sid += 1
            if minimal is None:
                pairs += [(first + a, first + c2) for a, c2 in sel.pairs]
            col += len(toks)
        pad = T - col
        if pad:
            lay_all = lay_all.cat(Layout(torch.zeros(pad, dtype=torch.long), torch.full((pad,), -1),
                                         -1 - torch.arange(pad), torch.zeros(pad, dtype=torch.long)))
        positions[b] = lay_all.positions
        mask[b] = lay_all.mask()
        meta[b] = torch.stack([lay_all.block, lay_all.state, lay_all.segment])
    if mode == "per_state":  # pairs refer to states by (response, index in selection)
        base, offs = 0, []
        for sel in selections:
            offs.append(base)
            base += len(sel.states)
        pairs = [(offs[ri] + a, offs[ri] + c2) for ri, sel in enumerate(selections) for a, c2 in sel.pairs]
    return PackedBatch(
        tokens, positions, mask, residual, where if any_where else None, weight if any_weight else None,
        torch.tensor(st_row), torch.tensor(st_start), torch.stack(targets), torch.stack(unres), torch.tensor(resp),
        torch.tensor(pairs, dtype=torch.long).view(-1, 2), len(selections),
        torch.stack(ref_ids) if len(ref_ids) == sid and sid else None,
        torch.stack(ref_logp) if len(ref_logp) == sid and sid else None, torch.stack(ref_h), torch.stack(commits),
        meta)
