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


def test_rft_rolls_out_through_the_runtime_as_orl_does(tmp_path, monkeypatch):
    """rollout_engine="runtime" (what "auto" picks on CUDA, as for ORL): every group goes through one captured
    Runtime of G rows, reloaded with the trained weights each step; "reference": the reference decoder."""
    import orl.train.rft as rft
    from orl.engine.runtime import Runtime
    start = _start(tmp_path)
    seen, loads, real, real_load = [], [], rft.rollout_group, Runtime.load_weights

    def spy(*a, **k):
        seen.append(k.get("runtime"))
        return real(*a, **k)

    def spy_load(self, model):
        loads.append(id(self))
        return real_load(self, model)
    monkeypatch.setattr(rft, "rollout_group", spy)
    monkeypatch.setattr(Runtime, "load_weights", spy_load)
    for eng in ("runtime", "reference"):
        seen.clear()
        cfg = _cfg(start, str(tmp_path / eng), steps=2)
        cfg.rollout_engine = eng
        train_rft(cfg, resume=False, quiet=True, task=CoinTask())
        if eng == "runtime":
            assert len(seen) == 4 and all(isinstance(r, Runtime) and r.B == 3 for r in seen)
            assert len({id(r) for r in seen}) == 1 and len(loads) == 2     # one runtime, reloaded every step
        else:
            assert seen == [None] * 4
        rows = [json.loads(x) for x in open(tmp_path / eng / "metrics.jsonl")]
        assert len(rows) == 2 and all(0.0 <= r["reward"] <= 1.0 for r in rows)


def test_prompt_seed_gives_each_seed_its_own_prompts(tmp_path):
    """ORLConfig/RFTConfig.prompt_seed moves a run to another part of the train stream; 0 keeps the old one."""
    from orl.train.loop import PROMPT_STRIDE, ORLConfig, _rollouts

    class Recorder(CoinTask):
        seen: list = []

        def sample(self, split, index):
            Recorder.seen.append(index)
            return super().sample(split, index)

    tok = build_char_tokenizer()
    model = build_model(get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                   block_size=16), seed=5).eval()
    dec = DecodeConfig(rule="threshold", block_size=16, max_new_tokens=16, threshold=0.9, temperature=1.0)
    got = {}
    for ps in (0, 2):
        Recorder.seen = []
        cfg = ORLConfig(prompt_seed=ps, group_size=2, decode=dec, loss=ORLConfig().loss)
        _rollouts(cfg, model, tok, Recorder(), None, True, [3, 4], None, None)
        got[ps] = list(Recorder.seen)
    assert got[0] == [3, 4] and got[2] == [3 + 2 * PROMPT_STRIDE, 4 + 2 * PROMPT_STRIDE]
    assert RFTConfig().prompt_seed == 0 and "prompt_seed" in RFTConfig.__dataclass_fields__
