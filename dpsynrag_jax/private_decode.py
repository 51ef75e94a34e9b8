"""The private decode: one text per group of documents from the clipped sum of their
next-token logits (DP-SynRAG step 4). DP-SynRAG (a cluster), DP-Synth (a batch) and DP-RAG (a
question's retrieved documents) all run it; the token mechanism itself is
`privacy.PrivateTokenSelector`.

Per cluster, on device: the shared prompt prefix's KV cache (computed once per run) is
broadcast to every row and the document suffixes are prefilled after it, in chunks of rows
sorted by length (each chunk padded to the bucket of its own longest row); then, in one
jitted while loop, T times: logits [B, V] -> clip each document row to [-c, c] -> masked sum
(+ omega * public row) -> / tau -> sample ONE token -> append it to every row -> decode step.
EOS ends the text early.

Clusters are independent: a group of clusters with the same padded shapes runs as one
shard_map over a 1-D mesh of the local devices, and on each device n clusters of few rows run
as one batch of n x B rows ("packed", n = pack_size(B)): every weight matmul of a decode step
then has n x B rows instead of B, which is where small clusters lose most (BUILD_NOTES,
"Packed clusters"). Each cluster keeps its own rows, its own key and its own token mechanism
over its own rows, and stops at its own EOS.

The rule: a cluster's arithmetic (every padded shape, hence its float rounding) depends only on
public settings and its own rows, never on another cluster's documents, since the parallel
composition of the guarantee covers a cluster's own documents only (DESIGN, section 3). The
group's shape is what each cluster's own rows give (shape_of); each device pads a prefill chunk
to its own rows' bucket and skips a chunk where its cluster has no row (prefill_group), as the
cluster decoded alone; n = pack_size(B) follows from that shape. So a cluster's text does not
depend on which clusters share its group or device, nor on G. One exception stands: a shape's
last group packs only the clusters left (decode_group_paid), and a decode step's rounding can
depend on the batch's row count (it does on CPU), so there the number of clusters of that
shape reaches a cluster's rounding.

Axis letters: G devices in a group, n clusters packed per device, B rows (documents, padded)
per cluster, S suffix tokens, P shared-prefix tokens, C cache slots, V vocabulary, T private
tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import tqdm

from dpsynrag_jax import host_memory
from dpsynrag_jax.models import inference, kv_cache
from dpsynrag_jax.models.language_model import LanguageModel, bucket_length
from dpsynrag_jax.privacy import PrivateTokenSelector, SparseVectorSelector

REPHRASE_PROMPT = ("Rephrase the following document without altering the important information "
                   "contained within it.\nDocument: {d}")
# A cluster's rows (documents, public row) are padded to a multiple of ROW_BUCKET: every padded
# row costs a full decode row, while each distinct row count is one more program to compile.
# 8 decodes 5 % fewer rows than 16 on paper_cpu (BUILD_NOTES, "Row buckets").
ROW_BUCKET = 8
PREFILL_CHUNK = 16  # rows per prefill call
# Clusters of B rows are packed PACK_ROWS // B to a batch (at least one): a decode step's
# matmuls run at 78 / 190 / 230 GFLOP/s with 16 / 64 / 128 rows on the 2-core CPU, while a step
# costs about as much per row above 64 (BUILD_NOTES, "Packed clusters").
PACK_ROWS = 96
# Compiled group programs are kept for this many cluster shapes (rows, suffix bucket). Each
# shape's programs hold ~80 MB of host memory on CPU, and a paper_cpu build visits ~30 shapes
# once each, in order, so keeping them all (as up to 64 were) held gigabytes for nothing; a
# few cover DP-RAG, whose questions come back to the same shapes (BUILD_NOTES, "Peak RSS of
# the whole build"). decode_many, which visits each shape once, keeps only the current one's.
PROGRAMS_KEPT = 4
_SENTINEL = "\u2063DOC\u2063"


def _prefill_rows(params, prefix_k, prefix_v, cache, logits, tokens, lengths, row0, active, *,
                  cfg, dtype):
  """Prefills one chunk of a cluster's rows after the shared prefix, if `active`.

  tokens [b, S_c] and lengths [b] are rows row0 .. row0 + b - 1. The chunk runs against a b-row
  cache of P + S_c slots, then lands in the cluster's cache [B, C] (same slots) and its
  next-token logits in logits [B, V]. active: a traced [] bool; where False, the chunk is not
  run and the cache and logits are returned as they came (a device whose own cluster has no
  row in this chunk, or whose rows pad to another bucket, takes no part in the call).
  """
  b, s = tokens.shape
  p = prefix_v.shape[3]

  def run():
    chunk = kv_cache.with_prefix(kv_cache.init_cache(cfg, b, p + s, dtype), prefix_k, prefix_v)
    chunk_logits, chunk = inference.extend(params, cfg, dtype, chunk, tokens, lengths)
    return chunk, chunk_logits

  def keep():
    # What the write below puts back: the same rows and slots, unchanged. The branch holds
    # only the chunk's b rows, so the whole cache never passes through the cond (which could
    # copy it) and is updated in place, as without the flag.
    return _rows_of(cache, row0, b, p + s), jax.lax.dynamic_slice_in_dim(logits, row0, b)

  chunk, chunk_logits = jax.lax.cond(active, run, keep)
  zero = jnp.zeros((), jnp.int32)
  return (kv_cache.write_rows(cache, chunk, row0),
          jax.lax.dynamic_update_slice(logits, chunk_logits, (row0, zero)))


def _rows_of(cache, row0, b: int, slots: int) -> kv_cache.KVCache:
  """Rows row0 .. row0 + b - 1 and slots 0 .. slots - 1 of `cache` (stacked or per layer) as a
  stacked b-row cache of `slots` slots, in the layout kv_cache.write_rows takes back. Its
  cursor is `slots`, as a chunk's is after its prefill (write_rows ignores it)."""
  def cut(a, slot_axis):   # a: one layer [B, K, ., .]
    sizes = list(a.shape)
    sizes[0], sizes[slot_axis] = b, slots
    return jax.lax.dynamic_slice(a, (row0,) + (0,) * (a.ndim - 1), sizes)

  layers = lambda x: x if cache.per_layer else tuple(x[i] for i in range(x.shape[0]))
  k = jnp.stack([cut(a, 3) for a in layers(cache.k)])   # [L, b, K, H, slots]
  v = jnp.stack([cut(a, 2) for a in layers(cache.v)])   # [L, b, K, slots, H]
  zero = jnp.zeros((), jnp.int32)
  return kv_cache.KVCache(
      k=k, v=v, positions=jax.lax.dynamic_slice(cache.positions, (row0, zero), (b, slots)),
      lengths=jax.lax.dynamic_slice_in_dim(cache.lengths, row0, b),
      cursor=jnp.asarray(slots, jnp.int32))


