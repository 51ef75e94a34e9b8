"""The private decode: prompts, padding, the token mechanism, and self-filtering."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynrag_jax.models import inference, load_lm
from dpsynrag_jax.synrag import self_filter
from dpsynrag_jax import private_decode
from dpsynrag_jax.private_decode import PrivatePredictor
from dpsynrag_jax.privacy import PrivateTokenSelector

NOTE = ("Given the symptoms (Severe tooth sensitivity, Uncontrollable craving for cheese, Sudden "
        "urge to dance the polka) of Lena Kroger. The diagnosis is Norglesnap Fever, the "
        "treatment should be GlitterBombix injection.")


@pytest.fixture(scope="module")
def tiny_lm():
  return load_lm("tiny-random")


def test_shared_prefix_plus_suffix_is_the_whole_prompt(tiny_lm):
  pp = PrivatePredictor(tiny_lm, c=0.1, tau=1.0, T=4)
  docs = [NOTE, "x", "Document with\nnewlines."]
  full = tiny_lm.encode([tiny_lm.chat_prompt(pp.prompt.format(d=d)) for d in docs])
  assert len(pp.prefix) > 10
  for f, s in zip(full, pp.suffixes(docs)):
    assert pp.prefix + s == f


def test_padded_rows_contribute_nothing(tiny_lm):
  """Garbage in masked rows leaves the sampled tokens unchanged (same shapes, same key)."""
  pp = PrivatePredictor(tiny_lm, c=0.3, tau=1.0, T=6)
  suffixes = pp.suffixes([NOTE, NOTE.replace("Lena", "Ana"), "short"])
  shape = pp.shape_of(suffixes)
  packed = pp.pack_group([suffixes], shape)
  garbage = [a.copy() for a in packed]
  rng = np.random.default_rng(0)
  garbage[0][0, 3:] = rng.integers(0, 49152, size=garbage[0][0, 3:].shape)
  garbage[1][0, 3:] = shape[1]  # padded rows claim full length
  key = [jax.random.PRNGKey(5)]
  clean, dirty = pp.decode_arrays(packed, key), pp.decode_arrays(garbage, key)
  np.testing.assert_array_equal(clean[0], dirty[0])


def test_selector_broadcasts_one_token_and_ignores_masked_rows():
  logits = jax.random.normal(jax.random.PRNGKey(0), (4, 50))
  selector = PrivateTokenSelector(c=0.5, tau=0.01)
  doc_mask = jnp.array([True, True, False, False])
  public = jnp.zeros(4, bool)
  tokens = selector(jax.random.PRNGKey(1), logits, (doc_mask, public))
  assert tokens.shape == (4,) and len(set(np.asarray(tokens).tolist())) == 1
  altered = logits.at[2:].set(1e6)
  assert np.array_equal(tokens, selector(jax.random.PRNGKey(1), altered, (doc_mask, public)))
  # The public row moves the choice only through omega.
  prior = PrivateTokenSelector(c=0.5, tau=0.01, omega=10.0)
  public = jnp.array([False, False, True, False])
  favourite = jnp.zeros((4, 50)).at[2, 17].set(100.0)
  assert int(prior(jax.random.PRNGKey(2), favourite, (doc_mask, public))[0]) == 17


@dataclasses.dataclass(frozen=True)
class _Always:
  token: int

  def __call__(self, key, logits, aux):
    return jnp.full(logits.shape[:1], self.token, jnp.int32)


def test_eos_ends_the_text_early(tiny_lm):
  logits, cache = tiny_lm.prefill([[5, 6, 7]], capacity=32)
  tokens, lengths = inference.decode_loop(
      tiny_lm.params, tiny_lm.config, tiny_lm.dtype, cache, logits, jax.random.PRNGKey(0),
      max_new_tokens=8, select=_Always(tiny_lm.eos_ids[0]), eos_ids=tiny_lm.eos_ids,
      pad_id=tiny_lm.pad_id)
  assert int(lengths[0]) == 1
  assert np.asarray(tokens)[0, 1:].tolist() == [tiny_lm.pad_id] * 7


def test_agreeing_documents_come_through_with_a_real_model(smollm2):
  """16 copies of one note and a generous c: the private text carries the note's diagnosis."""
  pp = PrivatePredictor(smollm2, c=1.0, tau=1.0, T=48)
  suffixes = pp.suffixes([NOTE] * 16)
  (tokens,) = pp.decode_group([suffixes], [jax.random.PRNGKey(0)], pp.shape_of(suffixes))
  text = pp.text(tokens)
  assert "Norglesnap" in text, text


