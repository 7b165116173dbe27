"""Reference helpers for DiffusionGemma parity tests (NOT a test file: no ``test_*`` functions).

Builds a tiny, randomly initialised ``transformers`` DiffusionGemma (transformers 5.24, see
docs/diffusiongemma-spec.md) and runs it in the two modes our model must reproduce:

  (a) decoder / canvas mode: the prompt is encoded causally into a KV cache, then the canvas
      (``canvas_length`` tokens) is run bidirectionally over [cache | canvas] with a given
      self-conditioning input (the previous step's processed logits) -> logits (B, C, V).
  (b) encoder / causal mode: committed text run causally (this is what writes the KV cache);
      HF exposes only the final hidden state, so the logits are softcap(lm_head(h)) computed here
      exactly as the HF head does it for the decoder.

Every function takes plain tensors and returns float32 tensors; nothing here touches ``orl``.
Position conventions (what HF uses when position ids are omitted, and what ``generate`` uses):
prompt tokens get positions 0..P-1; a block encoded later continues the numbering; the canvas
gets positions P_total..P_total+C-1 where P_total is the number of tokens already in the cache.

Run ``python tests/dg_reference.py`` to print the tiny config, the state_dict keys/shapes and a
few sanity checks.
"""
from __future__ import annotations

import math
import os
import tempfile

import torch

from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DiffusionGemmaTextConfig,
)
from transformers.cache_utils import DynamicCache
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig
from transformers.models.gemma4 import Gemma4VisionConfig


def cache_kw(fn) -> str:
    """The cache argument's name: ``cache`` in transformers >= 5.24, ``past_key_values`` before."""
    import inspect  # noqa: PLC0415
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def _out_cache(out, cache):
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache

# Smallest sensible text config. Two layer types alternate; the last layer must be full attention
# (HF forces it). Sliding layers: head_dim 16, 2 KV heads, own v_proj. Full layers: global_head_dim
# 32, 1 KV head, K=V (no v_proj), proportional RoPE rotating 0.25 of the dims.
# sliding_window=8 is deliberately smaller than typical prompts so that the window is exercised.
TINY_TEXT_KWARGS = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,          # dense MLP ("shared expert") and self-conditioning MLP width
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,          # sliding layers
    head_dim=16,                    # sliding layers
    global_head_dim=32,             # full layers (consumed into per_layer_config)
    num_global_key_value_heads=1,   # full layers (consumed into per_layer_config)
    sliding_window=8,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # rope_parameters left at the DiffusionGemma default:
    #   sliding: {"rope_type": "default", "rope_theta": 10000.0}
    #   full:    {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    # final_logit_softcapping = 30.0 (class attribute), tie_word_embeddings=True,
    # pad/eos/bos = 0/1/2, hidden_activation="gelu_pytorch_tanh"
)
TINY_CANVAS_LENGTH = 16

# The vision tower is always instantiated by DiffusionGemmaForBlockDiffusion; keep it minimal.
TINY_VISION_KWARGS = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, head_dim=16, position_embedding_size=64,
)


def make_tiny_config(attn_implementation: str = "eager", **text_overrides) -> DiffusionGemmaConfig:
    text_kwargs = {**TINY_TEXT_KWARGS, **text_overrides}
    canvas_length = text_kwargs.pop("canvas_length", TINY_CANVAS_LENGTH)
    tc = DiffusionGemmaTextConfig(**text_kwargs)
    vc = Gemma4VisionConfig(**TINY_VISION_KWARGS)
    cfg = DiffusionGemmaConfig(text_config=tc, vision_config=vc, canvas_length=canvas_length)
    cfg._attn_implementation = attn_implementation
    cfg.text_config._attn_implementation = attn_implementation
    return cfg


