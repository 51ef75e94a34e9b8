"""Sentence encoder: load a BERT or MPNet sentence-transformers checkpoint and embed texts.

    enc = load_encoder("all-minilm-l6-v2")       # preset, local folder, or hub id
    vectors = enc.embed(["a text", "another"])   # [N, D] float32, unit L2 norm

Pooling is what the folder's sentence-transformers config says (cls / mean / max / lasttoken;
mean when absent). Embeddings are ALWAYS L2-normalised, even for models trained for dot product
(multi-qa-mpnet-base-dot-v1 has no Normalize module): DP-SynRAG compares them by cosine and sums
unit vectors. Weights are mapped from Hugging Face names by the declarative tables below.

Axis letters: N texts, B batch, S sequence, D width.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dpsynrag_jax.models import checkpoint
from dpsynrag_jax.models import presets
from dpsynrag_jax.models.checkpoint import CheckpointError
from dpsynrag_jax.models.encoder_layers import ACTIVATIONS
from dpsynrag_jax.models.encoder_layers import EncoderConfig
from dpsynrag_jax.models.encoder_layers import l2_normalize
from dpsynrag_jax.models.encoder_layers import pool
from dpsynrag_jax.models.encoder_layers import TransformerEncoder

# Shapes are padded so that repeated calls reuse compiled code: rows to a multiple of this,
# sequence length to a power of two no smaller than _MIN_LENGTH (capped at max_seq_length).
_ROW_MULTIPLE = 8
_MIN_LENGTH = 16
# A progress bar only pays for itself on long jobs.
_PROGRESS_MIN_BATCHES = 10


# ---------------------------------------------------------------------------------------------
# Name maps: our parameter path <- HF tensor name, with a per-tensor transform.


@dataclasses.dataclass(frozen=True)
class Transform:
  """How a HF tensor becomes our parameter, and which HF shape a parameter shape implies."""
  apply: Callable[[np.ndarray], np.ndarray]
  hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]


KEEP = Transform(apply=lambda a: a, hf_shape=lambda s: s)
# torch Linear stores [out, in]; Flax Dense kernels are [in, out].
TRANSPOSE = Transform(apply=lambda a: a.T, hf_shape=lambda s: tuple(reversed(s)))

# (our path, HF name, transform); "{i}" in a name is the layer index.
NameMap = tuple[tuple[str, str, Transform], ...]


def _dense(ours: str, hf: str) -> NameMap:
  return ((f"{ours}/kernel", f"{hf}.weight", TRANSPOSE), (f"{ours}/bias", f"{hf}.bias", KEEP))


def _norm(ours: str, hf: str) -> NameMap:
  return ((f"{ours}/scale", f"{hf}.weight", KEEP), (f"{ours}/bias", f"{hf}.bias", KEEP))


def _table(ours: str, hf: str) -> NameMap:
  return ((f"{ours}/embedding", f"{hf}.weight", KEEP),)


BERT_NAMES: NameMap = (
    *_table("embeddings/word", "embeddings.word_embeddings"),
    *_table("embeddings/position", "embeddings.position_embeddings"),
    *_table("embeddings/token_type", "embeddings.token_type_embeddings"),
    *_norm("embeddings/norm", "embeddings.LayerNorm"),
    *_dense("layer_{i}/attention/query", "encoder.layer.{i}.attention.self.query"),
    *_dense("layer_{i}/attention/key", "encoder.layer.{i}.attention.self.key"),
    *_dense("layer_{i}/attention/value", "encoder.layer.{i}.attention.self.value"),
    *_dense("layer_{i}/attention/out", "encoder.layer.{i}.attention.output.dense"),
    *_norm("layer_{i}/attention_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    *_dense("layer_{i}/mlp_in", "encoder.layer.{i}.intermediate.dense"),
    *_dense("layer_{i}/mlp_out", "encoder.layer.{i}.output.dense"),
    *_norm("layer_{i}/mlp_norm", "encoder.layer.{i}.output.LayerNorm"),
)

MPNET_NAMES: NameMap = (
    *_table("embeddings/word", "embeddings.word_embeddings"),
    *_table("embeddings/position", "embeddings.position_embeddings"),
    *_norm("embeddings/norm", "embeddings.LayerNorm"),
    *_table("relative_bias", "encoder.relative_attention_bias"),
    *_dense("layer_{i}/attention/query", "encoder.layer.{i}.attention.attn.q"),
    *_dense("layer_{i}/attention/key", "encoder.layer.{i}.attention.attn.k"),
    *_dense("layer_{i}/attention/value", "encoder.layer.{i}.attention.attn.v"),
    *_dense("layer_{i}/attention/out", "encoder.layer.{i}.attention.attn.o"),
    *_norm("layer_{i}/attention_norm", "encoder.layer.{i}.attention.LayerNorm"),
    *_dense("layer_{i}/mlp_in", "encoder.layer.{i}.intermediate.dense"),
    *_dense("layer_{i}/mlp_out", "encoder.layer.{i}.output.dense"),
    *_norm("layer_{i}/mlp_norm", "encoder.layer.{i}.output.LayerNorm"),
)

NAME_MAPS = {"bert": BERT_NAMES, "mpnet": MPNET_NAMES}


# ---------------------------------------------------------------------------------------------
# Reading config.json and the sentence-transformers files.


def encoder_config(hf: dict, source: str) -> EncoderConfig:
  """HF config.json (as a dict) -> EncoderConfig; CheckpointError for what we cannot run."""
  model_type = hf.get("model_type")
  if model_type not in NAME_MAPS:
    raise CheckpointError(
        f"{source}: sentence encoders of model_type {model_type!r} are not supported; "
        f"supported: {sorted(NAME_MAPS)}.")
  act = hf.get("hidden_act", "gelu")
  if act not in ACTIVATIONS:
    raise CheckpointError(f"{source}: hidden_act {act!r} is not supported ({sorted(ACTIVATIONS)}).")
  try:
    common = dict(
        model_type=model_type, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf["max_position_embeddings"],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), hidden_act=act)
  except KeyError as e:
    raise CheckpointError(f"{source}: config.json lacks {e.args[0]!r}.") from None
  if common["hidden_size"] % common["num_heads"]:
    raise CheckpointError(f"{source}: hidden_size {common['hidden_size']} is not a multiple of "
                          f"num_attention_heads {common['num_heads']}.")
  if model_type == "bert":
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
      raise CheckpointError(f"{source}: BERT position_embedding_type {kind!r} is not supported "
                            "(only 'absolute').")
    return EncoderConfig(**common, pad_token_id=hf.get("pad_token_id", 0),
                         type_vocab_size=hf.get("type_vocab_size", 2))
  # transformers' MPNetEmbeddings fixes padding_idx = 1 whatever the config says; positions of
  # real tokens start right after it.
  padding_idx = 1
  return EncoderConfig(**common, pad_token_id=hf.get("pad_token_id", padding_idx),
                       position_offset=padding_idx + 1,
                       relative_buckets=hf.get("relative_attention_num_buckets", 32))


@dataclasses.dataclass(frozen=True)
class SentenceTransformersLayout:
  """Where the parts of a sentence-transformers folder are."""
  model_dir: str             # the transformer: config.json, weights, tokenizer
  pooling: str               # one of encoder_layers.POOLING_MODES
  max_seq_length: int | None
  do_lower_case: bool


# sentence-transformers pooling flags -> our mode. mean_sqrt_len divides the same sum by
# sqrt(n) instead of n: after L2 normalisation it is the same vector as mean.
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Modules whose effect we reproduce (Normalize: we always normalise).
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


def pooling_mode(pooling_config: dict, source: str) -> str:
  """A 1_Pooling/config.json dict -> one pooling mode; CheckpointError if we cannot match it."""
  if pooling_config.get("pooling_mode_weightedmean_tokens"):
    raise CheckpointError(f"{source}: weighted-mean pooling is not supported.")
  modes = {mode for flag, mode in _POOLING_FLAGS.items() if pooling_config.get(flag)}
  if isinstance(pooling_config.get("pooling_mode"), str):  # newer configs may name it directly
    modes.add({"mean_sqrt_len_tokens": "mean"}.get(pooling_config["pooling_mode"],
                                                   pooling_config["pooling_mode"]))
  if len(modes) != 1 or not modes <= set(_POOLING_FLAGS.values()):
    raise CheckpointError(f"{source}: need exactly one supported pooling mode (cls, mean, max, "
                          f"lasttoken); the config asks for {sorted(modes) or 'none'}.")
  return modes.pop()


def read_layout(folder: str) -> SentenceTransformersLayout:
  """Reads modules.json, the pooling config and sentence_bert_config.json (all optional)."""
  model_dir, pooling_dir = folder, None
  modules_path = os.path.join(folder, "modules.json")
  if os.path.exists(modules_path):
    for module in checkpoint.read_json(modules_path):
      kind = module.get("type", "").rsplit(".", 1)[-1]
      if kind not in _KNOWN_MODULES:
        raise CheckpointError(
            f"{modules_path} lists a {module.get('type')!r} module; only {_KNOWN_MODULES} are "
            "supported, and ignoring it would give wrong embeddings.")
      if kind == "Transformer":
        model_dir = os.path.join(folder, module.get("path", ""))
      elif kind == "Pooling":
        pooling_dir = os.path.join(folder, module.get("path", ""))
  elif os.path.isdir(os.path.join(folder, "1_Pooling")):
    pooling_dir = os.path.join(folder, "1_Pooling")
  mode = "mean"
  if pooling_dir is not None:
    pooling_path = os.path.join(pooling_dir, "config.json")
    mode = pooling_mode(checkpoint.read_json(pooling_path), pooling_path)
  st_path = os.path.join(model_dir, "sentence_bert_config.json")
  st_config = checkpoint.read_json(st_path) if os.path.exists(st_path) else {}
  return SentenceTransformersLayout(
      model_dir=model_dir, pooling=mode, max_seq_length=st_config.get("max_seq_length"),
      do_lower_case=bool(st_config.get("do_lower_case", False)))


# ---------------------------------------------------------------------------------------------
# Weights.


def _hf_prefix(tensors: dict, config: EncoderConfig, source: str) -> str:
  """'' or e.g. 'bert.': checkpoints saved from a task model nest the encoder under a prefix."""
  probe = "embeddings.word_embeddings.weight"
  for prefix in ("", f"{config.model_type}."):
    if prefix + probe in tensors:
      return prefix
  raise CheckpointError(
      f"Checkpoint {source} has no {probe!r} (with or without a '{config.model_type}.' prefix); "
      f"is it a {config.model_type} model? Some tensors: {sorted(tensors)[:5]}.")


def load_params(tensors: dict[str, np.ndarray], model: TransformerEncoder, source: str) -> dict:
  """HF tensors -> our parameter tree, shapes checked against the config, cast to our dtypes.

  The expected shape and dtype of every parameter come from the model itself (an abstract
  init), so a checkpoint that disagrees with config.json fails here, naming the tensor.
  """
  config = model.config
  expected = flax.traverse_util.flatten_dict(
      jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.ones((1, 1), jnp.int32),
                     jnp.ones((1, 1), jnp.int32))["params"], sep="/")
  prefix = _hf_prefix(tensors, config, source)
  params = {}
  for ours_template, hf_template, transform in NAME_MAPS[config.model_type]:
    layers = range(config.num_layers) if "{i}" in ours_template else [None]
    for i in layers:
      ours, hf = ours_template.format(i=i), prefix + hf_template.format(i=i)
      array = checkpoint.take(tensors, hf, source)
      checkpoint.check_shape(hf, array, transform.hf_shape(expected[ours].shape), source)
      params[ours] = jnp.asarray(transform.apply(array), dtype=expected[ours].dtype)
  missing = sorted(set(expected) - set(params))
  assert not missing, f"name map does not cover {missing}"  # a bug in the tables above
  return flax.traverse_util.unflatten_dict(params, sep="/")


# ---------------------------------------------------------------------------------------------
# The encoder.


def _bucket_length(longest: int, cap: int) -> int:
  """Padded sequence length: next power of two >= max(longest, 16), at most cap."""
  return min(cap, max(_MIN_LENGTH, 1 << max(longest - 1, 0).bit_length()))


class SentenceEncoder:
  """Texts -> unit-norm sentence vectors, with a jit-compiled forward on padded shapes.

  Attributes:
    tokenizer: the checkpoint's transformers tokenizer.
    pooling: "cls", "mean", "max" or "lasttoken".
    max_seq_length: longer texts are truncated to this many tokens (special tokens included).
    dim: D, the width of the returned vectors.
    trace_count: how many times the forward was traced (compiled); for tests.
  """

  def __init__(self, model: TransformerEncoder, params: dict, tokenizer, pooling: str,
               max_seq_length: int, do_lower_case: bool = False, pad_token_id: int = 0):
    self.model = model
    self.params = params
    self.tokenizer = tokenizer
    self.pooling = pooling
    self.max_seq_length = max_seq_length
    self.do_lower_case = do_lower_case
    self.pad_token_id = pad_token_id
    self.dim = model.config.hidden_size
    self.trace_count = 0
    self._forward = jax.jit(self._embed_padded)

  def _embed_padded(self, params: dict, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """ids, mask: [B, S] int32 -> [B, D] float32 unit vectors. Traced once per shape."""
    self.trace_count += 1  # runs only while tracing, so it counts compilations
    states = self.model.apply({"params": params}, ids, mask)
    return l2_normalize(pool(states, mask, self.pooling))

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids per text, with special tokens, truncated to max_seq_length."""
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise TypeError(f"embed() needs strings; item {i} is a {type(text).__name__}: {text!r:.80}")
    # sentence-transformers strips (and optionally lower-cases) before tokenising; so do we.
    texts = [t.strip().lower() if self.do_lower_case else t.strip() for t in texts]
    return self.tokenizer(texts, truncation=True, max_length=self.max_seq_length,
                          add_special_tokens=True)["input_ids"]

  def _padded_batch(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> ids, mask [B, S] int32, B and S padded to their buckets."""
    batch = -(-len(rows) // _ROW_MULTIPLE) * _ROW_MULTIPLE
    length = _bucket_length(max(len(r) for r in rows), self.max_seq_length)
    ids = np.full((batch, length), self.pad_token_id, np.int32)
    mask = np.zeros((batch, length), np.int32)
    for b, row in enumerate(rows):
      ids[b, :len(row)] = row
      mask[b, :len(row)] = 1
    return ids, mask

  def embed(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """texts (N strings) -> [N, D] float32, every row of unit L2 norm, in input order."""
    if isinstance(texts, str):
      raise TypeError("embed() takes a list of strings, not a single string.")
    texts = list(texts)
    if not texts:
      return np.zeros((0, self.dim), np.float32)
    token_ids = self.tokenize(texts)
    # Texts of similar length share a batch, so the padded lengths stay short.
    order = np.argsort([-len(t) for t in token_ids], kind="stable")
    starts = range(0, len(order), batch_size)
    vectors = np.empty((len(texts), self.dim), np.float32)
    pending = None  # (rows, device result) of the batch in flight
    for start in tqdm.tqdm(starts, desc="embed", unit="batch",
                           disable=len(starts) <= _PROGRESS_MIN_BATCHES):
      chunk = order[start:start + batch_size]
      ids, mask = self._padded_batch([token_ids[j] for j in chunk])
      # Dispatch is asynchronous: the device runs this batch while the previous one is copied
      # back; waiting one batch behind keeps the progress bar honest.
      in_flight = (chunk, self._forward(self.params, ids, mask))
      if pending is not None:
        vectors[pending[0]] = np.asarray(pending[1])[:len(pending[0])]
      pending = in_flight
    vectors[pending[0]] = np.asarray(pending[1])[:len(pending[0])]
    return vectors


def load_encoder(name_or_path: str | os.PathLike,
                 dtype: jnp.dtype = jnp.float32) -> SentenceEncoder:
  """A preset name ('all-minilm-l6-v2', 'multi-qa-mpnet-base-dot-v1'), local HF /
  sentence-transformers folder, or hub id -> SentenceEncoder with weights in `dtype`.

  Raises CheckpointError for unknown presets, missing or corrupt files, unsupported
  architectures, and weights whose shapes disagree with config.json.
  """
  folder = checkpoint.resolve_checkpoint_dir(presets.resolve_encoder(os.fspath(name_or_path)))
  layout = read_layout(folder)
  config = encoder_config(checkpoint.read_json(os.path.join(layout.model_dir, "config.json")),
                          layout.model_dir)
  model = TransformerEncoder(config, dtype=dtype)
  params = load_params(checkpoint.read_safetensors(layout.model_dir), model, layout.model_dir)
  tokenizer = _load_tokenizer(layout.model_dir)
  max_len = min(layout.max_seq_length or tokenizer.model_max_length, config.max_positions)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
  return SentenceEncoder(model, params, tokenizer, layout.pooling, max_len,
                         do_lower_case=layout.do_lower_case, pad_token_id=pad)


def _load_tokenizer(model_dir: str):
  import transformers  # pylint: disable=g-import-not-at-top  (slow import; only when loading)
  try:
    return transformers.AutoTokenizer.from_pretrained(model_dir)
  except Exception as e:  # transformers raises many types; all mean "no usable tokenizer"
    raise CheckpointError(f"Could not load a tokenizer from {model_dir}: "
                          f"{type(e).__name__}: {e}") from e