class _FakeLM:
  """encode / next_token_logits of a model that says YES exactly when the text has 'pox'."""

  def encode(self, texts):
    return [[{"YES": 1, "Yes": 2, "yes": 3, "NO": 4, "No": 5, "no": 6}.get(t.strip(), 9)]
            for t in texts]

  def next_token_logits(self, prompts, batch_size=32):
    out = np.zeros((len(prompts), 10), np.float32)
    for i, p in enumerate(prompts):
      out[i, 2 if "pox" in p else 5] = 3.0
    return out


def test_self_filter_keeps_yes_answers():
  keep = self_filter.self_filter(_FakeLM(), ["has Wigglepox", "nothing here"],
                                 self_filter.FILTER_PROMPTS["medical"])
  assert keep.tolist() == [True, False]
  with pytest.raises(ValueError, match=r"\{y\}"):
    self_filter.self_filter(_FakeLM(), ["x"], "no slot")


def test_self_filter_runs_the_paper_prompt_on_a_real_model(smollm2):
  odds = self_filter.yes_no_log_odds(smollm2, [NOTE, "Apples are red."],
                                     self_filter.FILTER_PROMPTS["medical"])
  assert odds.shape == (2,) and np.all(np.isfinite(odds))


def test_clusters_in_the_same_buckets_share_compiled_programs(tiny_lm):
  """A second cluster of another size and other prompt lengths, in the same row / length /
  chunk buckets, traces nothing new; a cluster in a longer bucket does."""
  pp = PrivatePredictor(tiny_lm, c=0.3, tau=1.0, T=3)
  first = pp.suffixes([NOTE] * 20)
  second = pp.suffixes([NOTE.replace("Lena Kroger", "Al")] * 18 + [NOTE[:150]] * 3)
  assert pp.shape_of(first) == pp.shape_of(second)
  pp.decode_group([first], [jax.random.PRNGKey(0)], pp.shape_of(first))
  before = dict(inference.TRACE_COUNTS)
  pp.decode_group([second], [jax.random.PRNGKey(1)], pp.shape_of(second))
  assert {k: inference.TRACE_COUNTS[k] - before.get(k, 0)
          for k in ("private_prefill", "private_decode")} == {"private_prefill": 0,
                                                             "private_decode": 0}
  longer = pp.suffixes([NOTE + " " + NOTE] * 20)
  pp.decode_group([longer], [jax.random.PRNGKey(2)], pp.shape_of(longer))
  assert inference.TRACE_COUNTS["private_decode"] - before["private_decode"] == 1


def test_programs_of_a_few_shapes_are_kept_and_a_dropped_one_rebuilds_identically(tiny_lm):
  """A build visits many shapes once each: only the last PROGRAMS_KEPT shapes' programs stay
  in memory, and a shape decoded again after its programs were dropped traces them again
  and draws the same tokens."""
  pp = PrivatePredictor(tiny_lm, c=0.3, tau=1.0, T=3)
  key = jax.random.PRNGKey(0)
  bucket = private_decode.ROW_BUCKET
  clusters = [pp.suffixes([NOTE] * (1 + bucket * i))
              for i in range(private_decode.PROGRAMS_KEPT + 2)]
  assert len({pp.shape_of(c) for c in clusters}) == len(clusters)
  first = pp.decode_group([clusters[0]], [key], pp.shape_of(clusters[0]))
  for cluster in clusters[1:]:
    pp.decode_group([cluster], [key], pp.shape_of(cluster))
  assert (private_decode._decode_program.cache_info().currsize  # pylint: disable=protected-access
          <= private_decode.PROGRAMS_KEPT)
  before = inference.TRACE_COUNTS["private_decode"]
  assert pp.decode_group([clusters[0]], [key], pp.shape_of(clusters[0])) == first
  assert inference.TRACE_COUNTS["private_decode"] - before == 1