@torch.no_grad()
def randomize_(model: DiffusionGemmaForBlockDiffusion, seed: int = 0,
               distinct_layer_scalars: bool = False) -> None:
    """Overwrite every text weight with seeded random values of a sane scale.

    Distributions (chosen so that no branch is ~0 and logits have std ~2):
      embed_tokens (tied to lm_head)         N(0, 0.3)
      self_attn.q_norm / k_norm weights      U(0.4, 0.8)      (attention has scaling 1.0: larger
                                                               weights make softmax so sharp that
                                                               fp32 noise reaches ~7e-5 on logits)
      every other RMSNorm weight (incl.      U(0.5, 1.5)      (HF multiplies by w, NOT 1+w)
        self_conditioning.pre_norm)
      router.scale                           U(0.5, 1.5)
      router.per_expert_scale                U(0.5, 1.5)
      router.proj.weight                     N(0, 2.0)        (router logits std ~2)
      other nn.Linear weights (out, in)      N(0, 1/sqrt(in))
      experts.gate_up_proj (E, 2I, H)        N(0, 1/sqrt(H))
      experts.down_proj (E, H, I)            N(0, 1/sqrt(I))
      layer_scalar buffer (1,)               U(0.5, 1.5), SAME value in encoder and decoder layer i
                                             (distinct_layer_scalars=True: independent values, to
                                             test that a loader uses the right copy per mode)
    With these scales HF fp32 vs fp64 differs by <~3e-5 on logits (std ~2.5), leaving margin for
    a 1e-4 parity tolerance. Encoder and decoder text weights are tied in HF (same Parameter), so they stay identical.
    The vision tower keeps its default init (irrelevant for text-only parity).
    """
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g) * std

    def uniform(shape, lo=0.5, hi=1.5):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    for name, p in model.named_parameters():  # remove_duplicate=True: each tied tensor once
        if ".vision_tower." in name or ".embed_vision." in name:
            continue
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            new = normal(p.shape, 0.3)
        elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
            new = uniform(p.shape, 0.4, 0.8)
        elif p.ndim == 1 and ("norm" in name or name.endswith("router.scale")
                              or name.endswith("per_expert_scale")):
            new = uniform(p.shape)
        elif name.endswith("router.proj.weight"):
            new = normal(p.shape, 2.0)
        elif name.endswith("experts.gate_up_proj"):
            new = normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
        elif name.endswith("experts.down_proj"):
            new = normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
        elif p.ndim == 2:
            new = normal(p.shape, 1.0 / math.sqrt(p.shape[1]))
        else:
            raise AssertionError(f"unhandled text parameter {name} {tuple(p.shape)}")
        p.copy_(new.to(p.dtype))

    enc_layers = model.model.encoder.language_model.layers
    dec_layers = model.model.decoder.layers
    for le, ld in zip(enc_layers, dec_layers):
        s = uniform((1,))
        le.layer_scalar.copy_(s)
        ld.layer_scalar.copy_(uniform((1,)) if distinct_layer_scalars else s)


def make_tiny_reference(seed: int = 0, attn_implementation: str = "eager",
                        distinct_layer_scalars: bool = False, **text_overrides):
    """Tiny float32 DiffusionGemmaForBlockDiffusion with random weights (eval mode).

    Returns (hf_model, hf_config). ``text_overrides`` patch TINY_TEXT_KWARGS (e.g. sliding_window=32,
    canvas_length=8). ``attn_implementation`` "eager" (default, most transparent) or "sdpa"; the
    MoE uses the "eager" experts loop.
    """
    cfg = make_tiny_config(attn_implementation=attn_implementation, **text_overrides)
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg).float().eval()
    model.set_experts_implementation("eager")
    randomize_(model, seed, distinct_layer_scalars=distinct_layer_scalars)
    return model, model.config


# ----------------------------------------------------------------------------------------------
# Running the reference
# ----------------------------------------------------------------------------------------------
def _softcap_head(hf_model, hidden: torch.Tensor) -> torch.Tensor:
    """Exactly DiffusionGemmaForBlockDiffusion's head: lm_head -> float32 -> c*tanh(x/c)."""
    c = hf_model.config.text_config.final_logit_softcapping
    logits = hf_model.lm_head(hidden).to(torch.float32)
    return torch.tanh(logits / c) * c


@torch.no_grad()
def encode(hf_model, input_ids: torch.LongTensor, cache: DynamicCache | None = None,
           position_ids: torch.LongTensor | None = None):
    """Encoder (causal) forward over ``input_ids`` (B, T); appends their K/V to ``cache``.

    position_ids default: cache.get_seq_length() + arange(T). Returns (cache, last_hidden_state)
    where last_hidden_state (B, T, H) is AFTER the final norm.
    """
    if cache is None:
        cache = DynamicCache(config=hf_model.config.get_text_config(decoder=True))
    enc = hf_model.model.encoder
    out = enc(input_ids=input_ids, **{cache_kw(enc.forward): cache}, position_ids=position_ids)
    return _out_cache(out, cache), out.last_hidden_state


