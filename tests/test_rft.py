"""RFT (orl.train.rft): it trains on verified rollouts only, and a resumed run equals an uninterrupted one."""
import json
import os
import sys

import torch

from orl.decode import DecodeConfig
from orl.model import build_model, get_config, save_pretrained
from orl.model.convert import ensure_pathway
from orl.tokenizer import build_char_tokenizer
from orl.train.rft import RFTConfig, train_rft, verified_pairs
from orl.train.rollout import Rollout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
from coin_task import CoinTask  # noqa: E402


class NothingTask(CoinTask):
    def verify(self, problem, completion):
        return 0.0


def _weights(d):
    from orl.model.checkpoint import read_state_dict
    return read_state_dict(str(d))


def _same(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _start(tmp_path):
    tok = build_char_tokenizer()
    m = build_model(get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                               block_size=16), seed=5)
    ensure_pathway(m)
    save_pretrained(m, str(tmp_path / "start"), tokenizer=tok)
    return str(tmp_path / "start")


def _cfg(init, out, steps=4):
    return RFTConfig(init=init, steps=steps, prompts_per_step=2, group_size=3, lr=1e-3, warmup=1, out=out,
                     save_every=2, decode=DecodeConfig(rule="threshold", block_size=16, max_new_tokens=32,
                                                       threshold=0.9, temperature=1.0))


def test_rft_trains_and_resumes_exactly(tmp_path):
    start = _start(tmp_path)
    full = train_rft(_cfg(start, str(tmp_path / "full")), resume=False, quiet=True, task=CoinTask())
    cut = _cfg(start, str(tmp_path / "cut"))
    train_rft(cut, resume=False, quiet=True, stop_after=3, task=CoinTask())   # last checkpoint at step 2
    train_rft(cut, resume=True, quiet=True, task=CoinTask())
    a = _weights(full)
    assert _same(a, _weights(tmp_path / "cut" / "final"))
    assert not _same(a, _weights(start))                                      # it did train
    rows = [json.loads(x) for x in open(tmp_path / "full" / "metrics.jsonl")]
    assert len(rows) == 4 and any(r["updated"] for r in rows)
    assert all(r["updated"] == (r["verified"] > 0) == ("loss" in r) for r in rows)


def test_rft_without_verified_rollouts_makes_no_update(tmp_path):
    start = _start(tmp_path)
    final = train_rft(_cfg(start, str(tmp_path / "none"), steps=2), resume=False, quiet=True, task=NothingTask())
    assert _same(_weights(final), _weights(start))
    rows = [json.loads(x) for x in open(tmp_path / "none" / "metrics.jsonl")]
    assert [r["verified"] for r in rows] == [0, 0] and not any(r["updated"] for r in rows)


def test_verified_pairs_keep_only_rewarded_responses_padded_to_blocks():
    def roll(reward, resp, n):
        return Rollout("p", [1, 2], resp, n, "", reward, [1])
    eos = 9
    pairs = verified_pairs([roll(1.0, [5, 6, eos, eos], 3), roll(0.0, [7, eos, eos, eos], 2),
                            roll(1.0, [5, 6, 7, 8], 4)], eos, K=4)
    assert pairs == [([1, 2], [5, 6, eos, eos]), ([1, 2], [5, 6, 7, 8, eos, eos, eos, eos])]
