"""Topic terms: a cluster's terms drawn from public lists by peeled exponential
mechanisms over document counts, charged per cluster, and the opening of its text."""

import itertools
import json
import math
import os

import jax
import numpy as np
import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax import private_decode
from dpsynrag_jax.models import load_lm
from dpsynrag_jax.private_decode import PrivatePredictor
from dpsynrag_jax.privacy import accounting
from dpsynrag_jax.privacy import costs
from dpsynrag_jax.synrag import build_config
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import topics
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.synrag.vocabulary import PublicVocabulary
from experiments.configs import medical_synth


def _floored(counts: np.ndarray, epsilon: float) -> np.ndarray:
  u = epsilon * counts
  return np.maximum(u, u.max() - privacy.mechanisms.TOKEN_UTILITY_SPAN)


def _step_log_probs(u: np.ndarray, left: list[int]) -> np.ndarray:
  """log-probabilities over `left` of one exponential mechanism with utilities u."""
  return u[left] - np.logaddexp.reduce(u[left])


def _peeled_log_probs(counts: np.ndarray, epsilon: float, m: int) -> dict[tuple, float]:
  """Exact log-probability of every ordered m-tuple under m exponential mechanisms run one
  after the other without replacement (utility epsilon * floored counts)."""
  u, out = _floored(counts, epsilon), {}
  for picks in itertools.permutations(range(len(counts)), m):
    left, logp = list(range(len(counts))), 0.0
    for j in picks:
      logp += _step_log_probs(u, left)[left.index(j)]
      left.remove(j)
    out[picks] = logp
  return out


@pytest.mark.parametrize("m", [1, 2])
def test_each_step_is_epsilon_bounded_range_for_every_added_document(m):
  """Adding a document (any 0/1 presence row) moves the log-probabilities of each step's
  outcomes, given the terms drawn before, by amounts within a range of epsilon (bounded range:
  epsilon^2/8-zCDP per step, m steps composed), and the m-tuple's by at most m epsilon."""
  rng = np.random.default_rng(0)
  epsilon, worst_range, worst_joint = 0.7, 0.0, 0.0
  for _ in range(60):
    counts = rng.integers(0, 12, size=6).astype(np.float64)
    added = counts + rng.integers(0, 2, size=6)
    u, v = _floored(counts, epsilon), _floored(added, epsilon)
    for drawn in itertools.permutations(range(6), m - 1):
      left = [j for j in range(6) if j not in drawn]
      shift = _step_log_probs(v, left) - _step_log_probs(u, left)
      worst_range = max(worst_range, shift.max() - shift.min())
    before, after = _peeled_log_probs(counts, epsilon, m), _peeled_log_probs(added, epsilon, m)
    worst_joint = max(worst_joint, max(abs(after[k] - before[k]) for k in before))
  assert worst_range <= epsilon + 1e-9 and worst_joint <= m * epsilon + 1e-9
  assert worst_range > 0.5 * epsilon      # the bound is approached, not vacuous


def test_one_shot_gumbel_top_m_draws_the_peeled_distribution():
  counts = np.array([5.0, 3.0, 3.0, 0.0, 1.0])
  epsilon, m, n = 0.6, 2, 20000
  exact = {k: math.exp(v) for k, v in _peeled_log_probs(counts, epsilon, m).items()}
  keys = jax.random.split(jax.random.PRNGKey(3), n)
  draws = np.asarray(jax.vmap(lambda k: privacy.select_top_terms(k, counts, epsilon, m))(keys))
  assert draws.shape == (n, m) and np.all(draws[:, 0] != draws[:, 1])
  seen = {}
  for row in map(tuple, draws.tolist()):
    seen[row] = seen.get(row, 0) + 1
  for outcome, p in exact.items():
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(seen.get(outcome, 0) / n - p) <= 5 * sd + 1e-4, (outcome, p)
  with pytest.raises(ValueError, match="distinct"):
    privacy.select_top_terms(keys[0], counts, epsilon, 6)


def test_term_presence_is_whole_words_ignoring_case_and_overlaps_count():
  docs = ["Vague Fever and a cough.", "feverish", "FEVER!", ""]
  presence = topics.term_presence(docs, ["Fever", "Vague Fever", "Cough"])
  assert presence.tolist() == [[True, True, True], [False, False, False],
                               [True, False, False], [False, False, False]]


