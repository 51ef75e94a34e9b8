"""LanguageModel: tokenizer, chat template, bucketed jitted prefill/decode, generate, logits.

    lm = load_lm("smollm2-135m-instruct")      # preset, HF folder, hub id or .gguf file
    lm.generate(["What is DP?"], max_new_tokens=32)
    lm.logits(ids)                              # [B, S, V] float32

Shapes are padded to buckets (batch to a multiple of 8, lengths up a ~1.5x ladder) so that calls
of similar sizes reuse one compilation.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dpsynrag_jax.models import decoder as decoder_lib
from dpsynrag_jax.models import gguf_loader, inference, kv_cache, weight_maps
from dpsynrag_jax.models.checkpoint import (CheckpointError, read_json, read_safetensors,
                                            resolve_checkpoint_dir)
from dpsynrag_jax.models.config import DecoderConfig, RopeConfig, from_hf_config
from dpsynrag_jax.models.decoder import Decoder
from dpsynrag_jax.models.presets import resolve_lm

BATCH_MULTIPLE = 8
# Prompts bucketed past CHUNKED_PREFILL_FROM tokens are prefilled PREFILL_CHUNK tokens at a
# time: one call's attention scores are [B, heads, S, capacity] float32, so a single call over
# sixteen 2048-token prompts (MovieLens RAG: 15 user profiles) asked XLA for 35 GB. Shorter
# prompts keep one call (the same shapes, so the same bytes, as before chunking existed).
CHUNKED_PREFILL_FROM = 1024
PREFILL_CHUNK = 512
_LENGTH_LADDER = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def bucket_length(n: int) -> int:
  """Smallest ladder step >= n; past the ladder, the next multiple of 1024."""
  for step in _LENGTH_LADDER:
    if n <= step:
      return step
  return -(-n // 1024) * 1024


def bucket_batch(n: int) -> int:
  return max(BATCH_MULTIPLE, -(-n // BATCH_MULTIPLE) * BATCH_MULTIPLE)


def special_ids(vocab_size: int, eos_ids: Sequence[int], pad_id: Optional[int],
                source: str = "") -> tuple[tuple[int, ...], int]:
  """(eos ids, pad id) that lie inside the vocabulary.

  A config may name special tokens the vocabulary lacks (transformers' default Phi-3 eos id
  32000 beside a small vocabulary): such an EOS can never be produced, so it is dropped; such
  a pad id would be embedded (a NaN gather) wherever prompts are padded, so it falls back to
  the first in-vocabulary EOS, else 0. Each fallback is logged.
  """
  inside = lambda i: 0 <= int(i) < vocab_size
  kept = tuple(int(i) for i in eos_ids if inside(i))
  if len(kept) != len(tuple(eos_ids)):
    logging.warning("%s: EOS ids %s lie outside the vocabulary [0, %d) and can never be "
                    "produced; ignoring them.", source or "model",
                    [int(i) for i in eos_ids if not inside(i)], vocab_size)
  if pad_id is None or not inside(pad_id):
    fallback = kept[0] if kept else 0
    if pad_id is not None:
      logging.warning("%s: pad id %d lies outside the vocabulary [0, %d); padding with %d "
                      "instead.", source or "model", int(pad_id), vocab_size, fallback)
    pad_id = fallback
  return kept, int(pad_id)


class LanguageModel:
  """A decoder LM with its tokenizer; all device work goes through jitted, bucketed calls."""

  def __init__(self, cfg: DecoderConfig, params, tokenizer, dtype=jnp.float32,
               eos_ids: Sequence[int] = (), source: str = ""):
    self.config = cfg
    # On CPU the weights are held per layer, once: no program then slices a second copy of them
    # out of the stack (decoder.unstack_params).
    self.params = (decoder_lib.unstack_params(params) if inference.unrolled_decode_default()
                   else params)
    self.tokenizer = tokenizer
    self.dtype = dtype
    self.source = source
    if not eos_ids and tokenizer is not None and tokenizer.eos_token_id is not None:
      eos_ids = (tokenizer.eos_token_id,)
    self.eos_ids, self.pad_id = special_ids(
        cfg.vocab_size, eos_ids,
        getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None, source)

  # ---- text <-> ids -------------------------------------------------------------------------

  def _require_tokenizer(self):
    if self.tokenizer is None:
      raise ValueError(f"{self.source} has no tokenizer; pass tokenizer= to load_lm.")
    return self.tokenizer

  def chat_prompt(self, user_message: str, system: Optional[str] = None) -> str:
    """The chat template applied to one user turn, ending where the assistant starts."""
    tok = self._require_tokenizer()
    if not getattr(tok, "chat_template", None):
      return user_message
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user_message}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

  def encode(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
    tok = self._require_tokenizer()
    return [list(tok(t, add_special_tokens=add_special_tokens)["input_ids"]) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    return self._require_tokenizer().decode(list(ids), skip_special_tokens=True)

  # ---- device calls -------------------------------------------------------------------------

  def logits(self, ids) -> np.ndarray:
    """Full causal forward without cache: ids [B, S] -> logits [B, S, V] float32."""
    ids = np.asarray(ids, np.int32)
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
      raise ValueError(f"logits() takes a non-empty [B, S] array of token ids, got {ids.shape}.")
    self._check_ids(ids)
    b, s = ids.shape
    padded = np.full((bucket_batch(b), bucket_length(s)), self.pad_id, np.int32)
    padded[:b, :s] = ids  # right padding: causal, and its values are masked out (Decoder)
    lengths = np.ones((padded.shape[0],), np.int32)
    lengths[:b] = s
    out = inference.full_logits(self.params, self.config, self.dtype, jnp.asarray(padded),
                                jnp.asarray(lengths))
    return np.asarray(out[:b, :s])

  def _check_ids(self, ids: np.ndarray) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
      raise ValueError(f"Token ids must lie in [0, {self.config.vocab_size}); got "
                       f"[{ids.min()}, {ids.max()}].")

  def prefill(self, token_lists: Sequence[Sequence[int]], capacity: int,
              chunk: int | None = None):
    """Prefills right-padded prompts into a fresh cache of `capacity` slots.

    Returns (next-token logits [Bp, V], cache) with Bp = bucket_batch(len(token_lists)); rows past
    the real prompts are padding (one pad token each) and should be ignored.

    chunk: None prefills prompts bucketed up to CHUNKED_PREFILL_FROM in one call and longer ones
      PREFILL_CHUNK tokens at a time; a number prefills every prompt longer than it `chunk`
      tokens at a time, which bounds the attention scores' memory ([B, heads, chunk, capacity])
      at the price of another summation order than one call (not bytewise the same logits).
    """
    if not token_lists:
      raise ValueError("prefill() got no prompts.")
    lengths = np.array([len(t) for t in token_lists], np.int32)
    if lengths.min() == 0:
      raise ValueError(f"Prompt {int(np.argmin(lengths))} is empty after tokenisation.")
    s = bucket_length(int(lengths.max()))
    if s > capacity:
      raise ValueError(f"Cache capacity {capacity} is smaller than the prompt bucket {s}.")
    b = bucket_batch(len(token_lists))
    tokens = np.full((b, s), self.pad_id, np.int32)
    for i, t in enumerate(token_lists):
      tokens[i, :len(t)] = t
    self._check_ids(tokens)
    new_lengths = np.ones((b,), np.int32)
    new_lengths[:len(lengths)] = lengths
    cache = kv_cache.init_cache(self.config, b, capacity, self.dtype)
    rope = self.config.rope
    # LongRoPE picks its factors per call from the call's largest position (as transformers
    # does), so chunks across its original length would rotate early tokens differently.
    if chunk is not None and chunk < 1:
      raise ValueError(f"chunk must be None or positive, got {chunk}.")
    whole_from, step = (CHUNKED_PREFILL_FROM, PREFILL_CHUNK) if chunk is None else (chunk, chunk)
    whole_call = s <= whole_from or (
        rope.rope_type == "longrope" and s > rope.original_max_position_embeddings)
    if whole_call:
      return inference.prefill(self.params, self.config, self.dtype, cache, jnp.asarray(tokens),
                               jnp.asarray(new_lengths))
    # Chunk by chunk: each row's tokens land in consecutive chunks (a row that has ended gets
    # padding slots, position -1, which no query reads), and its next-token logits come from the
    # chunk holding its last token. Same attention up to summation order.
    logits = None
    for start in range(0, s, step):
      part = np.clip(new_lengths - start, 0, step).astype(np.int32)
      chunk_logits, cache = inference.prefill(
          self.params, self.config, self.dtype, cache,
          jnp.asarray(tokens[:, start:start + step]), jnp.asarray(part))
      ends_here = jnp.asarray((new_lengths > start) & (new_lengths <= start + step))
      logits = chunk_logits if logits is None else jnp.where(ends_here[:, None], chunk_logits,
                                                             logits)
    return logits, cache

  def next_token_logits(self, prompts: Sequence[str], chat: bool = True,
                        batch_size: int = 32) -> np.ndarray:
    """Logits of the token after each prompt [N, V] float32 (chat template unless chat=False)."""
    if isinstance(prompts, str) or not prompts:
      raise ValueError("next_token_logits() takes a non-empty list of prompts.")
    token_lists = self.encode([self.chat_prompt(p) if chat else p for p in prompts])
    out = []
    for start in range(0, len(token_lists), batch_size):
      chunk = token_lists[start:start + batch_size]
      logits, _ = self.prefill(chunk, bucket_length(max(map(len, chunk))))
      out.append(np.asarray(logits[:len(chunk)]))
    return np.concatenate(out)

  def generate(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
               seed: int = 0, chat: bool = True, batch_size: int = 32,
               prefill_chunk: int | None = None) -> list[str]:
    """Completions of `prompts` (chat template applied unless chat=False), greedy at 0.
    prefill_chunk: as prefill's `chunk` (None: the default, one call up to 1024 tokens)."""
    ids = self.generate_ids(prompts, max_new_tokens, temperature, seed, chat, batch_size,
                            prefill_chunk)
    return [self.decode(t) for t in ids]

  def generate_ids(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
                   seed: int = 0, chat: bool = True, batch_size: int = 32,
                   prefill_chunk: int | None = None) -> list[list[int]]:
    """Like generate, returning token ids up to and including EOS."""
    if isinstance(prompts, str):
      raise TypeError("generate() takes a list of prompts, not a single string.")
    if not prompts:
      raise ValueError("generate() got an empty prompt list.")
    if max_new_tokens < 1:
      raise ValueError("max_new_tokens must be >= 1.")
    texts = [self.chat_prompt(p) if chat else p for p in prompts]
    token_lists = self.encode(texts)
    # Batches of similar lengths pad less: run in length order, answer in the caller's order.
    order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))
    out: list[list[int]] = [[] for _ in token_lists]
    key = jax.random.PRNGKey(seed)
    starts = range(0, len(order), batch_size)
    for start in tqdm.tqdm(starts, desc="generate", unit="batch", disable=len(starts) < 3):
      rows = order[start:start + batch_size]
      chunk = [token_lists[i] for i in rows]
      capacity = bucket_length(max(map(len, chunk))) + bucket_length(max_new_tokens)
      logits, cache = self.prefill(chunk, capacity, prefill_chunk)
      padding = np.arange(logits.shape[0]) >= len(chunk)   # batch rows past the prompts
      tokens, lengths = inference.decode_loop(
          self.params, self.config, self.dtype, cache, logits,
          jax.random.fold_in(key, start), max_new_tokens=max_new_tokens,
          select=inference.Sampler(float(temperature)), eos_ids=self.eos_ids,
          pad_id=self.pad_id, padding=jnp.asarray(padding))
      tokens, lengths = np.asarray(tokens), np.asarray(lengths)
      for j, i in enumerate(rows):
        out[i] = tokens[j, :lengths[j]].tolist()
    return out


