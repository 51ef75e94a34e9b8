"""What a release may depend on (public data only), independent noise per release, and the work
dir's guards against resuming, overwriting or appending onto other data."""

import itertools
import json
import os

import jax
import numpy as np
import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.baselines import DPSynth, aug_pe, dp_rag, dp_synth
from dpsynrag_jax.data import load_medical_synth
from dpsynrag_jax.data.private_documents import fit_to_budget
from dpsynrag_jax.data.tasks import load_task
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.synrag import pipeline, refresh
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.private_decode import PrivatePredictor
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # builds end to end on corpora of notes

NOTES = list(load_medical_synth(num_documents=600, num_validation=0, num_test=0).documents)


def _corpus(path, texts):
  path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
  return str(path)


def _config(path, **overrides):
  config = medical_synth.get_config("tiny")
  config.data.name = "corpus"
  config.data.path = path
  config.data.num_documents = 0
  for dotted, value in overrides.items():
    node = config
    *parents, name = dotted.split(".")
    for p in parents:
      node = node[p]
    node[name] = value
  return config


def _decode_schedule(workdir, config):
  """The order today's decode runs clusters in: by padded (rows, suffix bucket), then index."""
  lm = load_lm("tiny-random")
  predictor = PrivatePredictor(lm, c=0.1, tau=1.0, T=config.generation.T)
  docs = [json.loads(line)["text"] for line in open(config.data.path)]
  docs = fit_to_budget(lm, docs, [""] * len(docs), config.data.max_doc_tokens,
                                "truncate")
  selected = wd_lib.read_jsonl(os.path.join(workdir, "private", "selected.jsonl"))
  shapes = {r["cluster"]: predictor.shape_of(predictor.suffixes([docs[i] for i in r["members"]]))
            for r in selected}
  return sorted(shapes, key=lambda r: (shapes[r], r)), [shapes[r] for r in sorted(shapes)]


def test_ledger_is_byte_identical_for_corpora_with_other_cluster_sizes(tmp_path):
  # Same R, L, T; the second corpus has three times the notes and short ones among them, so
  # its clusters hold other numbers of documents of other lengths.
  short = [n.split(".")[0] + "." for n in NOTES[200:400]]
  a = _config(_corpus(tmp_path / "a.jsonl", NOTES[:120]), **{"clustering.k": 40})
  b = _config(_corpus(tmp_path / "b.jsonl", NOTES[:200] + short), **{"clustering.k": 40})
  pipeline.build_synthetic_db(a, str(tmp_path / "a"))
  pipeline.build_synthetic_db(b, str(tmp_path / "b"))
  sizes = [[len(r["members"]) for r in wd_lib.read_jsonl(str(tmp_path / x / "private" /
                                                          "selected.jsonl"))] for x in "ab"]
  schedules = [_decode_schedule(str(tmp_path / x), c) for x, c in (("a", a), ("b", b))]
  assert sizes[0] != sizes[1] and schedules[0][0] != schedules[1][0]  # the test means something
  ledgers = [open(tmp_path / x / wd_lib.LEDGER, "rb").read() for x in "ab"]
  assert ledgers[0] == ledgers[1]
  clusters = [e["cluster"] for e in json.loads(ledgers[0])["entries"] if e["cluster"] is not None]
  assert clusters == sorted(clusters)
  # The other released files carry no per-cluster counts either.
  config_text = open(tmp_path / "a" / wd_lib.CONFIG).read()
  assert "members" not in config_text and "documents.sha256" not in config_text
  records = wd_lib.read_jsonl(str(tmp_path / "a" / wd_lib.SYNTHETIC_DB))
  assert all(set(r) == {"text", "keyword"} for r in records)


def test_dp_synth_batches_do_not_depend_on_the_corpus_size():
  lm, encoder = load_lm("tiny-random"), load_encoder("all-minilm-l6-v2")
  base = load_task("medical", num_documents=150, num_validation=0, num_test=2)
  grown = load_task("medical", num_documents=151, num_validation=0, num_test=2)
  assert list(grown.documents[:150]) == list(base.documents)  # 150 = 3 x 50: the boundary
  methods = [DPSynth(lm, encoder, t, epsilon=10.0, T=4, num_batches=3, self_filter_enabled=False,
                     max_new_tokens=2) for t in (base, grown)]
  before, after = (m.batches(m.task.documents) for m in methods)
  assert len(before) == len(after) == 3
  of = lambda batches: {d: b for b, docs in batches.items() for d in docs}
  assert all(of(after)[d] == b for d, b in of(before).items())
  for m in methods:
    m.build()
  assert [e.to_json() for e in methods[0].ledger.entries] == [
      e.to_json() for e in methods[1].ledger.entries]
  assert len(methods[0].ledger.entries) == 3
  with pytest.raises(ValueError, match="num_batches"):
    DPSynth(lm, encoder, base, num_batches=0)