def test_specs_leads_and_their_errors(tmp_path):
  groups = topics.parse_spec("medical_synth.diseases:1, medical_synth.symptoms:3")
  assert [(g.source, g.count) for g in groups] == [("medical_synth.diseases", 1),
                                                   ("medical_synth.symptoms", 3)]
  assert len(groups[0].terms) == 100 and topics.total_count(groups) == 4
  assert topics.parse_spec("") == []
  path = tmp_path / "terms.txt"
  path.write_text("alpha\nbeta\n\nalpha\n")
  assert topics.parse_spec(f"{path}:2")[0].terms == ("alpha", "beta")
  for bad, match in [("medical_synth.diseases", "list:count"),
                     ("medical_synth.diseases:0", "list:count"),
                     ("medical_synth.organs:1", "Unknown Medical Synth"),
                     ("no_such_file:1", "neither"), (f"{path}:3", "cannot draw 3")]:
    with pytest.raises(ValueError, match=match):
      topics.parse_spec(bad)
  assert topics.lead_text([["Snurfles"], ["Fever", "Cough"]]) == "Snurfles. Fever, Cough."
  assert topics.lead_text([]) == ""


def test_a_rarest_lead_puts_the_name_first_and_keeps_the_drawn_terms():
  public = PublicVocabulary(["fever", "cough", "diagnosis"], [4.9, 4.5, 4.3])
  drawn = [["fever", "the diagnosis is snurfles", "cough"], ["zorblax", "quibbix"]]
  assert topics.ordered(drawn, "draw", public) == drawn
  # A word no list knows ("snurfles") is rarest; ties (two unknown words) keep the draw.
  assert topics.ordered(drawn, "rarest", public) == [
      ["the diagnosis is snurfles", "cough", "fever"], ["zorblax", "quibbix"]]
  with pytest.raises(ValueError, match="lead_order"):
    topics.ordered(drawn, "alphabetical", public)
  config = medical_synth.get_config("discovered")
  config.generation.lead_order = "rarest"
  assert build_config.resolve(config).generation.lead_order == "rarest"
  config.generation.lead_order = "alphabetical"
  with pytest.raises(build_config.ConfigError, match="lead_order"):
    build_config.resolve(config)


def test_a_pure_cluster_draws_its_disease_and_an_empty_one_draws_uniformly():
  groups = topics.parse_spec("medical_synth.diseases:1")
  docs = [f"The diagnosis is {groups[0].terms[7]}, the treatment rest." for _ in range(40)]
  presences = [topics.term_presence(docs, groups[0].terms)]
  key = jax.random.PRNGKey(0)
  picks = [topics.draw_topic(jax.random.fold_in(key, i), groups, presences, np.arange(40),
                             0.5)[0][0] for i in range(20)]
  assert set(picks) == {groups[0].terms[7]}     # 40 * 0.5 = 20 nats over 99 rivals
  empty = [topics.draw_topic(jax.random.fold_in(key, i), groups, presences,
                             np.arange(0), 0.5)[0][0] for i in range(200)]
  assert len(set(empty)) > 60                   # uniform over 100 names


def test_calibration_with_topic_terms_spends_exactly_the_budget():
  for accountant in privacy.ACCOUNTANTS:
    for eps in (3.0, 5.0, 10.0):
      cal = privacy.calibrate(eps, 1e-3, accountant=accountant, topic_count=4, topic_share=0.5)
      spent = cal.eps_closed_form() if accountant == "closed_form" else cal.eps_rdp()
      assert spent == pytest.approx(eps, abs=1e-6)
      # The terms take half of what each cluster had left after its fixed parts (closed form).
      fixed = accounting.theorem1_rho(10, cal.sigma_h, 5, 0.4, cal.sigma_mu, 1, 0.0, 1.0)
      left = (accounting.eps_to_zcdp(eps, 1e-3) - fixed) / 5
      assert costs.topic_terms_rho(4, cal.eps_topic) == pytest.approx(0.5 * left)
      plain = privacy.calibrate(eps, 1e-3, accountant=accountant)
      assert cal.c < plain.c and plain.eps_topic == 0.0
  with pytest.raises(ValueError, match="topic_share"):
    privacy.calibrate(5.0, 1e-3, topic_count=2, topic_share=1.5)
  with pytest.raises(ValueError, match="nothing is left"):
    privacy.calibrate(0.5, 1e-3, topic_count=2, topic_share=0.5)