# ---- loading --------------------------------------------------------------------------------

def _cache_dir() -> str:
  return os.environ.get("DPSYNRAG_CACHE", os.path.join(os.path.expanduser("~"), ".cache",
                                                       "dpsynrag_jax"))


def _gguf_tokenizer(path: str):
  """transformers' tokenizer for a GGUF file, converted once and cached as tokenizer.json."""
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  stat = os.stat(path)
  key = hashlib.sha256(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime}".encode())
  cached = os.path.join(_cache_dir(), "gguf_tokenizers", key.hexdigest()[:16])
  if os.path.exists(os.path.join(cached, "tokenizer.json")):
    return AutoTokenizer.from_pretrained(cached)
  tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                      gguf_file=os.path.basename(path))
  try:
    tok.save_pretrained(cached)
  except OSError as e:  # a read-only home only costs the conversion next time
    logging.info("Could not cache the GGUF tokenizer at %s: %s", cached, e)
  return tok


def _hf_tokenizer(folder: str):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  names = os.listdir(folder)
  if not any(n.startswith("tokenizer") or n.endswith(".model") for n in names):
    return None
  return AutoTokenizer.from_pretrained(folder)


def _hf_eos_ids(folder: str) -> tuple[int, ...]:
  path = os.path.join(folder, "generation_config.json")
  if not os.path.exists(path):
    return ()
  eos = read_json(path).get("eos_token_id")
  if eos is None:
    return ()
  return tuple(eos) if isinstance(eos, list) else (int(eos),)