def test_no_two_methods_or_releases_share_a_key():
  keys = {}

  def add(name, key):
    data = tuple(np.asarray(jax.random.key_data(key)).ravel().tolist())
    assert data not in keys, f"{name} reuses the key of {keys.get(data)}"
    keys[data] = name

  for seed in (0, 1):
    add(f"histogram {seed}", pipeline.histogram_key(seed))
    for r in range(600):
      base = pipeline.cluster_key(seed, r)
      add(f"cluster {r} re-rank", jax.random.fold_in(base, 0))
      add(f"cluster {r} tokens", jax.random.fold_in(base, 1))
      add(f"dp-synth batch {r}", dp_synth.batch_key(seed, r))
    for session, q in itertools.product(range(3), range(200)):
      base = dp_rag.question_key(seed, session, q)
      add(f"dp-rag {session}/{q} retrieval", jax.random.fold_in(base, 0))
      add(f"dp-rag {session}/{q} tokens", jax.random.fold_in(base, 1))
    for round_ in range(1, 11):
      add(f"aug-pe round {round_}", aug_pe.round_key(seed, round_))
  for bad in (2**32, -1, 2**40, True, 1.5):     # a config's public seed
    with pytest.raises(ValueError, match="seed"):
      privacy.check_seed(bad)
  for bad in (2**64, -1, True, 1.5):            # a noise seed (public, or a 64-bit secret)
    with pytest.raises(ValueError, match="seed"):
      privacy.stream_key(bad, "histogram")


def test_a_resume_over_changed_documents_is_refused(tmp_path):
  path = tmp_path / "docs.jsonl"
  config = _config(_corpus(path, NOTES[:150]), **{"runtime.stop_after_clusters": 1})
  with pytest.raises(pipeline.PipelineInterrupted):
    pipeline.build_synthetic_db(config, str(tmp_path / "run"))
  _corpus(path, NOTES[:149] + ["An edited note about someone else."])
  with pytest.raises(wd_lib.WorkdirError, match="other documents"):
    pipeline.build_synthetic_db(_config(str(path)), str(tmp_path / "run"))


def test_overwrite_needs_a_new_seed(tmp_path):
  config = _config(_corpus(tmp_path / "docs.jsonl", NOTES[:150]))
  workdir = str(tmp_path / "run")
  pipeline.build_synthetic_db(config, workdir)
  again = _config(config.data.path, **{"runtime.overwrite": True, "privacy.epsilon": 5.0})
  with pytest.raises(wd_lib.WorkdirError, match="same seed"):
    pipeline.build_synthetic_db(again, workdir)
  again.seed = 7
  summary = pipeline.build_synthetic_db(again, workdir)
  assert summary["eps_closed_form"] == pytest.approx(5.0)
  assert wd_lib.read_json(os.path.join(workdir, wd_lib.CONFIG))["seed"] == 7


def test_clear_removes_appended_partitions_too(tmp_path):
  wd = wd_lib.Workdir(str(tmp_path / "db"))
  os.makedirs(wd.private_path("partitions/1/private"))
  os.makedirs(wd.path(wd_lib.LEDGERS))
  for name in (wd_lib.CONFIG, wd_lib.SYNTHETIC_DB, wd_lib.PARTITIONS,
               os.path.join(wd_lib.LEDGERS, "partition_1.json"),
               os.path.join(wd_lib.PRIVATE, "partitions/1/private/ledger.json")):
    open(wd.path(name), "w").close()
  wd.clear()
  assert os.listdir(wd.root) == []
  assert wd_lib.PARTITIONS in wd_lib.RELEASED_FILES and wd_lib.LEDGERS in wd_lib.RELEASED_FILES


@pytest.fixture(scope="module")
def base_build(tmp_path_factory):
  root = tmp_path_factory.mktemp("overlap")
  base = str(root / "base")
  pipeline.build_synthetic_db(medical_synth.get_config("tiny"), base)
  return root, base


def test_appending_the_original_corpus_is_refused(base_build):
  root, base = base_build
  path = _corpus(root / "same.jsonl", NOTES[:200])
  with pytest.raises(wd_lib.WorkdirError, match="200 of the 200 new documents"):
    refresh.append_documents(base, path)
  assert not os.path.exists(os.path.join(base, refresh.PARTITIONS))


def test_appending_a_file_that_overlaps_by_one_document_is_refused(base_build):
  root, base = base_build
  path = _corpus(root / "overlap.jsonl", NOTES[300:360] + [NOTES[17]])
  with pytest.raises(wd_lib.WorkdirError, match=r"1 of the 61 new documents.*line 61"):
    refresh.append_documents(base, path)