def test_decode_many_keeps_only_the_current_shapes_programs(tiny_lm):
  """decode_many visits each shape once, in order: when it moves to the next shape, the last
  one's programs go (the largest clusters decode beside no other shape's programs), and every
  cluster draws what it draws decoded alone."""
  pp = PrivatePredictor(tiny_lm, c=0.3, tau=1.0, T=3)
  bucket = private_decode.ROW_BUCKET
  clusters = {i: pp.suffixes([NOTE] * (1 + bucket * i)) for i in range(3)}
  assert len({pp.shape_of(c) for c in clusters.values()}) == 3
  key_of = lambda r: jax.random.fold_in(jax.random.PRNGKey(4), r)
  alone = {r: pp.decode_group([c], [key_of(r)], pp.shape_of(c))[0]
           for r, c in clusters.items()}
  before = inference.TRACE_COUNTS["private_decode"]
  assert private_decode.decode_many(pp, clusters, key_of) == alone
  # The first shape's programs were cached by decode_group above and used; the next two
  # shapes' too, but each was dropped when decode_many moved on, so it traced them again.
  assert inference.TRACE_COUNTS["private_decode"] - before == 2
  for program in (private_decode._decode_program,   # pylint: disable=protected-access
                  private_decode._prefill_program, private_decode._empty_program):  # pylint: disable=protected-access
    assert program.cache_info().currsize == 1


@dataclasses.dataclass(frozen=True)
class _FirstRowEnds:
  """Row 0 emits EOS at once; every other row keeps emitting `other`."""
  eos: int
  other: int

  def __call__(self, key, logits, aux):
    rows = jnp.arange(logits.shape[0])
    return jnp.where(rows == 0, self.eos, self.other).astype(jnp.int32)


def test_batch_padding_rows_start_done_so_eos_ends_the_loop(tiny_lm, monkeypatch):
  logits, cache = tiny_lm.prefill([[5, 6, 7]], capacity=32)   # batch padded to 8 rows
  padding = jnp.arange(logits.shape[0]) >= 1
  tokens, lengths = inference.decode_loop(
      tiny_lm.params, tiny_lm.config, tiny_lm.dtype, cache, logits, jax.random.PRNGKey(0),
      max_new_tokens=8, select=_FirstRowEnds(tiny_lm.eos_ids[0], 9), eos_ids=tiny_lm.eos_ids,
      pad_id=tiny_lm.pad_id, padding=padding)
  assert int(lengths[0]) == 1
  assert np.all(np.asarray(tokens)[1:] == tiny_lm.pad_id)   # the loop stopped after one step
  # generate() marks its batch padding that way.
  seen = []
  original = inference.decode_loop

  def spy(*args, **kwargs):
    seen.append(np.asarray(kwargs["padding"]))
    return original(*args, **kwargs)

  monkeypatch.setattr(inference, "decode_loop", spy)
  tiny_lm.generate(["a", "b", "c"], max_new_tokens=2)
  assert seen and seen[0].tolist() == [False] * 3 + [True] * 5


def test_an_empty_cluster_is_drawn_without_the_model_and_identically(tiny_lm):
  pp = PrivatePredictor(tiny_lm, c=0.1, tau=1.0, T=12)
  assert pp.decodes_empty_without_model
  for seed in range(3):
    key = jax.random.PRNGKey(seed)
    assert pp.decode_empty(key) == pp.decode_group([[]], [key], pp.shape_of([]))[0]
  prior = PrivatePredictor(tiny_lm, c=0.1, tau=1.0, T=4, omega=0.1)
  assert not prior.decodes_empty_without_model   # the public row must be decoded
  with pytest.raises(ValueError, match="public row"):
    prior.decode_empty(jax.random.PRNGKey(0))


