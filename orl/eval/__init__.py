"""Evaluation: prepare -> generate -> score (isolated) -> table. One module per step."""
