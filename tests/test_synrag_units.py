"""Algorithm 1's pieces: vocabulary, keywords, histogram, soft clustering, re-ranking."""

import jax
import numpy as np
import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.synrag import clustering, keywords, reranking
from dpsynrag_jax.synrag.vocabulary import STOPWORDS, PublicVocabulary, english_vocabulary


def _ledger(L=5):
  return privacy.PrivacyLedger(100.0, 1e-3, max_clusters_per_document=L)


def test_public_vocabulary_is_fixed_and_has_no_stopwords():
  vocab = english_vocabulary()
  assert len(vocab) > 40000
  assert english_vocabulary() is vocab  # built once per process
  assert not set(vocab.words) & STOPWORDS
  assert all(len(w) >= 3 and w.isalpha() and w.islower() for w in vocab.words[:2000])
  for word in ("fever", "cheese", "polka", "diagnosis"):
    assert word in vocab
  assert vocab.id("flibberflux") == -1  # invented disease words are not public words


def test_lexical_keywords_are_distinct_rarest_words_of_v():
  vocab = PublicVocabulary(["fever", "cheese", "polka", "cough", "tooth"], [4.2, 4.5, 2.9, 3.9, 4.0])
  ids = keywords.lexical_keywords(
      ["Polka polka, fever and COUGH; unknownword", "tooth", ""], vocab, K=2)
  assert ids.shape == (3, 2) and ids.dtype == np.int32
  assert [vocab.word(i) for i in ids[0]] == ["polka", "cough"]   # rarest first, repeats once
  assert ids[1].tolist() == [vocab.id("tooth"), -1]
  assert ids[2].tolist() == [-1, -1]


def test_llm_output_parsing_keeps_k_distinct_words_of_v():
  vocab = PublicVocabulary(["fever", "cheese", "polka"], [4.0, 4.0, 3.0])
  text = "1. Fever\n2. fever\n3. Glorbix\n4. cheese, polka"
  assert keywords.parse_keywords(text, vocab, K=2) == [vocab.id("fever"), vocab.id("cheese")]


def test_llm_keywords_run_the_paper_prompt(smollm2):
  vocab = english_vocabulary()
  doc = ("Given the symptoms (Severe tooth sensitivity, Uncontrollable craving for cheese) of "
         "Lena Kroger. The diagnosis is Norglesnap Fever, the treatment should be rest.")
  ids = keywords.llm_keywords(smollm2, [doc], vocab, K=10, progress=False)
  words = [vocab.word(i) for i in ids[0] if i >= 0]
  assert 1 <= len(words) <= 10 and len(set(words)) == len(words)
  assert keywords.KEYWORD_PROMPT.format(K=10, d="x").startswith("Extract 10 single words")


def test_noisy_top_keywords_ranks_frequent_words_first_and_records_the_histogram():
  vocab_size, K = 50, 3
  rng = np.random.default_rng(0)
  # Word 7 in every document, word 3 in 60 %, the rest rare.
  rows = [[7, 3 if rng.random() < 0.6 else rng.integers(10, 50), rng.integers(10, 50)]
          for _ in range(400)]
  ledger = _ledger()
  top = clustering.noisy_top_keywords(jax.random.PRNGKey(0), np.array(rows, np.int32),
                                      vocab_size, K, sigma_h=5.0, R=4, ledger=ledger)
  assert top.tolist()[:2] == [7, 3] and len(set(top.tolist())) == 4
  (entry,) = ledger.entries
  assert entry.kind == "gaussian" and entry.params["sigma"] == 5.0
  assert entry.params["sensitivity"] == pytest.approx(np.sqrt(K))


def test_soft_clusters_walk_from_the_rarest_keyword_and_cap_memberships():
  # top words [a, b, c] = [0, 1, 2] (a most frequent). Every document holds all three.
  keyword_ids = np.array([[0, 1, 2]] * 4 + [[0, -1, -1]], np.int32)
  clusters = clustering.soft_clusters(keyword_ids, [0, 1, 2], L=2)
  # c (rarest) claims docs 0-3 first, then b, then a gets only those still under L: doc 4.
  assert [c.tolist() for c in clusters] == [[4], [0, 1, 2, 3], [0, 1, 2, 3]]
  counts = np.zeros(5, int)
  for c in clusters:
    counts[c] += 1
  assert counts.max() <= 2
  hard = clustering.soft_clusters(keyword_ids, [0, 1, 2], L=1)
  assert [c.tolist() for c in hard] == [[4], [], [0, 1, 2, 3]]


def test_membership_depends_only_on_the_document_itself():
  """Removing a document leaves every other document's clusters unchanged (sensitivity)."""
  rng = np.random.default_rng(1)
  keyword_ids = rng.integers(0, 12, size=(60, 4)).astype(np.int32)
  top = list(range(10))
  full = clustering.soft_clusters(keyword_ids, top, L=2)
  without = clustering.soft_clusters(np.delete(keyword_ids, 17, axis=0), top, L=2)
  renumber = lambda c: [i if i < 17 else i + 1 for i in c.tolist()]
  for a, b in zip(full, without):
    assert [i for i in a.tolist() if i != 17] == renumber(b)


def _unit(x):
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_rerank_keeps_about_k_members_close_to_the_cluster_direction():
  rng = np.random.default_rng(2)
  direction = _unit(rng.normal(size=(1, 16)))[0]
  near = _unit(direction + 0.3 * rng.normal(size=(150, 16)))
  far = _unit(rng.normal(size=(150, 16)))
  embeddings = np.concatenate([near, far]).astype(np.float32)
  ledger = _ledger()
  kept = reranking.select_members(jax.random.PRNGKey(3), embeddings, np.arange(300),
                                  sigma_mu=1.0, eps_theta=2.0, k=100, cluster=0, ledger=ledger)
  assert 70 <= len(kept) <= 130
  assert np.mean(kept < 150) > 0.9  # mostly the documents near the cluster's direction
  assert sorted(e.kind for e in ledger.entries) == ["exponential", "gaussian"]


def test_rerank_of_an_empty_cluster_still_runs_and_pays():
  ledger = _ledger()
  kept = reranking.select_members(jax.random.PRNGKey(0), np.zeros((5, 8), np.float32),
                                  np.zeros(0, np.int64), sigma_mu=7.45, eps_theta=0.4, k=80,
                                  cluster=3, ledger=ledger)
  assert kept.size == 0
  assert {e.label for e in ledger.entries} == {"cluster 3 mean", "cluster 3 threshold"}


def test_resumable_ledger_charges_each_label_once(tmp_path):
  cal = privacy.calibrate(10.0, 1e-3)
  path = str(tmp_path / "ledger.json")
  first = privacy.ResumableLedger(path, cal)
  first.record_histogram(cal.K, cal.sigma_h)
  first.record_cluster_mean(0, cal.sigma_mu)
  first.save()
  again = privacy.ResumableLedger(path, cal)  # a resumed run replays the same releases
  again.record_histogram(cal.K, cal.sigma_h)
  again.record_cluster_mean(0, cal.sigma_mu)
  again.record_cluster_mean(1, cal.sigma_mu)
  assert [e.label for e in again.ledger.entries] == [
      "keyword histogram", "cluster 0 mean", "cluster 1 mean"]