def _decode_rows(params, cache, logits, doc_mask, public_mask, keys, *, cfg, dtype, T, selector,
                 eos_ids, pad_id, unrolled=None):
  """T private steps over a prefilled cache of n packed clusters [n * B, P + S + T] (keys
  [n, 2], one per cluster) -> (tokens [n, T], counts [n], paid tokens among them [n], the cache
  after the last step: returned only so that the donated cache is aliased). unrolled: as
  run_decode_loop's (None: this backend's default; memory_plan compiles another backend's)."""
  n = keys.shape[0]
  rows = logits.shape[0] // n
  packed = PackedSelector(selector, n)
  cache = cache.replace(cursor=jnp.asarray(cache.capacity - T, jnp.int32))
  out, count, state = inference.run_decode_loop(
      params, cfg, dtype, cache, logits, keys, (doc_mask, public_mask), max_new_tokens=T,
      select=packed, eos_ids=eos_ids, pad_id=pad_id, unrolled=unrolled, return_state=True)
  first_rows = jnp.arange(n) * rows          # every row of a cluster carries its tokens
  count = count[first_rows]
  # A sparse-vector selector counts its paid tokens; with any other, every token is paid.
  paid = (jnp.stack([s[1] for s in state.select_state])
          if isinstance(selector, SparseVectorSelector) else count)
  return out[first_rows], count, paid, state.cache


