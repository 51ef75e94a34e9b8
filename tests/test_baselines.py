"""Every evaluation method behind one interface, on a tiny random model and real MiniLM retrieval."""

import math

import numpy as np
import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.baselines import DPRAG, RAG, AugPE, DPSynRAG, DPSynth, NonRAG
from dpsynrag_jax.data.tasks import load_task
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag import metrics
from experiments.configs import medical_synth


@pytest.fixture(scope="module")
def models():
  return load_lm("tiny-random"), load_encoder("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def task():
  return load_task("medical", num_documents=150, num_validation=0, num_test=6)


def _questions(task):
  return [q.text for q in task.test]


def test_non_rag_spends_nothing_and_sees_nothing(models, task):
  lm, _ = models
  method = NonRAG(lm, max_new_tokens=4)
  method.build()
  out = method.answer(_questions(task))
  assert len(out.answers) == 6 and all(c == [] for c in out.contexts)
  assert method.epsilon == 0.0


def test_rag_retrieves_the_right_notes(models, task):
  lm, encoder = models
  method = RAG(lm, encoder, task, max_new_tokens=4)
  method.build()
  out = method.answer(_questions(task))
  assert all(len(c) == task.top_k for c in out.contexts)
  recall = metrics.context_recall(out.contexts, [q.answers for q in task.test], task.matches)
  assert recall >= 0.5  # MiniLM finds notes of the asked disease among 150
  assert math.isinf(method.epsilon)


@pytest.mark.slow
def test_dp_synth_spends_its_budget_once_over_disjoint_batches(models, task):
  lm, encoder = models
  method = DPSynth(lm, encoder, task, epsilon=10.0, T=6, num_batches=3,
                   self_filter_enabled=False, max_new_tokens=4)
  method.build()
  assert len(method.synthetic_texts) <= 3  # 3 batches, one text each
  assert method.epsilon == pytest.approx(10.0, rel=1e-9)
  assert method.c == pytest.approx(math.sqrt(2 * privacy.eps_to_zcdp(10.0, 1e-3) / 6))
  out = method.answer(_questions(task))
  assert len(out.answers) == 6


@pytest.mark.slow
def test_dp_synth_resumes_from_its_checkpoint_with_the_same_texts(models, task, tmp_path,
                                                                  monkeypatch):
  lm, encoder = models
  # Seeded: the fresh run, without a checkpoint, draws what the resumed one does.
  make = lambda: DPSynth(lm, encoder, task, epsilon=10.0, T=6, num_batches=4,
                         self_filter_enabled=False, max_new_tokens=4, noise="seeded")
  fresh = make()
  fresh.build()
  # A run killed after its first group: the checkpoint holds batch 0 only.
  first = make()
  first.checkpoint_dir = str(tmp_path)
  from dpsynrag_jax.baselines import dp_synth  # pylint: disable=g-import-not-at-top
  original = dp_synth.decode_many

  def killed(predictor, suffixes, key_of, **kwargs):
    original(predictor, {b: suffixes[b] for b in sorted(suffixes)[:1]}, key_of, **kwargs)
    raise KeyboardInterrupt

  monkeypatch.setattr(dp_synth, "decode_many", killed)
  with pytest.raises(KeyboardInterrupt):
    first.build()
  monkeypatch.setattr(dp_synth, "decode_many", original)
  path = tmp_path / "dp_synth_tokens.jsonl"
  assert len(path.read_text().splitlines()) == 1
  resumed = make()
  resumed.checkpoint_dir = str(tmp_path)
  resumed.build()
  assert resumed.synthetic_texts == fresh.synthetic_texts
  assert len(path.read_text().splitlines()) == 4
  assert resumed.epsilon == pytest.approx(10.0, rel=1e-9)   # charged once, not per attempt
  other = DPSynth(lm, encoder, task, epsilon=5.0, T=6, num_batches=4,
                  self_filter_enabled=False, max_new_tokens=4, noise="seeded")
  other.checkpoint_dir = str(tmp_path)
  with pytest.raises(ValueError, match="other documents or settings"):
    other.build()


@pytest.mark.slow
def test_dp_rag_splits_the_budget_over_planned_queries(models, task):
  lm, encoder = models
  method = DPRAG(lm, encoder, task, epsilon_total=10.0, num_queries=3, k=8, T=4)
  method.build()
  out = method.answer(_questions(task)[:3])
  assert len(out.answers) == 3
  assert method.epsilon == pytest.approx(10.0, rel=1e-6)
  # The threshold lands near k = 8 or, about a quarter of the time at this eps_r (0.77), in the
  # wide interval above every score (cosines stay below ~0.7), which selects no document.
  assert all(len(c) <= 40 for c in out.contexts) and any(len(c) >= 1 for c in out.contexts)
  with pytest.raises(privacy.BudgetExceededError):
    method.answer(_questions(task)[3:4])
  more = DPRAG(lm, encoder, task, epsilon_total=10.0, num_queries=30, k=8, T=4)
  assert more.c < method.c and more.eps_r < method.eps_r  # more questions, less per question


@pytest.mark.slow
def test_dp_synrag_method_builds_once_and_reads_only_the_release(models, tmp_path):
  lm, encoder = models
  config = medical_synth.get_config("tiny")
  method = DPSynRAG(lm, encoder, config, str(tmp_path), top_k=3, max_new_tokens=4)
  method.build()
  assert method.epsilon == pytest.approx(config.privacy.epsilon, rel=1e-9)
  texts = method.synthetic_texts
  assert texts
  again = DPSynRAG(lm, encoder, config, str(tmp_path), top_k=3, max_new_tokens=4)
  again.build()  # reuses the finished build
  assert again.synthetic_texts == texts
  out = again.answer(["What is my disease?"])
  assert len(out.contexts[0]) == min(3, len(texts))


@pytest.mark.slow
def test_aug_pe_votes_privately_and_evolves_the_population(models, task):
  lm, encoder = models
  method = AugPE(lm, encoder, task, epsilon=10.0, population=8, iterations=2,
                 max_new_tokens=6, answer_tokens=4)
  method.build()
  assert 1 <= len(method.synthetic_texts) <= 8
  assert method.epsilon == pytest.approx(10.0, rel=1e-9)
  assert [e.label for e in method.ledger.entries] == ["round 1 votes", "round 2 votes"]
  assert len(method.answer(_questions(task)[:2]).answers) == 2


def test_metrics():
  golds = [["Wigglepox"], ["Zonkitis", "Zonk"]]
  assert metrics.accuracy(["It is wigglepox.", "No idea"], golds,
                          lambda t, a: any(x.lower() in t.lower() for x in a)) == 0.5
  contexts = [["note about Wigglepox"], ["other", "Zonk fever"]]
  assert metrics.context_recall(contexts, golds,
                                lambda t, a: any(x.lower() in t.lower() for x in a)) == 1.0
  assert metrics.leakage(["Ana Ruiz has it", "nobody", "ANA RUIZ again"], ["Ana Ruiz"]) == 2
  assert metrics.leaked_names("Ana Ruiz and Bo Li", ["Bo Li", "Cy Xu"]) == ["Bo Li"]
  assert np.isnan(metrics.accuracy([], [], lambda t, a: True))


@pytest.mark.slow
@pytest.mark.parametrize("noise", ["seeded", "secret"])
def test_an_interrupted_dp_rag_run_resumes_to_the_uninterrupted_answers(models, task, tmp_path,
                                                                         monkeypatch, noise):
  """The answer log: a run killed after two chunks continues from the third, charging the
  logged questions and using up their keys, so answers, contexts and epsilon equal one
  uninterrupted run's, and no question is asked twice. With secret noise, the sessions share
  the secret kept in their checkpoint folder (the private answer log's, as evaluate_method
  sets it), which is what makes the resumed session the interrupted one."""
  from dpsynrag_jax import evaluation  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.evaluation import scoring  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(scoring, "ANSWER_CHUNK", 2)   # read where answer_resumably is defined
  lm, encoder = models
  questions = _questions(task)   # 6: three chunks

  embeddings = encoder.embed(list(task.documents))   # shared: each method would embed again

  def dp_rag():
    method = DPRAG(lm, encoder, task, epsilon_total=60.0, num_queries=6, k=4, T=3,
                   embeddings=embeddings, noise=noise)
    if noise == "secret":
      method.checkpoint_dir = str(tmp_path / "private")
    method.build()
    return method

  whole, _ = evaluation.answer_resumably(dp_rag(), questions, None)
  log = str(tmp_path / "private" / "benign.jsonl")
  first = dp_rag()
  real_answer, calls = first.answer, []

  def dies_on_the_third_chunk(chunk):
    if len(calls) == 2:
      raise KeyboardInterrupt
    calls.append(list(chunk))
    return real_answer(chunk)

  first.answer = dies_on_the_third_chunk
  with pytest.raises(KeyboardInterrupt):
    evaluation.answer_resumably(first, questions, log)
  second = dp_rag()
  real_second, asked = second.answer, []
  second.answer = lambda chunk: asked.append(list(chunk)) or real_second(chunk)
  resumed, _ = evaluation.answer_resumably(second, questions, log)
  assert asked == [questions[4:]]
  assert resumed.answers == whole.answers and resumed.contexts == whole.contexts
  reference = dp_rag()
  reference.answer(questions)
  assert second.epsilon == pytest.approx(reference.epsilon)
  assert second.asked == 6
  with pytest.raises(ValueError, match="other questions"):
    evaluation.answer_resumably(dp_rag(), questions[::-1], log)


def test_dp_rag_calibrated_per_question_spends_what_its_questions_compose_to(task):
  """The paper's Table 1 protocol: every question alone is (10, delta)-DP, whatever the number
  of questions; the ledger's total is their composition (zCDP adds), far below 10 x n. A joint
  budget of 10 x n instead gives each question more (a larger c) than eps 10."""
  lm = encoder = None   # calibration and the ledger only: no model runs
  one = DPRAG(lm, encoder, task, epsilon_per_question=10.0, num_queries=1, k=8, T=70)
  many = DPRAG(lm, encoder, task, epsilon_per_question=10.0, num_queries=150, k=8, T=70)
  assert (many.c, many.eps_r) == (one.c, one.eps_r)
  one.skip(1)
  assert one.epsilon == pytest.approx(10.0, rel=1e-9)
  many.skip(150)
  rho = privacy.eps_to_zcdp(10.0, 1e-3)
  assert many.epsilon == pytest.approx(privacy.zcdp_to_eps(150 * rho, 1e-3), rel=1e-9)
  assert 10 < many.epsilon < 0.3 * 1500
  with pytest.raises(privacy.BudgetExceededError):
    many.skip(1)
  joint = DPRAG(lm, encoder, task, epsilon_total=1500.0, num_queries=150, k=8, T=70)
  assert joint.c > 1.9 * many.c
  with pytest.raises(ValueError, match="exactly one"):
    DPRAG(lm, encoder, task, num_queries=1)


# ---- noise modes: 'secret' by default, 'seeded' (the evaluation's) as before -------------------

# privacy.stream_key(seed, stream, ...) as the baselines always drew it from the public seed
# (raw threefry keys): seeded mode must keep these, or the committed results would move.
TODAYS_KEYS = {("dp_synth", 0, (1,)): [2060067018, 3241019684],
               ("dp_rag", 7, (2, 3)): [850643616, 4031247505],
               ("aug_pe", 5, (1,)): [181618951, 1070042423]}


def _keys_of_dp_synth(models, task, monkeypatch, **kwargs):
  """The batch keys a DP-Synth build hands the decoder (nothing is decoded)."""
  from dpsynrag_jax.baselines import dp_synth  # pylint: disable=g-import-not-at-top
  lm, encoder = models
  keys = {}

  def recording(predictor, suffixes, key_of, after_group=lambda out: None, **unused):
    out = {}
    for b in sorted(suffixes):
      keys[b] = np.asarray(key_of(b)).tolist()
      out[b] = [1]
    after_group(out)
    return out

  monkeypatch.setattr(dp_synth, "decode_many", recording)
  method = DPSynth(lm, encoder, task, epsilon=10.0, T=2, num_batches=3,
                   self_filter_enabled=False, max_new_tokens=2, **kwargs)
  method.build()
  return method, keys


class _KeyRecordingPredictor:
  """Stands in for DP-RAG's private decode: records the token key of each question."""

  def __init__(self, keys):
    self.keys = keys

  def with_prompt(self, template, shared_until):
    return self

  def suffixes(self, docs):
    return docs

  def shape_of(self, suffixes):
    return None

  def decode_group(self, suffixes, keys, shape):
    self.keys.append(np.asarray(keys[0]).tolist())
    return [[1]]

  def text(self, tokens):
    return "answer"


def _keys_of_dp_rag(models, task, monkeypatch, questions=2, **kwargs):
  """The threshold and token keys of a DP-RAG session's questions."""
  from dpsynrag_jax.baselines import dp_rag  # pylint: disable=g-import-not-at-top
  lm, encoder = models
  keys = []
  select = getattr(dp_rag._select, "unrecorded", dp_rag._select)   # calls after the first

  def recording_select(key, scores, k, eps_r):
    keys.append(np.asarray(key).tolist())
    return select(key, scores, k, eps_r)

  recording_select.unrecorded = select
  monkeypatch.setattr(dp_rag, "_select", recording_select)
  method = DPRAG(lm, encoder, task, epsilon_total=10.0, num_queries=questions, k=4, T=2,
                 embeddings=np.eye(len(task.documents), 384, dtype=np.float32), **kwargs)
  method.build()
  method.predictor = _KeyRecordingPredictor(keys)
  method.answer(_questions(task)[:questions])
  return method, keys


class _FakeLM:
  def generate(self, prompts, max_new_tokens, temperature=0.0, seed=0):
    return [f"text {seed} {i}" for i in range(len(prompts))]


class _FakeEncoder:
  dim = 4

  def embed(self, texts):
    rows = np.array([[len(t) % 3 + 1, 1.0, i % 2, 0.5] for i, t in enumerate(texts)], np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _keys_of_aug_pe(task, monkeypatch, **kwargs):
  """The vote noise keys of an Aug-PE build's rounds."""
  from dpsynrag_jax.baselines import aug_pe  # pylint: disable=g-import-not-at-top
  keys = []

  def recording_votes(key, private, synthetic, sigma):
    keys.append(np.asarray(key).tolist())
    return np.full(synthetic.shape[0], 5.0, np.float32)

  monkeypatch.setattr(aug_pe, "_noisy_votes", recording_votes)
  method = AugPE(_FakeLM(), _FakeEncoder(), task, epsilon=10.0, population=4, iterations=2,
                 max_new_tokens=2, **kwargs)
  method.build()
  return method, keys


def test_seeded_baselines_draw_what_the_public_seed_always_drew(models, task, monkeypatch):
  for (stream, seed, indices), expected in TODAYS_KEYS.items():
    assert np.asarray(privacy.stream_key(seed, stream, *indices)).tolist() == expected
  method, keys = _keys_of_dp_synth(models, task, monkeypatch, seed=0, noise="seeded")
  assert method.noise == "seeded" and keys[1] == TODAYS_KEYS[("dp_synth", 0, (1,))]
  assert keys == {b: np.asarray(privacy.stream_key(0, "dp_synth", b)).tolist()
                  for b in range(3)}
  import jax  # pylint: disable=g-import-not-at-top
  _, keys = _keys_of_dp_rag(models, task, monkeypatch, questions=4, seed=7, session=2,
                            noise="seeded")
  # Per question: the threshold's key (fold 0), then the tokens' (fold 1).
  assert keys == [np.asarray(jax.random.fold_in(privacy.stream_key(7, "dp_rag", 2, q), part))
                  .tolist() for q in range(4) for part in (0, 1)]
  assert (np.asarray(jax.random.fold_in(np.asarray(TODAYS_KEYS[("dp_rag", 7, (2, 3))],
                                                   np.uint32), 0)).tolist() == keys[6])
  _, keys = _keys_of_aug_pe(task, monkeypatch, seed=5, noise="seeded")
  assert keys == [TODAYS_KEYS[("aug_pe", 5, (1,))],
                  np.asarray(privacy.stream_key(5, "aug_pe", 2)).tolist()]


def test_baselines_draw_secret_noise_unless_seeded(models, task, monkeypatch):
  """A method made outside the evaluation, without `noise`, draws from 64 secret bits of its
  own: two instances with one public seed share no noise; seeded instances share all of it."""
  draws = {
      "dp_synth": lambda **kw: _keys_of_dp_synth(models, task, monkeypatch, seed=0, **kw),
      "dp_rag": lambda **kw: _keys_of_dp_rag(models, task, monkeypatch, seed=0, **kw),
      "aug_pe": lambda **kw: _keys_of_aug_pe(task, monkeypatch, seed=0, **kw),
  }
  for name, draw in draws.items():
    (first, a), (second, b) = draw(), draw()
    assert first.noise == second.noise == "secret", name
    seeded_a, seeded_b = draw(noise="seeded")[1], draw(noise="seeded")[1]
    assert seeded_a == seeded_b, name
    flat = lambda keys: [tuple(k) for k in (keys.values() if isinstance(keys, dict) else keys)]
    assert not set(flat(a)) & set(flat(b)), name        # no key shared between instances
    assert not set(flat(a)) & set(flat(seeded_a)), name  # nor with the public seed's
    assert first.noise_seed() != second.noise_seed(), name
    assert str(first.noise_seed()) not in first.ledger.to_json(), name   # never released
  with pytest.raises(ValueError, match="noise must be one of"):
    DPSynth(None, None, task, num_batches=2, noise="public")


def test_dp_synth_keeps_its_secret_beside_its_checkpoint(models, task, tmp_path, monkeypatch):
  """Secret noise with a checkpoint: the secret is written owner-only beside it before the
  first batch is kept, and a resumed instance reads it back (the same keys, nothing new
  drawn); a checkpoint whose secret is gone is refused, and a seeded checkpoint is not resumed
  as a secret one."""
  import os  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.baselines import base  # pylint: disable=g-import-not-at-top

  def run(folder, **kwargs):
    lm, encoder = models
    method = DPSynth(lm, encoder, task, epsilon=10.0, T=2, num_batches=3,
                     self_filter_enabled=False, max_new_tokens=2, **kwargs)
    method.checkpoint_dir = str(folder)
    return method

  first, keys = _keys_of_dp_synth(models, task, monkeypatch)   # for the recording decode
  secret = tmp_path / "secret"
  method = run(secret)
  method.build()
  path = secret / base.NOISE_SEED_FILE
  assert oct(os.stat(path).st_mode & 0o777) == "0o600"
  again = run(secret)
  again.build()   # every batch is in the checkpoint: nothing is decoded again
  assert again.noise_seed() == method.noise_seed() != first.noise_seed()
  os.remove(path)
  with pytest.raises(FileNotFoundError, match="secret noise seed"):
    run(secret).build()
  seeded = tmp_path / "seeded"
  run(seeded, noise="seeded").build()
  assert not (seeded / base.NOISE_SEED_FILE).exists()
  with pytest.raises(ValueError, match="other documents or settings"):
    run(seeded).build()