def test_openings_only_gives_the_terms_everything_left_and_spends_exactly_the_budget():
  for accountant in privacy.ACCOUNTANTS:
    for eps in (3.0, 5.0, 10.0):
      cal = privacy.calibrate(eps, 1e-3, accountant=accountant, T=0, topic_count=4,
                              topic_share=1.0)
      spent = cal.eps_closed_form() if accountant == "closed_form" else cal.eps_rdp()
      assert spent == pytest.approx(eps, abs=1e-6)
      assert cal.c == 0.0 and cal.paid_tokens == 0
      with_tokens = privacy.calibrate(eps, 1e-3, accountant=accountant, T=30, topic_count=4,
                                      topic_share=0.9)
      assert cal.eps_topic > with_tokens.eps_topic
      if accountant == "closed_form":   # everything each cluster has left, exactly
        fixed = accounting.theorem1_rho(10, cal.sigma_h, 5, 0.4, cal.sigma_mu, 1, 0.0, 1.0)
        left = (accounting.eps_to_zcdp(eps, 1e-3) - fixed) / 5
        assert costs.topic_terms_rho(4, cal.eps_topic) == pytest.approx(left)
  with pytest.raises(ValueError, match="needs generation.topic_terms"):
    privacy.calibrate(5.0, 1e-3, T=0)
  with pytest.raises(ValueError, match="set topic_share=1"):
    privacy.calibrate(5.0, 1e-3, T=0, topic_count=4, topic_share=0.5)
  with pytest.raises(ValueError, match="leaves nothing for the T tokens"):
    privacy.calibrate(5.0, 1e-3, T=30, topic_count=4, topic_share=1.0)


def test_ledger_entry_costs_count_exponential_mechanisms():
  ledger = privacy.PrivacyLedger(10.0, 1e-3, max_clusters_per_document=1)
  entry = ledger.record_topic_terms(3, 4, 0.3)
  assert entry.rho == pytest.approx(4 * 0.3**2 / 8)
  assert accounting.rdp_rho(entry.dp_event()) == pytest.approx(entry.rho)
  with pytest.raises(ValueError, match="topic_terms count must be an integer"):
    privacy.make_entry("topic_terms", {"count": 1.5, "epsilon": 0.3})


@pytest.fixture(scope="module")
def tiny_lm():
  return load_lm("tiny-random")


def test_a_lead_is_read_by_every_row_and_is_not_in_the_output(tiny_lm):
  pp = PrivatePredictor(tiny_lm, c=0.5, tau=1.0, T=6, omega=0.5)   # omega: a public row
  suffixes = pp.suffixes(["Fever and cough.", "Cough, then fever."])
  lead = tiny_lm.encode(["Snurfles. Fever."])[0]
  key = jax.random.PRNGKey(1)
  many = private_decode.decode_many(pp, {0: suffixes}, lambda r: key, lead_of=lambda r: lead)
  with_lead = [s + lead for s in suffixes]
  shape = pp.shape_of(with_lead, "", lead)
  assert many[0] == pp.decode_group([with_lead], [key], shape, None, [lead])[0]
  tokens, _, doc_mask, public_mask = pp.pack_group([with_lead], shape, None, [lead])
  public = tokens[0][public_mask[0]][0]
  public_row = pp.suffixes([""])[0] + lead
  assert public[:len(public_row)].tolist() == public_row
  assert all(r[len(s):len(s) + len(lead)].tolist() == lead
             for r, s in zip(tokens[0][doc_mask[0]], sorted(suffixes, key=len, reverse=True)))
  plain = private_decode.decode_many(pp, {0: suffixes}, lambda r: key)
  assert plain[0] != many[0]   # the continuation depends on the lead


@pytest.mark.slow
def test_a_tiny_build_with_topic_terms_charges_them_and_opens_every_text_with_them(tmp_path):
  config = medical_synth.get_config("tiny")
  config.generation.topic_terms = "medical_synth.diseases:1,medical_synth.symptoms:2"
  wd = wd_lib.Workdir(str(tmp_path))
  # Cut off after one cluster, with the drawn terms lost: the resumed run redraws the same
  # terms from the same keys and charges nothing twice.
  config.runtime.stop_after_clusters = 1
  with pytest.raises(pipeline.PipelineInterrupted):
    pipeline.build_synthetic_db(config, str(tmp_path))
  first = wd_lib.read_json(wd.private_path(pipeline.TOPIC_LEADS))
  os.remove(wd.private_path(pipeline.TOPIC_LEADS))
  config.runtime.stop_after_clusters = -1
  summary = pipeline.build_synthetic_db(config, str(tmp_path))
  leads = wd_lib.read_json(wd.private_path(pipeline.TOPIC_LEADS))
  assert leads == first
  assert summary["eps_closed_form"] == pytest.approx(config.privacy.epsilon, abs=1e-6)
  ledger = json.loads(open(wd.path(wd_lib.LEDGER)).read())
  cal = pipeline.calibration_of(config)
  topic_entries = [e for e in ledger["entries"] if e["kind"] == "topic_terms"]
  assert sorted(e["cluster"] for e in topic_entries) == list(range(config.clustering.R))
  assert all(e["params"] == {"count": 3, "epsilon": cal.eps_topic} for e in topic_entries)
  assert len(leads) == config.clustering.R and all(lead.count(".") >= 2 for lead in leads)
  diseases = set(topics.term_list("medical_synth.diseases"))
  assert all(lead.split(".")[0] in diseases for lead in leads)
  texts = [json.loads(line)["text"] for line in open(wd.path(wd_lib.SYNTHETIC_DB))]
  assert texts and all(any(t.startswith(lead) for lead in leads) for t in texts)


