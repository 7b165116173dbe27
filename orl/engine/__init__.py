"""The engine: ids in, ids out, as fast as the GPU allows.

One bake and one graph-safe forward for every family (`forward`; family differences are options of
the config, as in `orl.model`), the device-side decision rules of each family's decoder (`rules`),
the runtime that runs blocks as CUDA graphs with the denoising loop on the device (`runtime`,
`graphs`), mixture-of-experts layers (`moe`), tensor parallelism (`tp`) and the bf16 parity helper
(`parity`). Knows no text, no tokenizer and no HTTP (those are `orl.serve`); its Triton kernels live
in `orl.kernels`. See docs/engine.md.
"""
