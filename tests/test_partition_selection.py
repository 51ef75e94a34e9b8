"""Partition selection (term discovery): its threshold against what an added document's own
terms actually reveal, sampled through the mechanism itself, and its delta in both accountants.

The audit would fail a wrong threshold: one that forgot the added document's own count of 1
(threshold sigma * z), or spent delta per term instead of per document, releases an added
document's unique terms far more often than the delta the ledger charges.
"""

import math

import jax
import numpy as np
import pytest
from scipy import stats

from dpsynrag_jax import privacy
from dpsynrag_jax.privacy import costs
from dpsynrag_jax.privacy import partition_selection as ps
from dpsynrag_jax.synrag import discovery
from dpsynrag_jax.synrag.vocabulary import PublicVocabulary


def clopper_pearson(k, n, beta=1e-4):
  lo = stats.beta.ppf(beta / 2, k, n - k + 1) if k else 0.0
  hi = stats.beta.ppf(1 - beta / 2, k + 1, n - k) if k < n else 1.0
  return lo, hi


def test_threshold_and_delta_are_inverse():
  for sigma, m, delta in [(1.0, 1, 0.1), (7.07, 5, 1e-4), (2.5, 3, 1e-9)]:
    threshold = ps.threshold_for(sigma, m, delta)
    assert costs.partition_selection_delta(m, sigma, threshold) == pytest.approx(delta,
                                                                                  rel=1e-9)
  with pytest.raises(ValueError):
    ps.threshold_for(1.0, 0, 0.1)
  with pytest.raises(ValueError):
    ps.threshold_for(1.0, 2, 1.0)


def test_sampled_audit_of_an_added_documents_unique_terms():
  """D: 20 documents proposing shared terms; D' = D + x, x proposing m terms nobody else does.
  Released(x's terms) happens with probability delta_t exactly; sampled 6000 times through
  select_partitions, its Clopper-Pearson interval must hold the claimed delta and exclude what
  the two wrong thresholds would give."""
  sigma, m, delta_t = 1.0, 3, 0.2
  threshold = ps.threshold_for(sigma, m, delta_t)
  shared = [[f"shared{j}" for j in range(m)] for _ in range(20)]
  x = [f"unique{j}" for j in range(m)]
  counts = ps.document_counts(shared + [x], m)
  trials, hits = 6000, 0
  keys = jax.random.split(jax.random.PRNGKey(0), trials)
  for key in keys:
    released = ps.select_partitions(key, counts, sigma, threshold)
    hits += any(t.startswith("unique") for t in released)
    # Shared terms (count 20) are far above the threshold: released every time.
    assert sum(t.startswith("shared") for t in released) == m
  lo, hi = clopper_pearson(hits, trials)
  assert lo <= delta_t <= hi
  forgot_own_count = 1 - stats.norm.cdf((threshold - 1 - 1) / sigma)**m
  per_term_delta = 1 - stats.norm.cdf((ps.threshold_for(sigma, 1, delta_t) - 1) / sigma)**m
  for wrong in (forgot_own_count, per_term_delta):
    assert wrong > hi


def test_proposals_over_m_are_refused():
  with pytest.raises(ValueError, match="at most m = 2"):
    ps.document_counts([["a", "b", "c"]], 2)
  with pytest.raises(ValueError, match="distinct"):
    ps.document_counts([["a", "a"]], 2)


def test_the_release_is_alphabetical_and_keyed():
  counts = {"zeta": 50, "alpha": 50, "mid": 50, "rare": 1}
  key = jax.random.PRNGKey(3)
  released = ps.select_partitions(key, counts, 1.0, ps.threshold_for(1.0, 2, 1e-6))
  assert released == ["alpha", "mid", "zeta"]
  assert ps.select_partitions(key, counts, 1.0, 10.0) == ps.select_partitions(key, counts, 1.0,
                                                                              10.0)


@pytest.mark.parametrize("accountant", ["closed_form", "rdp"])
def test_the_ledger_converts_at_the_delta_left(accountant):
  sigma, m = 3.0, 4
  threshold = ps.threshold_for(sigma, m, 2e-4)
  ledger = privacy.PrivacyLedger(100.0, 1e-3, accountant=accountant)
  ledger.record_histogram(10, 7.0)
  plain = ledger.spent_epsilon(accountant)
  entry = ledger.record_partition_selection(m, sigma, threshold)
  assert entry.rho == pytest.approx(m / (2 * sigma**2))
  assert ledger.delta_spent == pytest.approx(2e-4, rel=1e-9)
  rho = 10 / (2 * 49.0) + m / (2 * sigma**2)
  if accountant == "closed_form":
    assert ledger.spent_epsilon() == pytest.approx(privacy.zcdp_to_eps(rho, 8e-4), rel=1e-12)
  assert ledger.spent_epsilon() > plain
  # The ledger file round-trips with its delta; an edited delta is refused.
  again = privacy.PrivacyLedger.from_json(ledger.to_json())
  assert again.delta_spent == ledger.delta_spent
  assert "partition_selection" in ledger.to_json()
  edited = ledger.to_json().replace('"delta": 0.0002', '"delta": 0.00001')
  if edited != ledger.to_json():
    with pytest.raises(ValueError, match="delta"):
      privacy.PrivacyLedger.from_json(edited)
  # A selection spending all of delta leaves nothing to convert at: refused.
  full = privacy.PrivacyLedger(100.0, 1e-3, accountant=accountant)
  with pytest.raises(privacy.BudgetExceededError):
    full.record_partition_selection(m, sigma, ps.threshold_for(sigma, m, 1e-3))


