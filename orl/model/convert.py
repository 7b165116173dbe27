"""Checkpoint conversions: the start model of an ORL run (`orl convert`).

``orl convert scrp --in BASE --out START --gamma 8`` is our equivalent of the release's
``make_scrp_base.py --gamma 8`` (docs/method.md 2.3, reading a): it makes sure the model has a
residual pathway (a zero-output one is attached if the checkpoint has none, so the function is
unchanged) and re-parameterises it with ``gamma`` (W_down stored x gamma, output / gamma), which
leaves the logits unchanged while shrinking Adam's per-step change of the pathway by gamma.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from .checkpoint import load_pretrained, save_pretrained
from .pathway import ResidualPathway, rescale_pathway


def ensure_pathway(model, where: str | None = None):
    """Attach a zero-output residual pathway if the model has none (function unchanged)."""
    if model.residual_pathway is None:
        cfg = dataclasses.replace(model.config, pathway="mlp",
                                  pathway_where=where or model.config.pathway_where)
        p = next(model.parameters())
        model.config = cfg
        model.residual_pathway = ResidualPathway(cfg).to(device=p.device, dtype=p.dtype)
        model.residual_pathway.reset_output()
    return model


def make_orl_start(src: str, dst: str, gamma: float = 8.0) -> None:
    model = load_pretrained(src)
    ensure_pathway(model)
    rescale_pathway(model, gamma)
    tok = None
    if os.path.exists(os.path.join(src, "tokenizer_config.json")):
        from ..tokenizer import load_tokenizer  # noqa: PLC0415
        tok = load_tokenizer(src)
    save_pretrained(model, dst, tokenizer=tok)


def build_parser() -> argparse.ArgumentParser:
    from ..cli import HelpFormatter  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="orl convert", description=__doc__, formatter_class=HelpFormatter)
    sub = ap.add_subparsers(dest="op", required=True)
    what = "ORL start model: ensure a residual pathway, rescale it by gamma (the logits are unchanged)"
    s = sub.add_parser("scrp", help=what, description=what, formatter_class=HelpFormatter)
    s.add_argument("--in", dest="src", required=True, metavar="BASE", help="the base model's checkpoint directory "
                                                                          "(e.g. an `orl sft` run's OUT/final)")
    s.add_argument("--out", dest="dst", required=True, metavar="START", help="where to write the start model")
    s.add_argument("--gamma", type=float, default=8.0, help="pathway scale: W_down stored x gamma, output / gamma; "
                                                            "shrinks Adam's per-step change of the pathway by gamma")
    return ap


def cli(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    torch.set_grad_enabled(False)
    make_orl_start(a.src, a.dst, a.gamma)
    print(f"wrote {a.dst} (pathway gamma = {a.gamma})")
    return 0