@dataclasses.dataclass(frozen=True)
class PackedSelector:
  """The decode loop's `select` for n clusters packed in one batch: rows i * B .. (i + 1) * B - 1
  are cluster i's, and `base` (the token mechanism) runs on each cluster's rows alone, with that
  cluster's key (keys [n, 2]) and state. The n calls are unrolled rather than vmapped, so each
  is the very computation of an unpacked cluster (a vmapped sum could add in another order)."""
  base: PrivateTokenSelector | SparseVectorSelector
  clusters: int

  @property
  def stateful(self) -> bool:
    return self.base.stateful

  def _each(self, logits, aux):
    rows = logits.shape[0] // self.clusters
    cut = lambda a, i: a[i * rows:(i + 1) * rows]
    return [(cut(logits, i), tuple(cut(a, i) for a in aux)) for i in range(self.clusters)]

  def fold_in(self, keys, step):
    return jnp.stack([jax.random.fold_in(keys[i], step) for i in range(self.clusters)])

  def __call__(self, keys, logits, aux):
    return jnp.concatenate([self.base(keys[i], l, a)
                            for i, (l, a) in enumerate(self._each(logits, aux))])

  def initial_state(self, keys):
    return tuple(self.base.initial_state(keys[i]) for i in range(self.clusters))

  def step(self, keys, logits, aux, state):
    out = [self.base.step(keys[i], l, a, state[i])
           for i, (l, a) in enumerate(self._each(logits, aux))]
    return jnp.concatenate([t for t, _ in out]), tuple(s for _, s in out)

  def hold(self, state, new_state, done):
    """A cluster that has ended keeps its state (an unpacked loop would have stopped): the
    sparse vector test counts no paid token after the cluster's EOS."""
    rows = done.shape[0] // self.clusters
    return tuple(jax.tree.map(lambda old, new, d=done[i * rows]: jnp.where(d, old, new),
                              state[i], new_state[i]) for i in range(self.clusters))


@dataclasses.dataclass(frozen=True)
class _Static:
  """Everything about a compiled group program that is not an array. `rows` (per cluster)
  and `clusters` (packed per device) are part of it so that a program (a jit object, which
  compiles once per input shape) holds one cluster shape's executables and dropping it frees
  them."""
  cfg: object
  dtype: object
  rows: int
  clusters: int
  capacity: int
  T: int
  selector: PrivateTokenSelector | SparseVectorSelector
  eos_ids: tuple[int, ...]
  pad_id: int
  mesh: Mesh


def _sharded(static: _Static, per_device, num_split: int, num_same: int, donate=()):
  """jit(shard_map(per_device)): the first num_same arguments replicated, the next num_split
  split over the mesh's 'clusters' axis (one cluster per device, leading axis), outputs split."""
  split, same = PartitionSpec("clusters"), PartitionSpec()
  return jax.jit(jax.shard_map(per_device, mesh=static.mesh,
                               in_specs=(same,) * num_same + (split,) * num_split,
                               out_specs=split, check_vma=False),
                 donate_argnums=donate)


def _first(tree):
  return jax.tree.map(lambda a: a[0], tree)


def _lead(tree):
  return jax.tree.map(lambda a: a[None], tree)


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _empty_program(static: _Static):
  """() -> (cache [G, ...] of n x static.rows rows and static.capacity slots, logits [G,
  n x rows, V]) for n = static.clusters.

  Where the decode loop unrolls the layers (CPU), the cache is made per layer here, so the
  prefill writes straight into the buffers the loop updates in place: a stacked cache would be
  split into per-layer copies when the loop starts, two copies of the largest buffer of the
  build alive at once (1.4 GB for a 128-row SmolLM2 cluster)."""
  g, rows = static.mesh.devices.size, static.rows * static.clusters

  def make():
    cache = kv_cache.init_cache(static.cfg, rows, static.capacity, static.dtype)
    if inference.unrolled_decode_default():
      cache = kv_cache.unstack_layers(cache)
    logits = jnp.zeros((rows, static.cfg.vocab_size), jnp.float32)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (g,) + a.shape), (cache, logits))

  return jax.jit(make, out_shardings=NamedSharding(static.mesh, PartitionSpec("clusters")))


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _prefill_program(static: _Static):
  """Group program of _prefill_rows; the cache and logits buffers are donated. Each device
  reads its own `active` flag ([G] bool, split), a traced input: one compiled program per
  chunk shape serves every pattern of active devices."""
  def per_device(params, prefix_k, prefix_v, row0, cache, logits, tokens, lengths, active):
    inference.TRACE_COUNTS["private_prefill"] += 1
    out = _prefill_rows(params, prefix_k, prefix_v, _first(cache), logits[0], tokens[0],
                        lengths[0], row0, active[0], cfg=static.cfg, dtype=static.dtype)
    return _lead(out)
  return _sharded(static, per_device, num_split=5, num_same=4, donate=(4, 5))


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _decode_program(static: _Static):
  """Group program of _decode_rows -> (tokens [G, n, T], counts [G, n], paid [G, n], the final
  cache) for n = static.clusters packed per device. The
  cache is donated and returned, so the while loop runs in place on the prefilled buffers
  instead of a copy of them; the caller drops what comes back."""
  def per_device(params, cache, logits, doc_mask, public_mask, keys):
    inference.TRACE_COUNTS["private_decode"] += 1
    out = _decode_rows(params, _first(cache), logits[0], doc_mask[0], public_mask[0], keys[0],
                       cfg=static.cfg, dtype=static.dtype, T=static.T, selector=static.selector,
                       eos_ids=static.eos_ids, pad_id=static.pad_id)
    return _lead(out)
  return _sharded(static, per_device, num_split=5, num_same=1, donate=(1,))


