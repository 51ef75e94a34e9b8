"""Argument checks shared by the dataset loaders."""

from __future__ import annotations

import numpy as np


def check_count(name: str, value: int | None, pool: int) -> int:
  """`value` items of a pool of `pool` (None: all of them), as an int; clear errors otherwise."""
  if value is None:
    return pool
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name} must be an int or None, got {type(value).__name__}.")
  if not 0 <= value <= pool:
    raise ValueError(f"{name} must be in [0, {pool}] (the size of its pool), got {value}.")
  return int(value)
