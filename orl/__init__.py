"""orl: on-policy residual learning for diffusion language models."""