def drop_group_programs() -> None:
  """Drops every shape's compiled group programs and returns the memory they and the freed
  buffers held. decode_many calls it when it moves on to the next shape: it visits each shape
  once, in ascending order, so the programs it drops are never needed again, and the largest
  shapes then decode beside no earlier shape's programs (a paper_cpu build's peak resident
  size comes at its largest clusters; BUILD_NOTES, "Whole paper_cpu build on the landed
  code")."""
  for program in (_empty_program, _prefill_program, _decode_program):
    program.cache_clear()
  gc.collect()   # an executable held in a reference cycle is freed now, not at some later pass
  host_memory.release_freed_memory()


def pack_size(rows: int) -> int:
  """Clusters of `rows` padded rows packed per device in one batch."""
  return max(1, PACK_ROWS // rows)


@functools.partial(jax.jit, static_argnames=("selector", "T", "vocab_size"))
def _documentless_tokens(key, *, selector: PrivateTokenSelector, T: int, vocab_size: int):
  """[T] tokens the decode loop draws for a cluster with no row at all (no document and no
  public row): every step's utility is the all-zero masked sum, so the draws need no model."""
  logits = jnp.zeros((1, vocab_size), jnp.float32)
  aux = (jnp.zeros((1,), bool), jnp.zeros((1,), bool))
  # The decode loop's per-step key and step index (a stateful selector's state is the index).
  step = lambda s: selector.select_at(jax.random.fold_in(key, s), logits, aux,
                                      s if selector.stateful else None)[0]
  return jax.lax.map(step, jnp.arange(T, dtype=jnp.int32))


class PrivatePredictor:
  """Runs the private decode for many clusters of documents on all local devices.

  Args:
    lm: the language model.
    c, tau, method, alpha, omega, candidates, candidate_ids, candidate_width, min_length: the
      token mechanism (see PrivateTokenSelector; min_length bans the model's EOS ids).
    svt: None (every token private, the paper), or a dict of SparseVectorSelector's threshold,
      epsilon_test and paid: free public tokens wherever the test finds no disagreement.
    T: private tokens per cluster.
    prompt: template with a {d} slot for the document.
    devices: devices to spread clusters over (default: all local devices).
  """

  def __init__(self, lm: LanguageModel, *, c: float, tau: float, T: int,
               method: str = "grislain", alpha: float = 1.0, omega: float = 0.0,
               candidates: int = 0, candidate_ids: Sequence[int] = (),
               candidate_width: float = 0.0, min_length: int = 0, svt: dict | None = None,
               prompt: str = REPHRASE_PROMPT, devices: Sequence[jax.Device] | None = None):
    if T < 1:
      raise ValueError(f"T must be >= 1, got {T}.")
    selector = PrivateTokenSelector(
        c=float(c), tau=float(tau), method=method, alpha=float(alpha), omega=float(omega),
        candidates=int(candidates), candidate_ids=tuple(sorted({int(i) for i in candidate_ids})),
        candidate_width=float(candidate_width), min_length=int(min_length),
        eos_ids=(tuple(i for i in lm.eos_ids if 0 <= i < lm.config.vocab_size)
                 if min_length else ()),
        public_row=svt is not None)
    if min_length > T:
      raise ValueError(f"min_length ({min_length}) exceeds T ({T}): no text could end.")
    if any(not 0 <= i < lm.config.vocab_size for i in selector.candidate_ids):
      raise ValueError("candidate_ids must be token ids of the model's vocabulary.")
    if svt is not None:
      selector = SparseVectorSelector(
          base=selector, threshold=float(svt["threshold"]),
          epsilon_test=float(svt["epsilon_test"]), paid=int(svt["paid"]))
    mesh = Mesh(np.asarray(devices or jax.local_devices()), ("clusters",))
    params = jax.device_put(lm.params, NamedSharding(mesh, PartitionSpec()))
    self._assemble(lm, selector, T, prompt, mesh, params)

  def _assemble(self, lm, selector: PrivateTokenSelector, T: int, prompt: str, mesh: Mesh,
                params, shared_until: str | None = None) -> None:
    """Sets every field; the prompt's shared prefix is prefilled here."""
    if "{d}" not in prompt:
      raise ValueError("The prompt template needs a {d} slot for the document.")
    if shared_until is not None and shared_until not in prompt.split("{d}")[0]:
      raise ValueError(f"shared_until {shared_until!r} does not occur in the prompt before "
                       "its {d} slot.")
    self.lm, self.selector, self.T, self.prompt, self.mesh = lm, selector, T, prompt, mesh
    self.shared_until = shared_until
    self._params = params   # replicated over the mesh
    self.prefix = self._shared_prefix()
    self._prefix_kv = jax.device_put(self._prefix_cache(), NamedSharding(mesh, PartitionSpec()))
    self._public_suffix_tokens = {}   # public hint -> the public row's suffix, on first use

  def with_prompt(self, prompt: str, shared_until: str | None = None) -> "PrivatePredictor":
    """The same mechanism, devices and replicated parameters with another prompt template
    (DP-RAG: one per question); only the shared prefix is prefilled again.

    shared_until: where the shared prefix ends, if before the {d} slot: the prompt's text
    from its first occurrence on goes into every row's suffix instead. DP-RAG cuts before the
    question, so the prefix (and with it every compiled program's shapes) is the same for all
    questions: a prefix that ends after the question has a new length, hence new programs to
    compile, at every question (which, on CPU, ran out of JIT code memory after ~150).
    """
    other = PrivatePredictor.__new__(PrivatePredictor)
    other._assemble(self.lm, self.selector, self.T, prompt, self.mesh, self._params,
                    shared_until)
    return other

  @property
  def num_devices(self) -> int:
    return self.mesh.devices.size

  # ---- prompts ------------------------------------------------------------------------------

  def _shared_prefix(self) -> list[int]:
    """Tokens every prompt starts with (chat template and instruction up to the document)."""
    filled = self.prompt.format(d=_SENTINEL)
    text = self.lm.chat_prompt(filled)
    before = text.split(_SENTINEL)[0]
    if self.shared_until is not None:
      # Cut at shared_until's first occurrence in the prompt's own text (not in the chat
      # template's opening, nor in a question that happens to contain it).
      own = filled.split(_SENTINEL)[0]
      if own not in before:
        raise ValueError("The chat template does not hold the prompt verbatim; shared_until "
                         "cannot be placed.")
      before = before[:before.index(own) + own.index(self.shared_until)]
    return self.lm.encode([before.rstrip(" ")])[0]

  def _prefix_cache(self):
    p = len(self.prefix)
    if not p:
      empty = kv_cache.init_cache(self.lm.config, 1, 0, self.lm.dtype)
      return empty.k, empty.v
    _, cache = self.lm.prefill([self.prefix], capacity=bucket_length(p))
    return cache.k[:, :1, :, :, :p], cache.v[:, :1, :, :p]   # keys [L, 1, K, H, P]

  def suffixes(self, documents: Sequence[str]) -> list[list[int]]:
    """Each document's prompt tokens after the shared prefix."""
    texts = [self.lm.chat_prompt(self.prompt.format(d=d)) for d in documents]
    p = len(self.prefix)
    out = []
    for i, ids in enumerate(self.lm.encode(texts)):
      if ids[:p] != self.prefix:
        raise ValueError(
            f"Document {i}'s prompt does not start with the shared prefix tokens; the "
            "tokenizer merges the template's end with the document. Put a space or newline "
            "before {d} in the prompt template.")
      out.append(ids[p:])
    return out

  # ---- decoding -----------------------------------------------------------------------------

  def _pack(self, suffixes: Sequence[Sequence[int]], public_suffix: Sequence[int] | None,
            rows: int, length: int):
    """Host arrays of one cluster: tokens [B, S], lengths, doc_mask, public_mask.

    Real rows (documents, then the public row) come first, longest first, so the prefill's
    chunks of PREFILL_CHUNK rows each pad only to their own longest row; the row order does not
    change the mechanism (a masked sum over rows)."""
    all_rows = list(suffixes) + ([public_suffix] if public_suffix is not None else [])
    order = sorted(range(len(all_rows)), key=lambda i: -len(all_rows[i]))
    tokens = np.full((rows, length), self.lm.pad_id, np.int32)
    lengths = np.ones((rows,), np.int32)  # padded rows hold one pad token
    doc_mask = np.zeros((rows,), bool)
    public_mask = np.zeros((rows,), bool)
    for row, i in enumerate(order):
      tokens[row, :len(all_rows[i])] = all_rows[i]
      lengths[row] = len(all_rows[i])
      doc_mask[row] = i < len(suffixes)
      public_mask[row] = i == len(suffixes)
    return tokens, lengths, doc_mask, public_mask

  def shape_of(self, suffixes: Sequence[Sequence[int]], hint: str = "",
               lead: Sequence[int] = ()) -> tuple[int, int]:
    """(rows, suffix length) bucket of a cluster; depends on that cluster alone. `lead`: the
    cluster's public opening (decode_many's lead_of), already in `suffixes`' rows, which the
    public row gets too."""
    all_rows = list(suffixes) + ([self._public_suffix(hint, lead)]
                                 if self.selector.needs_public_row else [])
    rows = max(ROW_BUCKET, -(-len(all_rows) // ROW_BUCKET) * ROW_BUCKET)
    return rows, bucket_length(max((len(s) for s in all_rows), default=1))

  def _public_suffix(self, hint: str = "", lead: Sequence[int] = ()):
    """The public row's suffix when the selector reads it: the prompt with a public `hint`
    (e.g. the cluster's released keyword) in the document's place, or with no document, then
    the cluster's public `lead` tokens."""
    if not self.selector.needs_public_row:
      return None
    if hint not in self._public_suffix_tokens:
      self._public_suffix_tokens[hint] = self.suffixes([hint])[0] or [self.lm.pad_id]
    return self._public_suffix_tokens[hint] + list(lead)

  def _static(self, rows: int, length: int, clusters: int = 1) -> _Static:
    return _Static(cfg=self.lm.config, dtype=self.lm.dtype, rows=rows, clusters=clusters,
                   capacity=len(self.prefix) + length + self.T, T=self.T,
                   selector=self.selector, eos_ids=self.lm.eos_ids, pad_id=self.lm.pad_id,
                   mesh=self.mesh)

  def pack_group(self, clusters: Sequence[Sequence[Sequence[int]]], shape: tuple[int, int],
                 hints: Sequence[str] | None = None,
                 leads: Sequence[Sequence[int]] | None = None, pack: int = 1):
    """Host arrays [G, pack x B, ...] (tokens, lengths, doc_mask, public_mask) of up to
    num_devices x pack clusters sharing `shape` (B rows each): device g holds clusters
    g * pack .. (g + 1) * pack - 1, one after another, and the group is filled with empty
    clusters (all rows masked). hints: each cluster's public hint for its public row (default:
    none); leads: each cluster's public opening tokens for its public row (default: none; the
    document rows carry theirs in `clusters`)."""
    room = self.num_devices * pack
    if not 0 < len(clusters) <= room:
      raise ValueError(f"A group holds 1..{room} clusters, got {len(clusters)}.")
    hints = [""] * len(clusters) if hints is None else list(hints)
    leads = [()] * len(clusters) if leads is None else list(leads)
    for name, values in (("hints", hints), ("leads", leads)):
      if len(values) != len(clusters):
        raise ValueError(f"{len(values)} {name} for {len(clusters)} clusters.")
    packed = [self._pack(c, self._public_suffix(h, lead), *shape)
              for c, h, lead in zip(clusters, hints, leads)]
    packed += [self._pack([], self._public_suffix(), *shape)] * (room - len(packed))
    return [np.stack([np.concatenate(a[g * pack:(g + 1) * pack])
                      for g in range(self.num_devices)]) for a in zip(*packed)]

  def prefill_group(self, arrays, pack: int = 1):
    """Prefills a group (pack_group, `pack` clusters per device) in chunks of PREFILL_CHUNK
    rows of one cluster each.

    A cluster's arithmetic depends only on public settings and its own rows, never on the
    clusters beside it: each device pads a chunk to the bucket of its own longest row there
    (rows are sorted by length), and a device with no real row in the chunk skips it, exactly
    as that cluster decoded alone. A chunk whose devices pad to different buckets runs once
    per bucket, each device taking part in its own bucket's call only (the `active` flag);
    on one device there is one call per chunk with a real row. Compiled programs depend on
    (rows, suffix bucket, pack) and the chunk's shape only, so clusters in the same buckets
    share them; a packed cluster's chunks are those it has alone.

    Returns device arrays: the cache [G, pack x B, ...] and next-token logits [G, pack x B, V].
    """
    tokens, lengths, doc_mask, public_mask = arrays
    g, all_rows, length = tokens.shape
    rows = all_rows // pack
    static = self._static(rows, length, pack)
    split = NamedSharding(self.mesh, PartitionSpec("clusters"))
    cache, logits = _empty_program(static)()
    real = doc_mask | public_mask
    chunks = [(i * rows + r, i * rows + min(r + PREFILL_CHUNK, rows))
              for i in range(pack) for r in range(0, rows, PREFILL_CHUNK)]
    for row0, row_end in chunks:
      rows_here = slice(row0, row_end)
      # Per device: does its cluster have a real row here, and to which bucket does it pad?
      # The maximum over all devices' rows would let one cluster's documents set another's
      # padded prefill shape, hence its rounding.
      has_rows = real[:, rows_here].any(axis=1)                              # [G]
      buckets = np.array([bucket_length(int(lengths[d, rows_here].max())) for d in range(g)])
      for chunk_length in sorted(set(buckets[has_rows].tolist())):
        active = has_rows & (buckets == chunk_length)                       # [G]
        chunk = [jax.device_put(np.ascontiguousarray(a), split)
                 for a in (tokens[:, rows_here, :chunk_length], lengths[:, rows_here], active)]
        cache, logits = _prefill_program(static)(self._params, *self._prefix_kv,
                                                 jnp.asarray(row0, jnp.int32), cache, logits,
                                                 *chunk)
    return cache, logits

  def prefilled_decode(self, arrays, keys: Sequence[jax.Array], pack: int = 1):
    """The prefill of a group (pack_group), then its compiled decode program and inputs:
    (program, args). program(*args) runs the T private steps -> (tokens [G, pack, T], counts,
    paid, the final cache); it donates the cache in args, so each args serves one call. Apart
    from decode_arrays so that a benchmark can time or trace the decode alone."""
    cache, logits = self.prefill_group(arrays, pack)
    g = self.num_devices
    keys = list(keys) + [jax.random.PRNGKey(0)] * (g * pack - len(keys))
    split = NamedSharding(self.mesh, PartitionSpec("clusters"))
    masks = [jax.device_put(a, split) for a in arrays[2:]]
    rows, length = arrays[0].shape[1] // pack, arrays[0].shape[2]
    keys = jnp.stack(keys).reshape(g, pack, -1)
    return (_decode_program(self._static(rows, length, pack)),
            (self._params, cache, logits, *masks, jax.device_put(keys, split)))

  def decode_arrays(self, arrays, keys: Sequence[jax.Array], pack: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefill and T private steps of a group (pack_group) -> (tokens [G x pack, T], counts
    [G x pack], paid [G x pack]: tokens drawn privately, = counts unless the sparse vector test
    made some free), in pack_group's cluster order."""
    program, args = self.prefilled_decode(arrays, keys, pack)
    tokens, counts, paid, _ = program(*args)
    flat = lambda a: np.asarray(a).reshape((self.num_devices * pack,) + a.shape[2:])
    return flat(tokens), flat(counts), flat(paid)

  def decode_group(self, clusters: Sequence[Sequence[Sequence[int]]], keys: Sequence[jax.Array],
                   shape: tuple[int, int], hints: Sequence[str] | None = None,
                   leads: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Decodes clusters sharing `shape`, packed ceil(len / num_devices) per device; returns
    token ids per cluster (hints, leads: as pack_group)."""
    return self.decode_group_paid(clusters, keys, shape, hints, leads)[0]

  def decode_group_paid(self, clusters, keys, shape, hints=None, leads=None
                        ) -> tuple[list[list[int]], list[int]]:
    """decode_group, and how many of each cluster's tokens were drawn privately."""
    # decode_many's last group of a shape packs fewer than pack_size(rows): the one place
    # where other clusters (how many share the shape) reach a cluster's decode batch and so
    # its rounding (module docstring). Padding it to the full pack with empty clusters would
    # end that, at the cost of their rows, and could move texts already released.
    pack = -(-len(clusters) // self.num_devices)
    tokens, counts, paid = self.decode_arrays(
        self.pack_group(clusters, shape, hints, leads, pack), keys, pack)
    # The group's caches are freed now; without this their pages stay in the allocator's
    # heaps, fragmented across shapes (12.7 GB resident at the end of a paper_cpu build).
    host_memory.release_freed_memory()
    return ([tokens[g, :counts[g]].tolist() for g in range(len(clusters))],
            [int(p) for p in paid[:len(clusters)]])

  @property
  def decodes_empty_without_model(self) -> bool:
    """An empty cluster has no row the model must read (no public row either)."""
    return not self.selector.needs_public_row

  def decode_empty(self, key: jax.Array) -> list[int]:
    """The tokens decode_group gives a cluster with no document, drawn without the model.

    Same key, same per-step keys, same utility (all zeros) and the same stop at EOS as the
    padded decode, so the output is identical to it, byte for byte (tested); only the forward
    passes over padded rows are skipped. Needs decodes_empty_without_model.
    """
    if not self.decodes_empty_without_model:
      raise ValueError("An empty cluster's tokens depend on the public row here; decode it.")
    tokens = np.asarray(_documentless_tokens(key, selector=self.selector, T=self.T,
                                             vocab_size=self.lm.config.vocab_size)).tolist()
    for n, t in enumerate(tokens):
      if t in self.lm.eos_ids:
        return tokens[:n + 1]
    return tokens

  def text(self, token_ids: Sequence[int]) -> str:
    return self.lm.decode(token_ids).strip()


def decode_many(predictor: PrivatePredictor, suffixes: dict[int, list[list[int]]],
                key_of: Callable[[int], jax.Array], *,
                before_group: Callable[[list[int]], None] = lambda ids: None,
                after_group: Callable[[dict[int, list[int]]], None] = lambda out: None,
                progress: tqdm.tqdm | None = None,
                paid: dict[int, int] | None = None,
                hint_of: Callable[[int], str] | None = None,
                lead_of: Callable[[int], Sequence[int]] | None = None
                ) -> dict[int, list[int]]:
  """Decodes many clusters, grouped by padded shape and run num_devices x pack_size(rows) at
  a time (a shape's last group packs fewer), in ascending shape order; each shape's compiled
  programs are dropped when the next shape starts (drop_group_programs).

  Args:
    suffixes: cluster id -> its documents' prompt suffixes (`predictor.suffixes`).
    key_of: cluster id -> its PRNG key (keyed by id, so grouping never changes a draw).
    before_group: called with a group's ids before it is decoded (charge the ledger here).
    after_group: called with {id: tokens} once a group is decoded (persist here).
    progress: a tqdm bar advanced per cluster.
    paid: if given, filled with cluster id -> tokens drawn privately (the rest were free public
      tokens of the sparse vector test; without it, every token).
    hint_of: cluster id -> a public text the public row reads in the document's place (e.g.
      the cluster's released keyword); None: the public row reads no document. Public data
      only: it never changes the mechanism's sensitivity.
    lead_of: cluster id -> token ids that every row of the cluster (documents and public row)
      reads after its prompt, as if they were the start of the answer: the cluster's released
      topic terms (synrag.topics); the decoded tokens continue them and do not include them.
      None: no lead.

  Returns:
    cluster id -> token ids of its synthetic text.
  """
  out: dict[int, list[int]] = {}
  by_shape = collections.defaultdict(list)
  hint_of = hint_of or (lambda cid: "")
  lead_of = lead_of or (lambda cid: ())
  if any(lead_of(cid) for cid in suffixes):
    suffixes = {cid: [list(s) + list(lead_of(cid)) for s in rows]
                for cid, rows in suffixes.items()}
  for cid in sorted(suffixes):
    if not suffixes[cid] and predictor.decodes_empty_without_model:
      # No document: the same draws as a padded decode, without its forward passes.
      before_group([cid])
      done = {cid: predictor.decode_empty(key_of(cid))}
      if paid is not None:
        paid[cid] = len(done[cid])
      after_group(done)
      out.update(done)
      if progress is not None:
        progress.update(1)
    else:
      by_shape[predictor.shape_of(suffixes[cid], hint_of(cid), lead_of(cid))].append(cid)
  for number, (shape, ids) in enumerate(sorted(by_shape.items())):
    if number:
      drop_group_programs()
    n = predictor.num_devices * pack_size(shape[0])
    for start in range(0, len(ids), n):
      group = ids[start:start + n]
      before_group(group)
      tokens, group_paid = predictor.decode_group_paid([suffixes[c] for c in group],
                                                       [key_of(c) for c in group], shape,
                                                       [hint_of(c) for c in group],
                                                       [lead_of(c) for c in group])
      done = dict(zip(group, tokens))
      if paid is not None:
        paid.update(zip(group, group_paid))
      after_group(done)
      out.update(done)
      if progress is not None:
        progress.update(len(group))
  return out