def test_a_global_token_release_must_be_named(tmp_path):
  cal = privacy.calibrate(10.0, 1e-3)
  ledger = privacy.ResumableLedger(str(tmp_path / "ledger.json"), cal)
  with pytest.raises(ValueError, match="needs a name"):
    ledger.record_tokens(None, 2, 0.01, 1.0)
  ledger.record_tokens(None, 2, 0.01, 1.0, name="answer 0")
  ledger.record_tokens(None, 2, 0.01, 1.0, name="answer 1")
  ledger.record_tokens(None, 2, 0.01, 1.0, name="answer 1")   # a resumed replay: once
  assert [e.label for e in ledger.ledger.entries] == ["answer 0", "answer 1"]


def test_secret_noise_is_drawn_per_build_kept_private_and_reused_on_resume(tmp_path):
  """privacy.noise = 'secret' (the default of release configs): two builds of the same config
  and seed draw different noise; the secret lives only on the private side (owner-only), in
  no released file; a resumed build reads it back, and overwriting draws a new one."""
  path = _corpus(tmp_path / "docs.jsonl", NOTES[:150])
  secret = {"privacy.noise": "secret"}
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  pipeline.build_synthetic_db(_config(path, **secret), a)
  pipeline.build_synthetic_db(_config(path, **secret), b)
  seeds = [wd_lib.read_json(os.path.join(w, wd_lib.PRIVATE, wd_lib.NOISE_SEED))["noise_seed"]
           for w in (a, b)]
  assert seeds[0] != seeds[1]
  texts = [open(os.path.join(w, wd_lib.SYNTHETIC_DB), "rb").read() for w in (a, b)]
  assert texts[0] != texts[1]
  assert os.stat(os.path.join(a, wd_lib.PRIVATE, wd_lib.NOISE_SEED)).st_mode & 0o077 == 0
  for name in wd_lib.RELEASED_FILES:
    released = os.path.join(a, name)
    if os.path.isfile(released):
      assert str(seeds[0]).encode() not in open(released, "rb").read(), name
  assert wd_lib.read_json(os.path.join(a, wd_lib.CONFIG))["privacy"]["noise"] == "secret"
  # Interrupted and resumed: the same secret, so the clusters drawn before the stop are kept.
  c = str(tmp_path / "c")
  with pytest.raises(pipeline.PipelineInterrupted):
    pipeline.build_synthetic_db(_config(path, **secret, **{"runtime.stop_after_clusters": 2}), c)
  first = wd_lib.read_json(os.path.join(c, wd_lib.PRIVATE, wd_lib.NOISE_SEED))
  drawn = wd_lib.Workdir(c).generated()
  pipeline.build_synthetic_db(_config(path, **secret), c)
  assert wd_lib.read_json(os.path.join(c, wd_lib.PRIVATE, wd_lib.NOISE_SEED)) == first
  assert {r: t for r, t in wd_lib.Workdir(c).generated().items() if r in drawn} == drawn
  # Overwrite with the same public seed is allowed here: the old secret goes, a new one comes.
  pipeline.build_synthetic_db(_config(path, **secret, **{"runtime.overwrite": True}), a)
  assert wd_lib.read_json(os.path.join(a, wd_lib.PRIVATE, wd_lib.NOISE_SEED))["noise_seed"] != \
      seeds[0]


def test_noise_seed_modes():
  with pytest.raises(ValueError, match="privacy.noise"):
    privacy.noise_seed("public", 0, "/nonexistent/x.json", create=True)
  assert privacy.noise_seed("seeded", 7, "/nonexistent/x.json", create=False) == 7
  with pytest.raises(FileNotFoundError, match="secret noise seed"):
    privacy.noise_seed("secret", 7, "/nonexistent/x.json", create=False)
  # A noise seed below 2^32 is exactly the key the public seed always gave (seeded releases
  # unchanged); above it, the full 64-bit threefry key.
  assert np.array_equal(np.asarray(privacy.keys.root_key(5)), np.asarray(jax.random.PRNGKey(5)))
  assert not np.array_equal(np.asarray(privacy.keys.root_key(5 + 2**32)),
                            np.asarray(jax.random.PRNGKey(5)))


def test_release_configs_default_to_secret_noise():
  """Build configs a user releases from draw secret noise; only tests, the demo and the
  experiments (reproducible benchmarks, labelled so) are seeded."""
  from experiments.configs import evaluate as evaluate_config  # pylint: disable=g-import-not-at-top
  for arg in ("paper", "paper_cpu", "quick"):
    assert medical_synth.get_config(arg).privacy.noise == "secret", arg
  for arg in ("tiny", "demo"):
    assert medical_synth.get_config(arg).privacy.noise == "seeded", arg
  assert evaluate_config.get_config("paper_cpu").dp_synrag.privacy.noise == "seeded"
