"""One frozen config for every decoder-only LM we run, read from HF config.json or GGUF metadata.

The family covered: Llama 3.x / SmolLM2 / Mistral, Qwen2 (q/k/v bias), Phi-3 / Phi-4-mini
(fused projections in the checkpoint, partial rotary, LongRoPE), Gemma 2 (embedding scaling,
(1 + w) norms, sandwich norms, soft-capping, alternating sliding window). The config is hashable
so that it can be a static argument of jitted functions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from dpsynrag_jax.models.checkpoint import CheckpointError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "phi3", "gemma2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary embedding: base frequency and the checkpoint's scaling rule."""
  theta: float = 10000.0
  rope_type: str = "default"
  factor: float = 1.0
  # llama3
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 0
  # longrope (Phi-3 / Phi-4-mini): per-frequency divisors and a cos/sin multiplier.
  short_factor: tuple[float, ...] = ()
  long_factor: tuple[float, ...] = ()
  attention_factor: float = 1.0


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Shapes and switches of a decoder-only transformer.

  layer_windows[i] is layer i's sliding attention window (a query at position p sees keys at
  positions > p - window), or 0 for full causal attention.
  """
  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope: RopeConfig = RopeConfig()
  rotary_dim: int = 0                  # leading head dims that rotate; 0 means all (head_dim)
  max_position_embeddings: int = 8192
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  activation: str = "silu"             # silu | gelu_tanh | gelu
  tie_word_embeddings: bool = False
  # Gemma 2.
  embed_scale: bool = False            # multiply embeddings by sqrt(hidden_size)
  norm_plus_one: bool = False          # RMSNorm weight used as (1 + w)
  sandwich_norms: bool = False         # extra norms after attention and after the MLP
  attn_logit_softcap: float = 0.0      # 0 disables
  final_logit_softcap: float = 0.0
  query_pre_attn_scalar: float = 0.0   # attention scale is this ** -0.5; 0 means head_dim
  layer_windows: tuple[int, ...] = ()

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise CheckpointError(
          f"Unsupported model_type {self.model_type!r}; supported: {SUPPORTED_MODEL_TYPES}.")
    if self.num_heads % self.num_kv_heads:
      raise CheckpointError(
          f"num_attention_heads={self.num_heads} is not a multiple of "
          f"num_key_value_heads={self.num_kv_heads}.")
    if self.rope.rope_type not in SUPPORTED_ROPE_TYPES:
      raise CheckpointError(
          f"Unsupported rope type {self.rope.rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}.")
    if self.activation not in ("silu", "gelu_tanh", "gelu"):
      raise CheckpointError(f"Unsupported activation {self.activation!r}.")
    if not self.layer_windows:
      object.__setattr__(self, "layer_windows", (0,) * self.num_layers)
    if len(self.layer_windows) != self.num_layers:
      raise CheckpointError("layer_windows must give one window per layer.")
    if not self.rotary_dim:
      object.__setattr__(self, "rotary_dim", self.head_dim)

  @property
  def attention_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def num_params(self) -> int:
    """Parameter count (embeddings counted once when tied)."""
    d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
    attn = d * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
    mlp = 3 * d * f
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_layers * (attn + mlp) + head


_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu": "gelu"}


def _rope_from_hf(cfg: Mapping[str, Any]) -> tuple[RopeConfig, float]:
  """RopeConfig and partial rotary factor from either transformers' config layout.

  transformers >= 5 writes `rope_parameters` (theta included); older checkpoints write
  `rope_theta` and an optional `rope_scaling`.
  """
  params = dict(cfg.get("rope_scaling") or {})
  params.update(cfg.get("rope_parameters") or {})
  theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type == "su":  # the first Phi-3 releases' name for LongRoPE
    rope_type = "longrope"
  partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
  original = int(params.get("original_max_position_embeddings",
                            cfg.get("original_max_position_embeddings", 0)) or 0)
  max_pos = int(cfg.get("max_position_embeddings", 8192))
  factor = params.get("factor")
  attention_factor = params.get("attention_factor")
  if rope_type == "longrope":
    if factor is None:
      factor = max_pos / original
    if attention_factor is None:
      attention_factor = (1.0 if factor <= 1.0 else
                          math.sqrt(1 + math.log(factor) / math.log(original)))
  rope = RopeConfig(
      theta=theta, rope_type=rope_type, factor=float(factor or 1.0),
      low_freq_factor=float(params.get("low_freq_factor", 1.0)),
      high_freq_factor=float(params.get("high_freq_factor", 4.0)),
      original_max_position_embeddings=original,
      short_factor=tuple(float(x) for x in params.get("short_factor", ()) or ()),
      long_factor=tuple(float(x) for x in params.get("long_factor", ()) or ()),
      attention_factor=float(attention_factor or 1.0))
  return rope, partial


def _layer_windows(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[int, ...]:
  window = int(cfg.get("sliding_window") or 0)
  layer_types = cfg.get("layer_types")
  if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
    return (0,) * num_layers
  if layer_types:
    return tuple(window if t == "sliding_attention" else 0 for t in layer_types)
  if model_type == "gemma2":  # before layer_types existed: even layers slide
    return tuple(window if i % 2 == 0 else 0 for i in range(num_layers))
  return (window,) * num_layers


def from_hf_config(cfg: Mapping[str, Any]) -> DecoderConfig:
  """DecoderConfig from a transformers config.json dict."""
  model_type = cfg.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise CheckpointError(
        f"Unsupported model_type {model_type!r} in config.json; supported: "
        f"{SUPPORTED_MODEL_TYPES}.")
  try:
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    layers = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rope, partial = _rope_from_hf(cfg)
    gemma = model_type == "gemma2"
    activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    return DecoderConfig(
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=rope,
        rotary_dim=int(head_dim * partial),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
        qkv_bias=bool(cfg.get("attention_bias", False)) or model_type == "qwen2",
        o_bias=bool(cfg.get("attention_bias", False)) and model_type != "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        activation=_ACTIVATIONS.get(activation, activation),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
        embed_scale=gemma,
        norm_plus_one=gemma,
        sandwich_norms=gemma,
        attn_logit_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or 0.0),
        layer_windows=_layer_windows(cfg, model_type, layers),
    )
  except KeyError as e:
    raise CheckpointError(f"config.json lacks the field {e.args[0]!r}.") from None
