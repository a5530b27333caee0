"""The models runs train, shipped in the package (no download), and their data.

`mlp`: a small MLP whose layer sizes are deliberately not multiples of 2, 3, 4 or 8, so every
sharded strategy meets padding and uneven shards.
"""
from .mlp import ModelConfig, local_slice, make_batch, make_model, param_count, unit_shapes, units

__all__ = ["ModelConfig", "local_slice", "make_batch", "make_model", "param_count", "unit_shapes", "units"]