@pytest.mark.slow
def test_an_openings_only_build_releases_the_terms_alone_and_charges_no_token(tmp_path):
  config = medical_synth.get_config("tiny")
  config.generation.topic_terms = "medical_synth.diseases:1,medical_synth.symptoms:2"
  config.generation.T = 0
  config.privacy.topic_share = 1.0
  config.privacy.accountant = "rdp"
  summary = pipeline.build_synthetic_db(config, str(tmp_path))
  wd = wd_lib.Workdir(str(tmp_path))
  assert summary["eps_dp_accounting_rdp"] == pytest.approx(config.privacy.epsilon, abs=1e-6)
  ledger = json.loads(open(wd.path(wd_lib.LEDGER)).read())
  kinds = [e["kind"] for e in ledger["entries"]]
  assert "tokens" not in kinds and kinds.count("topic_terms") == config.clustering.R
  leads = wd_lib.read_json(wd.private_path(pipeline.TOPIC_LEADS))
  texts = [json.loads(line)["text"] for line in open(wd.path(wd_lib.SYNTHETIC_DB))]
  assert sorted(texts) == sorted(leads)
  # The private side reads like any finished build: every cluster with no token after it.
  assert wd.generated() == {r: [] for r in range(config.clustering.R)}


def test_term_presence_matches_terms_that_end_in_punctuation():
  docs = ["She likes Fargo (1996), Star Wars (1977) and Heat.", "Fargo (19962)"]
  presence = topics.term_presence(docs, ["Fargo (1996)", "Star Wars (1977)", "Heat", "Wars"])
  assert presence.tolist() == [[True, True, True, True], [False, False, False, False]]


def test_the_movielens_catalogue_is_every_title_of_the_movie_file(tmp_path):
  from dpsynrag_jax.data import fixtures, movielens  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "ml-100k"
  fixtures.write_movielens_fixture(folder, seed=1)
  titles = topics.term_list(f"movielens.catalogue={folder}")
  task = movielens.load_movielens(folder)
  # Every favourite any document names is in the catalogue, which holds more than the top.
  assert {t for answers in task.doc_answers for t in answers} <= set(titles)
  assert len(titles) > len(task.answer_names) and len(set(titles)) == len(titles)
  assert topics.parse_spec(f"movielens.catalogue={folder}:3")[0].count == 3


@pytest.mark.slow
def test_a_build_with_discovered_terms_charges_the_selection_once_and_draws_from_it(tmp_path):
  config = medical_synth.get_config("tiny")
  config.generation.topic_terms = "discovered:3"
  config.generation.T = 0
  config.privacy.topic_share = 1.0
  config.privacy.rho_terms = 1.0
  wd = wd_lib.Workdir(str(tmp_path))
  # Cut off after the topics, with the discovered terms lost: the resumed run redraws the same
  # terms from the same key and charges the selection once.
  config.runtime.stop_after_rerank = True
  with pytest.raises(pipeline.PipelineInterrupted):
    pipeline.build_synthetic_db(config, str(tmp_path))
  first = wd_lib.read_json(wd.private_path(pipeline.DISCOVERED_TERMS))
  os.remove(wd.private_path(pipeline.DISCOVERED_TERMS))
  config.runtime.stop_after_rerank = False
  summary = pipeline.build_synthetic_db(config, str(tmp_path))
  discovered = wd_lib.read_json(wd.private_path(pipeline.DISCOVERED_TERMS))
  assert discovered == first and discovered == sorted(discovered) and len(discovered) >= 3
  assert summary["eps_closed_form"] == pytest.approx(config.privacy.epsilon, abs=1e-6)
  ledger = json.loads(open(wd.path(wd_lib.LEDGER)).read())
  selections = [e for e in ledger["entries"] if e["kind"] == "partition_selection"]
  cal = pipeline.calibration_of(config)
  assert len(selections) == 1 and selections[0]["cluster"] is None
  assert selections[0]["params"] == {"count": config.discovery.m, "sigma": cal.sigma_terms,
                                     "threshold": cal.terms_threshold}
  assert ledger["totals"]["delta_spent"] == pytest.approx(
      config.privacy.terms_delta_share * config.privacy.delta, rel=1e-9)
  # Every text is three discovered terms, drawn per cluster.
  texts = [json.loads(line)["text"] for line in open(wd.path(wd_lib.SYNTHETIC_DB))]
  assert texts
  for text in texts:
    terms = text.rstrip(".").split(", ")
    assert len(terms) == 3 and set(terms) <= set(discovered)