@torch.no_grad()
def reference_encoder_logits(hf_model, input_ids: torch.LongTensor,
                             chunks: list[int] | None = None) -> torch.Tensor:
    """(b) Encoder / causal mode logits (B, T, V) float32.

    Inputs: ``input_ids`` (B, T), no padding, positions 0..T-1, fresh DynamicCache. Masks:
    full-attention layers causal (k <= q); sliding layers causal with window W=sliding_window:
    q - W < k <= q. ``chunks`` (e.g. [12, 16]) encodes the sequence in several calls, as
    ``generate`` does (prompt prefill, then each committed canvas); the result must be identical.
    Logits = 30*tanh(lm_head(norm(h))/30) with lm_head tied to embed_tokens (HF computes no
    encoder logits itself; this mirrors the decoder head).
    """
    if chunks is None:
        chunks = [input_ids.shape[1]]
    assert sum(chunks) == input_ids.shape[1]
    cache, hs, start = None, [], 0
    for n in chunks:
        cache, h = encode(hf_model, input_ids[:, start:start + n], cache)
        hs.append(h)
        start += n
    return _softcap_head(hf_model, torch.cat(hs, 1))


@torch.no_grad()
def reference_decoder_logits(hf_model, prompt_ids: torch.LongTensor, canvas_ids: torch.LongTensor,
                             self_conditioning_logits: torch.Tensor | None = None,
                             self_conditioning_mask: torch.BoolTensor | None = None,
                             committed_ids: torch.LongTensor | None = None) -> torch.Tensor:
    """(a) Decoder / canvas mode logits (B, C, V) float32.

    Inputs:
      prompt_ids (B, P): encoded causally at positions 0..P-1 into a fresh DynamicCache.
      committed_ids (B, K) optional: encoded in a second encoder call at positions P..P+K-1
        (what generate does after a canvas is committed).
      canvas_ids (B, C): the noisy canvas, positions L..L+C-1 with L = P (+K).
      self_conditioning_logits (B, C, V) or None: previous step's (temperature-processed) logits;
        None == first denoising step == zero self-conditioning signal.
      self_conditioning_mask (B,) bool or None: rows with False get a zero signal.
    Attention: the decoder does not write the cache; every canvas query sees every canvas key
    (bidirectional) and every key the cache layer holds: all L tokens for full layers, the last
    min(L, W-1) tokens for sliding layers (DynamicSlidingWindowLayer keeps W-1).
    """
    cache, _ = encode(hf_model, prompt_ids)
    if committed_ids is not None:
        cache, _ = encode(hf_model, committed_ids, cache)
    out = hf_model(**{cache_kw(hf_model.forward): cache}, decoder_input_ids=canvas_ids,
                   self_conditioning_logits=self_conditioning_logits,
                   self_conditioning_mask=self_conditioning_mask)
    return out.logits


