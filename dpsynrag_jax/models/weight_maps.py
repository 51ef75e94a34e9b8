"""Declarative maps from checkpoint tensor names to our Flax parameter tree.

A map is a list of Rules: our parameter path, the checkpoint's name (with {i} for per-layer
tensors, which are stacked along a leading layer axis for the scanned layers), and a per-tensor
transform. Shapes are checked against the parameter shapes the config implies.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dpsynrag_jax.models import kv_cache
from dpsynrag_jax.models.checkpoint import CheckpointError, check_shape, take
from dpsynrag_jax.models.config import DecoderConfig

Transform = Callable[[np.ndarray, DecoderConfig], np.ndarray]


def identity(w, cfg):
  del cfg
  return w


def transpose(w, cfg):
  """torch Linear [out, in] -> Flax Dense kernel [in, out]."""
  del cfg
  return w.T


def rows(start: Callable[[DecoderConfig], int], stop: Callable[[DecoderConfig], int],
         then: Transform = transpose) -> Transform:
  """A block of rows of a fused [out, in] tensor (Phi-3's qkv_proj, gate_up_proj), then `then`."""
  def take_rows(w, cfg):
    return then(w[start(cfg):stop(cfg)], cfg)
  return take_rows


def unpermute_rotary(num_heads: Callable[[DecoderConfig], int]) -> Transform:
  """Undo GGUF's Q/K row permutation (interleaved rotary) to the rotate-half layout.

  llama.cpp's converter reorders each head's rows from [first half; second half] to interleaved
  pairs; reshaping to (heads, H/2, 2) and swapping the last two axes restores the halves.
  """
  def unpermute(w, cfg):
    n = num_heads(cfg)
    w = np.asarray(w)
    tail = w.shape[1:]
    w = w.reshape(n, w.shape[0] // n // 2, 2, *tail).swapaxes(1, 2).reshape(-1, *tail)
    return w.T if w.ndim == 2 else w
  return unpermute


@dataclasses.dataclass(frozen=True)
class Rule:
  ours: str                      # "/"-separated path in the params tree
  theirs: str                    # checkpoint name; "{i}" marks a per-layer tensor
  transform: Transform = identity
  when: Callable[[DecoderConfig], bool] = lambda cfg: True


_q = lambda c: c.num_heads * c.head_dim
_kv = lambda c: c.num_kv_heads * c.head_dim
_has_qkv_bias = lambda c: c.qkv_bias
_has_o_bias = lambda c: c.o_bias
_has_mlp_bias = lambda c: c.mlp_bias
_untied = lambda c: not c.tie_word_embeddings
_sandwich = lambda c: c.sandwich_norms
_not_sandwich = lambda c: not c.sandwich_norms

_HF_COMMON = [
    Rule("embed/embedding", "model.embed_tokens.weight"),
    Rule("final_norm/scale", "model.norm.weight"),
    Rule("lm_head", "lm_head.weight", transpose, _untied),
    Rule("layers/input_norm/scale", "model.layers.{i}.input_layernorm.weight"),
    Rule("layers/attn/o_proj/kernel", "model.layers.{i}.self_attn.o_proj.weight", transpose),
    Rule("layers/attn/o_proj/bias", "model.layers.{i}.self_attn.o_proj.bias", when=_has_o_bias),
    Rule("layers/mlp/down_proj/kernel", "model.layers.{i}.mlp.down_proj.weight", transpose),
    Rule("layers/mlp/down_proj/bias", "model.layers.{i}.mlp.down_proj.bias", when=_has_mlp_bias),
]

_HF_SEPARATE_PROJECTIONS = [
    *(Rule(f"layers/attn/{p}_proj/kernel", f"model.layers.{{i}}.self_attn.{p}_proj.weight",
           transpose) for p in "qkv"),
    *(Rule(f"layers/attn/{p}_proj/bias", f"model.layers.{{i}}.self_attn.{p}_proj.bias",
           when=_has_qkv_bias) for p in "qkv"),
    *(Rule(f"layers/mlp/{p}_proj/kernel", f"model.layers.{{i}}.mlp.{p}_proj.weight", transpose)
      for p in ("gate", "up")),
    *(Rule(f"layers/mlp/{p}_proj/bias", f"model.layers.{{i}}.mlp.{p}_proj.bias",
           when=_has_mlp_bias) for p in ("gate", "up")),
]

# Llama, Mistral, Qwen2: post_attention_layernorm is the norm before the MLP. Gemma 2 renames.
_HF_NORMS = [
    Rule("layers/pre_mlp_norm/scale", "model.layers.{i}.post_attention_layernorm.weight",
         when=_not_sandwich),
    Rule("layers/post_attn_norm/scale", "model.layers.{i}.post_attention_layernorm.weight",
         when=_sandwich),
    Rule("layers/pre_mlp_norm/scale", "model.layers.{i}.pre_feedforward_layernorm.weight",
         when=_sandwich),
    Rule("layers/post_mlp_norm/scale", "model.layers.{i}.post_feedforward_layernorm.weight",
         when=_sandwich),
]

# Phi-3 / Phi-4-mini fuse q, k, v into qkv_proj and gate, up into gate_up_proj (row blocks).
_PHI3_FUSED = [
    Rule("layers/attn/q_proj/kernel", "model.layers.{i}.self_attn.qkv_proj.weight",
         rows(lambda c: 0, _q)),
    Rule("layers/attn/k_proj/kernel", "model.layers.{i}.self_attn.qkv_proj.weight",
         rows(_q, lambda c: _q(c) + _kv(c))),
    Rule("layers/attn/v_proj/kernel", "model.layers.{i}.self_attn.qkv_proj.weight",
         rows(lambda c: _q(c) + _kv(c), lambda c: _q(c) + 2 * _kv(c))),
    Rule("layers/mlp/gate_proj/kernel", "model.layers.{i}.mlp.gate_up_proj.weight",
         rows(lambda c: 0, lambda c: c.intermediate_size)),
    Rule("layers/mlp/up_proj/kernel", "model.layers.{i}.mlp.gate_up_proj.weight",
         rows(lambda c: c.intermediate_size, lambda c: 2 * c.intermediate_size)),
]

HF_MAPS = {
    "llama": _HF_COMMON + _HF_SEPARATE_PROJECTIONS + _HF_NORMS,
    "mistral": _HF_COMMON + _HF_SEPARATE_PROJECTIONS + _HF_NORMS,
    "qwen2": _HF_COMMON + _HF_SEPARATE_PROJECTIONS + _HF_NORMS,
    "gemma2": _HF_COMMON + _HF_SEPARATE_PROJECTIONS + _HF_NORMS,
    "phi3": _HF_COMMON + _PHI3_FUSED + _HF_NORMS,
}

# llama.cpp's names. Only the llama architecture permutes Q/K rows for interleaved rotary.
_GGUF_COMMON = [
    Rule("embed/embedding", "token_embd.weight"),
    Rule("final_norm/scale", "output_norm.weight"),
    Rule("lm_head", "output.weight", transpose, _untied),
    Rule("layers/input_norm/scale", "blk.{i}.attn_norm.weight"),
    Rule("layers/pre_mlp_norm/scale", "blk.{i}.ffn_norm.weight"),
    Rule("layers/attn/v_proj/kernel", "blk.{i}.attn_v.weight", transpose),
    Rule("layers/attn/o_proj/kernel", "blk.{i}.attn_output.weight", transpose),
    Rule("layers/mlp/gate_proj/kernel", "blk.{i}.ffn_gate.weight", transpose),
    Rule("layers/mlp/up_proj/kernel", "blk.{i}.ffn_up.weight", transpose),
    Rule("layers/mlp/down_proj/kernel", "blk.{i}.ffn_down.weight", transpose),
]

GGUF_MAPS = {
    "llama": _GGUF_COMMON + [
        Rule("layers/attn/q_proj/kernel", "blk.{i}.attn_q.weight",
             unpermute_rotary(lambda c: c.num_heads)),
        Rule("layers/attn/k_proj/kernel", "blk.{i}.attn_k.weight",
             unpermute_rotary(lambda c: c.num_kv_heads)),
    ],
    "qwen2": _GGUF_COMMON + [
        Rule("layers/attn/q_proj/kernel", "blk.{i}.attn_q.weight", transpose),
        Rule("layers/attn/k_proj/kernel", "blk.{i}.attn_k.weight", transpose),
        *(Rule(f"layers/attn/{p}_proj/bias", f"blk.{{i}}.attn_{p}.bias") for p in "qkv"),
    ],
}


def _flatten(tree, prefix=""):
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else key
    if isinstance(value, Mapping):
      yield from _flatten(value, path)
    else:
      yield path, value


def _set(tree: dict, path: str, value) -> None:
  *parents, leaf = path.split("/")
  for p in parents:
    tree = tree.setdefault(p, {})
  tree[leaf] = value


def apply_map(rules: list[Rule], tensors: Mapping[str, np.ndarray], cfg: DecoderConfig,
              expected: Mapping, dtype, source: str) -> dict:
  """Builds the params tree from checkpoint tensors.

  Args:
    rules: the architecture's map.
    tensors: checkpoint name -> array (may be lazy, e.g. GGUF dequantised on access).
    expected: abstract params tree (jax.eval_shape of the module's init) giving every shape.
    dtype: parameter dtype.
    source: checkpoint description for error messages.
  """
  expected_shapes = {p: tuple(v.shape) for p, v in _flatten(expected)}
  params: dict = {}
  for rule in rules:
    if not rule.when(cfg):
      continue
    if rule.ours not in expected_shapes:
      raise CheckpointError(f"Internal: map rule for unknown parameter {rule.ours!r}.")
    shape = expected_shapes[rule.ours]
    if "{i}" in rule.theirs:
      per_layer = []
      for i in range(cfg.num_layers):
        name = rule.theirs.format(i=i)
        w = _transformed(rule, take(tensors, name, source), cfg, name, source)
        check_shape(name, w, shape[1:], source)
        per_layer.append(w)
      value = np.stack(per_layer)
    else:
      value = _transformed(rule, take(tensors, rule.theirs, source), cfg, rule.theirs, source)
      check_shape(rule.theirs, value, shape, source)
    _set(params, rule.ours, jnp.asarray(value, dtype))
  missing = sorted(set(expected_shapes) - {p for p, _ in _flatten(params)})
  if missing:
    raise CheckpointError(f"{source}: no checkpoint tensor maps to {missing}.")
  return params


def _transformed(rule: Rule, w: np.ndarray, cfg: DecoderConfig, name: str, source: str):
  try:
    return np.asarray(rule.transform(w, cfg))
  except ValueError as e:  # reshape of a tensor whose shape does not fit the config
    raise CheckpointError(
        f"Tensor {name!r} in {source} has shape {tuple(np.shape(w))}, which does not fit the "
        f"config ({e}).") from None


def expected_params(module, cfg: DecoderConfig, dtype) -> Mapping:
  """Abstract parameter tree of `module` (shapes and dtypes only, nothing allocated)."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  empty = kv_cache.init_cache(cfg, 1, 0, dtype)
  variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), tokens, empty.k, empty.v,
                             empty.positions, empty.lengths)
  return variables["params"]