@pytest.mark.slow
def test_dp_rag_questions_of_any_length_share_compiled_programs(tiny_lm):
  """DP-RAG's shared prefix ends before the question, so questions of different lengths
  trace nothing new (each new prefix length used to compile new programs, until the CPU's
  JIT code memory ran out), and every row still reads the whole prompt, token for token."""
  from dpsynrag_jax.baselines.dp_rag import answer_template  # pylint: disable=g-import-not-at-top
  pp = PrivatePredictor(tiny_lm, c=0.3, tau=1.0, T=3)
  questions = ["What is my disease?", "Who is the patient diagnosed with Snurflesinus?",
               "Question: is this a question?"]
  for i, q in enumerate(questions):
    per_question = pp.with_prompt(answer_template(q), shared_until="Question:")
    whole = pp.with_prompt(answer_template(q))
    assert per_question.prefix == pp.with_prompt(answer_template("x"), "Question:").prefix
    rows = per_question.suffixes([NOTE] * 5)
    assert per_question.prefix + rows[0] == whole.prefix + whole.suffixes([NOTE])[0]
    if i == 1:
      before = dict(inference.TRACE_COUNTS)
    # The same buckets for all three: 5 rows fill one row bucket.
    assert per_question.shape_of(rows) == (private_decode.ROW_BUCKET, 96)
    per_question.decode_group([rows], [jax.random.PRNGKey(i)], per_question.shape_of(rows))
  assert {k: inference.TRACE_COUNTS[k] - before.get(k, 0)
          for k in ("private_prefill", "private_decode")} == {"private_prefill": 0,
                                                             "private_decode": 0}
  with pytest.raises(ValueError, match="shared_until"):
    pp.with_prompt(answer_template("q"), shared_until="Document:x")


def _clusters_of_one_shape(pp, count):
  """`count` clusters of different documents and sizes, all in one padded shape."""
  names = ["Lena Kroger", "Al", "Bo Kim", "Cy Diaz", "Di Ho", "Ed Li", "Fu Ma"]
  clusters = [pp.suffixes([NOTE.replace("Lena Kroger", names[(i + j) % len(names)])
                           for j in range(2 + i % 3)]) for i in range(count)]
  assert len({pp.shape_of(c) for c in clusters}) == 1
  return clusters


@pytest.mark.parametrize("options", [
    dict(),                                           # the paper's mechanism
    dict(min_length=2, omega=0.5),                    # stateful, with a public row
    dict(svt=dict(threshold=0.5, epsilon_test=1.0, paid=2)),   # sparse vector test
])
def test_packed_clusters_draw_what_they_draw_alone(tiny_lm, monkeypatch, options):
  """Clusters packed several to a batch (pack_size) draw the same tokens, stop at the same
  EOS and pay the same tokens as each decoded alone with its key: packing changes the batch,
  not any cluster's arithmetic or randomness. EOS is made likely so that clusters of a pack end
  at different steps (the ended ones must keep their text and their paid count)."""
  eos = tuple(range(0, tiny_lm.config.vocab_size, 3))   # a third of the vocabulary ends a text
  lm = type(tiny_lm)(tiny_lm.config, tiny_lm.params, tiny_lm.tokenizer, tiny_lm.dtype,
                     eos_ids=eos, source=tiny_lm.source)
  pp = PrivatePredictor(lm, c=0.5, tau=1.0, T=6, **options)
  clusters = _clusters_of_one_shape(pp, 7)
  shape = pp.shape_of(clusters[0])
  key_of = lambda r: jax.random.fold_in(jax.random.PRNGKey(11), r)
  alone = [pp.decode_group_paid([c], [key_of(r)], shape) for r, c in enumerate(clusters)]
  monkeypatch.setattr(private_decode, "PACK_ROWS", 3 * shape[0])   # packs of 3, 3, then 1
  assert private_decode.pack_size(shape[0]) == 3
  paid = {}
  before = inference.TRACE_COUNTS["private_decode"]
  packed = private_decode.decode_many(pp, dict(enumerate(clusters)), key_of, paid=paid)
  # Packs of 3 are one new program; the last pack of 1 is the lone clusters' program.
  assert inference.TRACE_COUNTS["private_decode"] - before == 1
  assert [packed[r] for r in range(7)] == [tokens[0] for tokens, _ in alone]
  assert [paid[r] for r in range(7)] == [p[0] for _, p in alone]
  lengths = {len(packed[r]) for r in range(7)}
  assert len(lengths) > 1, "the clusters should end at different steps"