def random_self_conditioning_logits(batch: int, canvas: int, vocab: int, seed: int = 1,
                                    std: float = 3.0) -> torch.Tensor:
    """Seeded N(0, std) float32 logits (B, C, V) to use as a previous-step conditioning input."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, canvas, vocab, generator=g) * std


def random_ids(batch: int, length: int, vocab: int = 256, seed: int = 2) -> torch.LongTensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g)


# ----------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------
DEFAULT_GENERATION = dict(  # DiffusionGemmaGenerationConfig._get_default_generation_params()
    max_new_tokens=256, max_denoising_steps=48, t_min=0.4, t_max=0.8,
    stability_threshold=1, confidence_threshold=0.005, entropy_bound=0.1,
)


@torch.no_grad()
def reference_generate(hf_model, prompt_ids: torch.LongTensor, seed: int = 0,
                       entropy_bound: float | None = None, trace: bool = False, **gen_kwargs):
    """Run HF ``generate`` deterministically (CPU): torch.manual_seed(seed) immediately before.

    gen_kwargs go to generate (max_new_tokens, max_denoising_steps, t_min, t_max,
    stability_threshold, confidence_threshold, decoder_input_ids=<first canvas>, eos_token_id,
    pad_token_id, ...). ``entropy_bound`` builds the EntropyBoundSamplerConfig.
    Returns the DiffusionGemmaGenerationOutput (sequences, tokens_per_forward, cache); with
    trace=True returns (output, steps) where steps is a list of dicts, one per decoder forward:
      canvas_in (B,C) long, sc_logits_in (B,C,V)|None, position_ids (1,C), cache_len int,
      logits (B,C,V) raw softcapped float32 logits.
    RNG consumption order (global torch RNG, CPU), per canvas: randint(B,C) for the initial
    canvas (skipped if decoder_input_ids given, first canvas only); then per step
    multinomial(probs.view(B*C,V), 1) followed by randint(B,C) for re-noising.
    """
    if entropy_bound is not None:
        gen_kwargs["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(entropy_bound))
    steps = []
    if trace:
        orig_forward = hf_model.forward

        def traced_forward(*args, **kwargs):
            out = orig_forward(*args, **kwargs)
            sc = kwargs.get("self_conditioning_logits")
            steps.append(dict(
                canvas_in=kwargs["decoder_input_ids"].clone(),
                sc_logits_in=None if sc is None else sc.clone(),
                position_ids=kwargs["decoder_position_ids"].clone(),
                cache_len=int(kwargs.get("cache", kwargs.get("past_key_values")).get_seq_length()),
                logits=out.logits.clone(),
            ))
            return out

        hf_model.forward = traced_forward  # generate() looks up self.forward at call time
    try:
        torch.manual_seed(seed)
        out = hf_model.generate(prompt_ids, **gen_kwargs)
    finally:
        if trace:
            del hf_model.forward
    return (out, steps) if trace else out


def checkpoint_state_dict(hf_model) -> dict[str, torch.Tensor]:
    """The tensors ``save_pretrained`` writes (tied duplicates dropped): model.decoder.* text
    weights, model.encoder.language_model.layers.*.layer_scalar, vision tower, no lm_head and
    no model.encoder.language_model.* weights (those are tied to the decoder's)."""
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as d:
        hf_model.save_pretrained(d)
        return load_file(os.path.join(d, "model.safetensors"))


@torch.no_grad()
def _main():  # pragma: no cover - manual inspection
    torch.set_printoptions(precision=4, sci_mode=False)
    model, cfg = make_tiny_reference(seed=0)
    tc = cfg.text_config
    print("text config:", {k: v for k, v in tc.to_dict().items() if k not in ("id2label", "label2id")})
    print("canvas_length:", cfg.canvas_length)
    for i in range(tc.num_hidden_layers):
        lc = tc.per_layer_config[i]
        print(f"layer {i}: {tc.layer_types[i]:17s} head_dim={lc.head_dim} kv_heads={lc.num_key_value_heads}")
    re = model.model.decoder.rotary_emb
    for t in ("sliding_attention", "full_attention"):
        print(t, "inv_freq", getattr(re, f"{t}_inv_freq"))

    print("\n# model.state_dict() (all keys, tied ones repeated)")
    for k, v in model.state_dict().items():
        print(f"{k} {tuple(v.shape)}")
    ck = checkpoint_state_dict(model)
    print(f"\n# save_pretrained keeps {len(ck)} of {len(model.state_dict())} keys")

    B, P, C, V = 2, 12, cfg.canvas_length, tc.vocab_size
    prompt = random_ids(B, P, V, seed=2)
    canvas = random_ids(B, C, V, seed=3)
    sc = random_self_conditioning_logits(B, C, V, seed=1)
    l0 = reference_decoder_logits(model, prompt, canvas)
    l1 = reference_decoder_logits(model, prompt, canvas, sc)
    print("\ndecoder logits", tuple(l1.shape), "std", float(l1.std()), "sc effect", float((l1 - l0).abs().max()))
    sdpa, _ = make_tiny_reference(seed=0, attn_implementation="sdpa")
    print("eager vs sdpa decoder max|d|", float((reference_decoder_logits(sdpa, prompt, canvas, sc) - l1).abs().max()))
    with torch.no_grad():
        full = model(input_ids=prompt, decoder_input_ids=canvas, self_conditioning_logits=sc).logits
    print("one-call forward vs encode+decode max|d|", float((full - l1).abs().max()))
    e = reference_encoder_logits(model, torch.cat([prompt, canvas], 1))
    e2 = reference_encoder_logits(model, torch.cat([prompt, canvas], 1), chunks=[P, C])
    print("encoder logits", tuple(e.shape), "std", float(e.std()), "chunked vs one-shot", float((e - e2).abs().max()))

    out, steps = reference_generate(model, prompt[:1], seed=0, trace=True, max_new_tokens=2 * C,
                                    max_denoising_steps=8, eos_token_id=None)
    print("generate sequences", out.sequences.tolist(), "tokens/forward", out.tokens_per_forward.tolist(),
          "decoder forwards", len(steps), "cache_len per step", [s["cache_len"] for s in steps])


if __name__ == "__main__":
    _main()
