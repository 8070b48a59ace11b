"""Per-recipe math: selection, baselines, advantages and losses, as pure functions."""