class _PrefixAlias(dict):
  """Checkpoints saved from the base model class lack the 'model.' prefix; accept both."""

  def __missing__(self, name):
    if name.startswith("model.") and name[len("model."):] in self:
      return self[name[len("model."):]]
    raise KeyError(name)

  def __contains__(self, name):
    return dict.__contains__(self, name) or (
        name.startswith("model.") and dict.__contains__(self, name[len("model."):]))


# A 2-layer random decoder with SmolLM2's tokenizer: end-to-end tests and CPU smoke runs.
TINY_RANDOM = "tiny-random"
TINY_RANDOM_CONFIG = DecoderConfig(
    model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, rope=RopeConfig(theta=100000.0),
    tie_word_embeddings=True)


def load_lm(name_or_path: str, dtype=jnp.float32, tokenizer=None) -> LanguageModel:
  """Loads a preset name, local HF folder (safetensors), hub id, or .gguf file.

  "tiny-random" is a randomly initialised 2-layer model with the embedded SmolLM2's tokenizer.
  """
  if name_or_path == TINY_RANDOM:
    smollm2 = resolve_lm("smollm2-135m-instruct")
    tokenizer = tokenizer if tokenizer is not None else _gguf_tokenizer(smollm2)
    return random_lm(TINY_RANDOM_CONFIG, seed=0, dtype=dtype, tokenizer=tokenizer,
                     eos_ids=(tokenizer.eos_token_id,))
  path = resolve_lm(name_or_path)
  if path.endswith(".gguf"):
    reader = gguf_loader.open_gguf(path)
    meta = gguf_loader.metadata(reader)
    tensors = gguf_loader.DequantisedTensors(reader)
    cfg = gguf_loader.config_from_gguf(meta, tensors, path)
    rules = weight_maps.GGUF_MAPS[meta["general.architecture"]]
    tokenizer = tokenizer if tokenizer is not None else _gguf_tokenizer(path)
    eos_ids: tuple[int, ...] = ()
  else:
    folder = resolve_checkpoint_dir(path)
    cfg = from_hf_config(read_json(os.path.join(folder, "config.json")))
    tensors = _PrefixAlias(read_safetensors(folder))
    rules = weight_maps.HF_MAPS[cfg.model_type]
    tokenizer = tokenizer if tokenizer is not None else _hf_tokenizer(folder)
    eos_ids = _hf_eos_ids(folder)
  expected = weight_maps.expected_params(Decoder(cfg, dtype), cfg, dtype)
  params = weight_maps.apply_map(rules, tensors, cfg, expected, dtype, path)
  return LanguageModel(cfg, params, tokenizer, dtype, eos_ids, source=path)


def random_lm(cfg: DecoderConfig, seed: int = 0, dtype=jnp.float32, tokenizer=None,
              eos_ids: Sequence[int] = ()) -> LanguageModel:
  """A randomly initialised model of any shape (tests, benchmarks of large shapes)."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  empty = kv_cache.init_cache(cfg, 1, 0, dtype)
  params = jax.jit(Decoder(cfg, dtype).init)(jax.random.PRNGKey(seed), tokens, empty.k, empty.v,
                                             empty.positions, empty.lengths)["params"]
  return LanguageModel(cfg, params, tokenizer, dtype, eos_ids, source=f"random({seed})")


__all__ = ["LanguageModel", "load_lm", "random_lm", "bucket_length", "bucket_batch",
           "CheckpointError"]
