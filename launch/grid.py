"""Sweep grids: lists of config overrides, one dict per run, keys as dotted config paths.

    product({"privacy.epsilon": [3, 10], "seed": [0, 1]})   # 4 runs
    zipped({"clustering.R": [100, 500], "clustering.k": [40, 80]})   # 2 runs, paired
    product(zipped(...), {"seed": [0, 1]})                   # grids combine
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Mapping, Sequence, Union

Grid = list[dict[str, Any]]
Axes = Union[Mapping[str, Sequence[Any]], Grid]


def _as_grid(axes: Axes) -> Grid:
  if isinstance(axes, list):
    return [dict(point) for point in axes]
  if not axes:
    return [{}]
  keys = list(axes)
  return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def product(*parts: Axes) -> Grid:
  """Every combination of the parts' points (a Mapping part is itself a product of its axes)."""
  grid: Grid = [{}]
  for part in parts:
    points = _as_grid(part)
    overlap = {k for p in points for k in p} & {k for g in grid for k in g}
    if overlap:
      raise ValueError(f"Keys appear in two parts of a product: {sorted(overlap)}.")
    grid = [{**g, **p} for g in grid for p in points]
  return grid


def zipped(axes: Mapping[str, Sequence[Any]]) -> Grid:
  """The i-th values of every axis together; all axes must have the same length."""
  lengths = {k: len(v) for k, v in axes.items()}
  if len(set(lengths.values())) > 1:
    raise ValueError(f"zipped() axes differ in length: {lengths}.")
  keys = list(axes)
  return [dict(zip(keys, values)) for values in zip(*(axes[k] for k in keys))]


def point_name(point: Mapping[str, Any]) -> str:
  """A directory name for a run: 'L=3,seed=0' from {'x.clustering.L': 3, 'seed': 0}."""
  if not point:
    return "default"
  parts = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items()]
  return re.sub(r"[^A-Za-z0-9=,._+-]", "_", ",".join(parts))


def point_names(points: Sequence[Mapping[str, Any]]) -> list[str]:
  """Directory names of a sweep's points from the keys whose values vary across it (keys every
  point sets alike say nothing); point_name of the whole point when nothing varies."""
  keys = list(dict.fromkeys(k for p in points for k in p))
  varying = [k for k in keys if len({repr(p.get(k)) for p in points}) > 1]
  if not varying:
    return [point_name(p) for p in points]
  return [point_name({k: p[k] for k in varying if k in p}) for p in points]