def test_calibration_spends_the_budget_with_discovery():
  for accountant in ("closed_form", "rdp"):
    cal = privacy.calibrate(5.0, 1e-3, T=0, topic_count=4, topic_share=1.0,
                            accountant=accountant, terms_m=5, rho_terms=0.05,
                            delta_terms=1e-4)
    assert cal.delta_terms == pytest.approx(1e-4, rel=1e-9)
    assert cal.sigma_terms == pytest.approx(math.sqrt(5 / 0.1))
    spent = cal.eps_closed_form() if accountant == "closed_form" else cal.eps_rdp()
    assert spent == pytest.approx(5.0, abs=1e-6)
    without = privacy.calibrate(5.0, 1e-3, T=0, topic_count=4, topic_share=1.0,
                                accountant=accountant)
    assert cal.eps_topic < without.eps_topic


def test_phrases_and_proposals_read_one_document():
  text = ("Given the symptoms (Severe headaches, Skin lesions) of Ann Lee. The diagnosis is "
          "Burpitis Globulosa, the treatment should be Blergon Splints.")
  assert discovery.phrases(text) == ["given", "symptoms", "severe headaches", "skin lesions",
                                     "ann lee", "diagnosis", "burpitis globulosa",
                                     "treatment", "blergon splints"]
  assert discovery.phrases("alpha beta gamma delta epsilon", max_n=2) == [
      "alpha beta", "gamma delta", "epsilon"]
  vocab = PublicVocabulary(["given", "symptoms", "severe", "headaches", "skin", "lesions",
                            "diagnosis", "treatment", "ann", "lee"],
                           [5.0, 4.5, 4.0, 3.5, 4.8, 3.0, 4.2, 5.0, 4.4, 4.3])
  got = discovery.proposals(text, vocab, 3)
  # Words no list knows (the names) are rarest; then the rarest known word.
  assert set(got[:2]) == {"burpitis globulosa", "blergon splints"}
  assert got[2] == "skin lesions"
  presence = discovery.presence([got, ["skin lesions"]], ["skin lesions", "diagnosis"])
  np.testing.assert_array_equal(presence, [[True, False], [True, False]])


def test_clauses_keep_their_framing_and_key_the_keyword_vocabulary():
  text = ("Given the symptoms (Vague Fever, Nasal Whistling) of Frieda Klein. The diagnosis is "
          "Flibberjibits Syndrome, the treatment should be Blergon Splints.")
  got = discovery.clauses(text, max_n=8)
  assert got == ["given the symptoms", "vague fever", "nasal whistling", "of frieda klein",
                 "the diagnosis is flibberjibits syndrome", "the treatment should be blergon splints"]
  assert discovery.candidates(text, "clauses", 3)[4:6] == ["the diagnosis is",
                                                            "flibberjibits syndrome"]
  with pytest.raises(ValueError, match="discovery.unit"):
    discovery.candidates(text, "sentences")
  public = PublicVocabulary(["diagnosis", "fever"], [4.3, 4.0])
  # Function words do not make a clause rare: its rarest content word does.
  assert discovery.rarity("the diagnosis is", public) == pytest.approx(4.3)
  vocab = discovery.vocabulary_of(["vague fever", "the diagnosis is flibberjibits syndrome"],
                                  public)
  ids = discovery.keyword_ids([["the diagnosis is flibberjibits syndrome", "of frieda klein",
                                "vague fever"], []], vocab, 4)
  np.testing.assert_array_equal(ids, [[1, 0, -1, -1], [-1, -1, -1, -1]])
  with pytest.raises(ValueError, match="released no term"):
    discovery.vocabulary_of([], public)


def test_the_names_unit_proposes_capitalised_runs_first():
  text = ("Napoleon died on Saint Helena, a remote volcanic island; historians still debate "
          "the arsenic theory.")
  assert discovery.names(text) == ["napoleon", "saint helena"]
  # A function word ends a name, as it ends a run.
  assert discovery.names("Sir Isaac Newton Was Born", max_n=2) == ["sir isaac", "newton", "born"]
  # A name inside a longer run ("napoleon died") is a candidate of its own.
  assert discovery.candidates(text, "names") == ["napoleon", "saint helena"] + (
      discovery.candidates(text, "runs"))
  vocab = PublicVocabulary(["napoleon", "saint", "helena", "died", "remote", "volcanic",
                            "island", "historians", "still", "debate", "arsenic", "theory"],
                           [4.0, 4.5, 4.2, 5.0, 4.4, 3.6, 4.8, 3.9, 5.5, 4.6, 3.1, 4.7])
  # Rarest first passes over the common name for the snippet's rare incidental words...
  assert discovery.proposals(text, vocab, 2, unit="runs") == ["arsenic theory",
                                                              "remote volcanic island"]
  # ...which the names unit proposes only after the names (rarest first among them).
  assert discovery.proposals(text, vocab, 3, unit="names") == ["napoleon", "saint helena",
                                                               "arsenic theory"]
