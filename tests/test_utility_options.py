"""The utility options beyond the paper: difference clipping and public candidate tokens.

Both keep the token mechanism's sensitivity c, so the ledger of a run is unchanged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpsynrag_jax import privacy
from dpsynrag_jax.models import load_lm
from dpsynrag_jax.synrag import candidates
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.private_decode import PrivatePredictor
from dpsynrag_jax.privacy import PrivateTokenSelector
from experiments.configs import medical_synth


@pytest.fixture(scope="module")
def tiny_lm():
  return load_lm("tiny-random")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 6), c=st.floats(0.01, 3.0))
def test_difference_clipping_moves_each_token_by_at_most_c_per_document(seed, rows, c):
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  logits = 5 * jax.random.normal(k1, (rows + 1, 40))
  reference = 5 * jax.random.normal(k2, (40,))
  logits = logits.at[0, 3].set(-jnp.inf)  # -inf logits are clipped, not dropped
  with_all = privacy.difference_clipped_sum(logits, jnp.ones(rows + 1, bool), reference, c)
  # The neighbour without document 0 (masked out).
  without = privacy.difference_clipped_sum(
      logits, jnp.arange(rows + 1) > 0, reference, c)
  assert np.all(np.isfinite(with_all))
  assert np.max(np.abs(np.asarray(with_all - without))) <= c * (1 + 1e-5)
  del k3


def test_documents_that_agree_with_the_public_row_contribute_nothing():
  reference = jax.random.normal(jax.random.PRNGKey(0), (30,))
  same = jnp.stack([reference + 2.0, reference - 1.0])  # a shift leaves log p unchanged
  out = privacy.difference_clipped_sum(same, jnp.ones(2, bool), reference, 0.5)
  np.testing.assert_allclose(np.asarray(out), 0.0, atol=1e-5)


def test_candidates_restrict_every_draw_to_the_public_top_and_the_term_ids():
  v = 60
  public_row = jnp.arange(v, dtype=jnp.float32)            # public top-3: 59, 58, 57
  docs = jnp.zeros((2, v)).at[:, 5].set(50.0)                # documents push token 5 hard
  logits = jnp.concatenate([docs, public_row[None]])
  doc_mask = jnp.array([True, True, False])
  public_mask = jnp.array([False, False, True])
  restricted = PrivateTokenSelector(c=1.0, tau=0.3, candidates=3, candidate_ids=(11,))
  drawn = {int(restricted(jax.random.PRNGKey(i), logits, (doc_mask, public_mask))[0])
           for i in range(200)}
  assert drawn <= {57, 58, 59, 11} and len(drawn) > 1
  free = PrivateTokenSelector(c=1.0, tau=0.3)
  assert 5 in {int(free(jax.random.PRNGKey(i), logits, (doc_mask, public_mask))[0])
               for i in range(50)}


def test_top_k_plus_admits_exactly_the_tokens_within_the_width_of_the_kth_public_logit():
  v = 60
  public_row = jnp.zeros(v).at[40:44].set(jnp.array([10.0, 9.0, 8.0, 7.5]))
  public_row = public_row.at[20].set(6.6).at[21].set(6.4)  # kth (k = 2) is 9.0
  logits = jnp.concatenate([jnp.zeros((2, v)), public_row[None]])
  aux = (jnp.array([True, True, False]), jnp.array([False, False, True]))
  sel = PrivateTokenSelector(c=1.0, candidates=2, candidate_width=2.5)
  _, mask, _ = sel.utility(logits, aux)
  assert set(np.flatnonzero(np.asarray(mask)).tolist()) == {40, 41, 42, 43, 20}
  drawn = {int(sel(jax.random.PRNGKey(i), logits, aux)[0]) for i in range(300)}
  assert drawn == {40, 41, 42, 43, 20}   # every admitted token reachable, no other


def test_min_length_bans_eos_before_its_step_and_only_then():
  v, eos = 30, 7
  docs = jnp.zeros((2, v)).at[:, eos].set(50.0)           # the documents want to stop at once
  logits = jnp.concatenate([docs, jnp.zeros((1, v))])
  aux = (jnp.array([True, True, False]), jnp.array([False, False, False]))
  sel = PrivateTokenSelector(c=5.0, tau=0.1, min_length=3, eos_ids=(eos,))
  assert sel.stateful
  state = sel.initial_state(jax.random.PRNGKey(0))
  for step in range(5):
    tokens, state = sel.step(jax.random.PRNGKey(step), logits, aux, state)
    assert (int(tokens[0]) == eos) == (step >= 3), step
  with pytest.raises(ValueError, match="step index"):
    sel(jax.random.PRNGKey(0), logits, aux)


def test_min_length_holds_in_the_decode_and_for_empty_clusters(tiny_lm):
  pp = PrivatePredictor(tiny_lm, c=0.1, tau=1.0, T=12, min_length=12)
  assert pp.decodes_empty_without_model
  docs = [pp.suffixes(["a short note"])]
  for seed in range(3):
    key = jax.random.PRNGKey(seed)
    empty = pp.decode_empty(key)
    assert empty == pp.decode_group([[]], [key], pp.shape_of([]))[0]
    assert len(empty) == 12 and not set(empty[:-1]) & set(tiny_lm.eos_ids)
    text = pp.decode_group(docs, [key], pp.shape_of(docs[0]))[0]
    assert len(text) == 12 and not set(text[:-1]) & set(tiny_lm.eos_ids)
  with pytest.raises(ValueError, match="exceeds T"):
    PrivatePredictor(tiny_lm, c=0.1, tau=1.0, T=4, min_length=5)


def test_public_hint_is_refused_where_no_public_row_reads_it(tiny_lm):
  config = medical_synth.get_config("tiny")
  cal = pipeline.calibration_of(config)
  config.generation.public_hint = "keyword"
  with pytest.raises(ValueError, match="public row only"):
    pipeline._predictor(config, cal, tiny_lm)  # pylint: disable=protected-access
  config.generation.public_hint = "title"
  with pytest.raises(ValueError, match="public_hint must be one of"):
    pipeline._predictor(config, cal, tiny_lm)  # pylint: disable=protected-access
  config.generation.public_hint = "keyword"
  config.generation.omega = 0.1
  assert pipeline._predictor(config, cal, tiny_lm).selector.needs_public_row  # pylint: disable=protected-access


def test_selector_refuses_unknown_settings():
  with pytest.raises(ValueError, match="Unknown clipping method"):
    PrivateTokenSelector(c=1.0, method="nope")
  with pytest.raises(ValueError, match="candidates must be"):
    PrivateTokenSelector(c=1.0, candidates=-1)
  with pytest.raises(ValueError, match="candidate_width widens"):
    PrivateTokenSelector(c=1.0, candidate_width=2.0)
  with pytest.raises(ValueError, match="candidate_width must be"):
    PrivateTokenSelector(c=1.0, candidates=3, candidate_width=float("inf"))
  with pytest.raises(ValueError, match="give eos_ids"):
    PrivateTokenSelector(c=1.0, min_length=3)


def test_term_token_ids_cover_the_terms_and_eos():
  lm = load_lm("tiny-random")
  terms = candidates.public_terms("medical_synth")
  assert "Norglesnap Fever" in terms and len(terms) > 100
  ids = candidates.term_token_ids(lm, ["Norglesnap Fever"])
  assert set(lm.encode([" Norglesnap Fever"])[0]) <= set(ids)
  assert set(lm.eos_ids) <= set(ids)
  with pytest.raises(ValueError, match="candidate_terms"):
    candidates.public_terms("no_such_list")
  with pytest.raises(ValueError, match="vocabulary"):
    PrivatePredictor(lm, c=0.1, tau=1.0, T=2, candidates=4, candidate_ids=[10**7])


@pytest.mark.parametrize("overrides", [
    {"clip": "difference"},
    # Every public-data restriction at once (candidates, terms, top-k+, min_length, hint) and
    # the SVT: one tiny build covers them all.
    {"candidates": 8, "candidate_width": 3.0, "candidate_terms": "medical_synth",
     "min_length": 4, "svt_paid": 3, "public_hint": "keyword"},
])
@pytest.mark.slow
def test_options_run_end_to_end_with_the_same_ledger(tmp_path, overrides):
  config = medical_synth.get_config("tiny")
  for field, value in overrides.items():
    config.generation[field] = value
  summary = pipeline.build_synthetic_db(config, str(tmp_path))
  assert abs(summary["eps_closed_form"] - config.privacy.epsilon) < 1e-6
  assert summary["synthetic_texts"] > 0


def test_group_synonyms_joins_close_words_in_rank_order():
  from dpsynrag_jax.synrag import clustering  # pylint: disable=g-import-not-at-top
  e = np.eye(3, dtype=np.float32)
  close = (e[0] + 0.2 * e[1]) / np.linalg.norm(e[0] + 0.2 * e[1])
  embeddings = np.stack([e[0], e[1], close, e[2]])
  assert clustering.group_synonyms(["a", "b", "a2", "c"], embeddings, 0.9) == [[0, 2], [1], [3]]
  assert clustering.group_synonyms(["a", "b", "a2", "c"], embeddings, 1.0) == [[0], [1], [2], [3]]
  with pytest.raises(ValueError, match="threshold"):
    clustering.group_synonyms(["a"], embeddings[:1], 0.0)


def test_grouped_clusters_take_documents_holding_any_word_and_respect_L():
  from dpsynrag_jax.synrag import clustering  # pylint: disable=g-import-not-at-top
  keyword_ids = np.array([[10, 11, -1], [11, 12, -1], [12, -1, -1], [10, 12, 13]])
  top_words = [10, 11, 12]
  plain = clustering.soft_clusters(keyword_ids, top_words, L=2)
  singletons = clustering.soft_clusters(keyword_ids, top_words, L=2, groups=[[10], [11], [12]])
  assert [c.tolist() for c in singletons] == [c.tolist() for c in plain]
  grouped = clustering.soft_clusters(keyword_ids, top_words, L=1, groups=[[10, 11], [12]])
  assert grouped[0].tolist() == [0] and grouped[1].tolist() == [1, 2, 3]
  grouped = clustering.soft_clusters(keyword_ids, top_words, L=2, groups=[[10, 11], [12]])
  assert grouped[0].tolist() == [0, 1, 3]


@pytest.mark.slow
def test_synonym_merging_runs_end_to_end_with_fewer_clusters(tmp_path):
  config = medical_synth.get_config("tiny")
  config.clustering.merge_synonyms = 0.3   # loose, so the tiny run's 6 words must merge
  summary = pipeline.build_synthetic_db(config, str(tmp_path))
  assert summary["clusters"] < config.clustering.R
  assert abs(summary["eps_closed_form"] - config.privacy.epsilon) < 1e-6
