"""A build's safe defaults and its robustness: the config schema's required noise mode, one
build per work dir, an owner-only private side, user errors as one line, and crashes (SIGKILL
at points spread over the phases) that resume into the uninterrupted release."""

import json
import os
import stat
import subprocess
import sys

import pytest

from dpsynrag_jax.synrag import build_config, pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # tiny builds end to end, several in subprocesses

RELEASED = ("config.json", "synthetic_db.jsonl", "index.faiss", "privacy_ledger.json")
TINY = "--config=experiments/configs/medical_synth.py:tiny"


def _released(workdir) -> dict[str, bytes]:
  return {name: open(os.path.join(workdir, name), "rb").read() for name in RELEASED}


def _tree(root) -> dict[str, bytes]:
  """Every file under root with its bytes (what a refused command must leave as it was)."""
  out = {}
  for folder, _, files in os.walk(root):
    for name in files:
      path = os.path.join(folder, name)
      out[os.path.relpath(path, root)] = open(path, "rb").read()
  return out


def _build_cli(workdir, *flags, env=None) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", "experiments.build_synthetic_db", TINY, f"--workdir={workdir}",
       *flags], capture_output=True, text=True, cwd=os.getcwd(),
      env={**os.environ, **(env or {})}, check=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted tiny (seeded) build."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  pipeline.build_synthetic_db(medical_synth.get_config("tiny"), workdir)
  return workdir


def _without_noise(config):
  config = config.copy_and_resolve_references()
  config.unlock()
  del config.privacy["noise"]
  return config


# ---- the schema -------------------------------------------------------------------------------

def test_a_config_without_noise_is_refused_for_a_new_build(tmp_path):
  workdir = str(tmp_path / "run")
  with pytest.raises(build_config.ConfigError, match=r"privacy\.noise.*'secret'.*'seeded'"):
    pipeline.build_synthetic_db(_without_noise(medical_synth.get_config("tiny")), workdir)
  assert not os.path.exists(workdir)


def test_unknown_and_missing_fields_are_refused():
  config = medical_synth.get_config("tiny")
  config.unlock()
  config.clustering.RR = 5
  with pytest.raises(build_config.ConfigError, match=r"clustering\.RR"):
    build_config.resolve(config)
  config = medical_synth.get_config("tiny").to_dict()
  del config["clustering"]["R"]
  with pytest.raises(build_config.ConfigError, match=r"lacks clustering\.R"):
    build_config.resolve(config)
  # Options added after builds were made are filled with their off value.
  config = medical_synth.get_config("tiny").to_dict()
  del config["generation"]["svt_paid"], config["privacy"]["topic_share"]
  resolved = build_config.resolve(config)
  assert resolved.generation.svt_paid == 0 and resolved.privacy.topic_share == 0.5


def test_presets_hold_every_field_of_the_schema():
  schema = build_config.default_config().to_dict()
  for arg in medical_synth.ARGS:
    preset = medical_synth.get_config(arg).to_dict()
    assert {s: sorted(v) for s, v in preset.items() if isinstance(v, dict)} == {
        s: sorted(v) for s, v in schema.items() if isinstance(v, dict)}, arg
    build_config.resolve(preset)


def test_a_build_from_before_the_noise_field_resumes_with_what_it_recorded(tmp_path, reference):
  """A work dir whose config.json has no privacy.noise (written before the field existed, when
  every build drew from the public seed) resumes from a config without the field, and releases
  what the seeded build releases; overwriting it is a new build and is refused."""
  workdir = str(tmp_path / "old")
  config = medical_synth.get_config("tiny")
  config.runtime.stop_after_clusters = 2
  with pytest.raises(pipeline.PipelineInterrupted):
    pipeline.build_synthetic_db(config, workdir)
  recorded = wd_lib.read_json(os.path.join(workdir, "config.json"))
  del recorded["privacy"]["noise"]
  wd_lib.atomic_write_json(os.path.join(workdir, "config.json"), recorded)

  old_style = _without_noise(medical_synth.get_config("tiny"))
  old_style.runtime.overwrite = True
  with pytest.raises(build_config.ConfigError, match=r"privacy\.noise"):
    pipeline.build_synthetic_db(old_style, workdir)
  pipeline.build_synthetic_db(_without_noise(medical_synth.get_config("tiny")), workdir)
  mine, theirs = _released(workdir), _released(reference)
  assert json.loads(mine.pop("config.json"))["privacy"]["noise"] == "seeded"
  theirs.pop("config.json")
  assert mine == theirs


# ---- the work dir -------------------------------------------------------------------------------

def test_the_private_side_is_owner_only(reference):
  mode = stat.S_IMODE(os.stat(os.path.join(reference, wd_lib.PRIVATE)).st_mode)
  assert mode == 0o700
  for name in ("synthetic_db.jsonl", "privacy_ledger.json", "index.faiss", "config.json"):
    assert stat.S_IMODE(os.stat(os.path.join(reference, name)).st_mode) & 0o044 == 0o044


def test_the_lock_refuses_a_second_holder_and_dies_with_its_process(tmp_path):
  workdir = str(tmp_path / "locked")
  with wd_lib.BuildLock(workdir) as lock:
    lock.prepared = True
    with pytest.raises(wd_lib.WorkdirLockedError, match=rf"pid {os.getpid()} on host .*started"):
      with wd_lib.BuildLock(workdir):
        pass
  with wd_lib.BuildLock(workdir):   # released on exit
    pass
  # A holder killed with SIGKILL leaves no stale lock.
  script = ("import os, sys\nfrom dpsynrag_jax.synrag import workdir as w\n"
            f"lock = w.BuildLock({workdir!r}).__enter__()\nos.kill(os.getpid(), 9)\n")
  assert subprocess.run([sys.executable, "-c", script], check=False).returncode == -9
  with wd_lib.BuildLock(workdir):
    pass


def test_two_builds_started_together_in_one_work_dir(tmp_path):
  """One runs to the end, the other is refused at once with a message naming the holder, and
  every cluster is decoded once."""
  workdir = str(tmp_path / "shared")
  procs = [subprocess.Popen(
      [sys.executable, "-m", "experiments.build_synthetic_db", TINY, f"--workdir={workdir}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
           for _ in range(2)]
  results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
  codes = sorted(code for code, _ in results)
  assert codes == [0, 2], results
  refused = next(err for code, err in results if code == 2)
  assert "error:" in refused and "in use by another build (pid" in refused
  assert "Traceback" not in refused
  generated = wd_lib.read_jsonl(os.path.join(workdir, "private", "generated.jsonl"))
  clusters = [rec["cluster"] for rec in generated]
  assert sorted(clusters) == sorted(set(clusters)) and clusters


def test_user_errors_end_in_one_line_and_leave_the_work_dir_as_it_was(tmp_path, reference):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "a note"}\n{"txt": "no text field"}\n')
  corpus = ["--config.data.name=corpus", "--config.data.num_documents=0"]
  fresh = str(tmp_path / "fresh")
  cases = [
      (fresh, corpus + [f"--config.data.path={bad}"], "no 'text' field"),
      (fresh, corpus + [f"--config.data.path={tmp_path / 'missing.jsonl'}"],
       "No such file"),
      (fresh, ["--config.clustering.R=many"], "--config.clustering.R=many"),
      (reference, ["--config.privacy.epsilon=3"], "holds a finished run"),
  ]
  # An interrupted build of another config.
  interrupted = str(tmp_path / "interrupted")
  assert _build_cli(interrupted, "--config.runtime.stop_after_clusters=1").returncode != 0
  cases.append((interrupted, ["--config.privacy.epsilon=3"], "with a different config"))
  for workdir, flags, message in cases:
    before = _tree(workdir) if os.path.exists(workdir) else None
    result = _build_cli(workdir, *flags)
    assert result.returncode == 2, (flags, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and message in lines[0], (flags, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    after = _tree(workdir) if os.path.exists(workdir) else None
    assert after == before, flags
  shown = _build_cli(fresh, *corpus, f"--config.data.path={bad}", "--traceback")
  assert shown.returncode == 2 and "Traceback" in shown.stderr


# ---- crashes ------------------------------------------------------------------------------------

# Points spread over the phases (dpsynrag_jax.faults; NAME@N: the N-th time it is reached).
KILL_POINTS = (
    "write:config.json",             # prepare: the first file of the build
    "save:keywords.npy",             # keywords computed, not yet cached
    "write:ledger.json",             # the histogram charged, its ledger half saved
    "save:top_words.npy",            # the histogram charged and saved, its top words not
    "save:embeddings.npy",           # embeddings computed, not yet cached
    "append:selected.jsonl@3",       # mid re-ranking, a torn record
    "write:public_hints.json",       # every cluster's tokens charged, nothing decoded
    "append:generated.jsonl@2",      # mid decode, a torn record
    "write:synthetic_db.jsonl",      # the release: texts written, not yet in place
    "write:privacy_ledger.json",     # the release: texts and index in place, not the ledger
)


def test_a_build_killed_anywhere_resumes_into_the_uninterrupted_release(tmp_path, reference):
  expected = _released(reference)
  private_ledger = open(os.path.join(reference, "private", "ledger.json"), "rb").read()
  for n, point in enumerate(KILL_POINTS):
    workdir = str(tmp_path / f"killed{n}")
    killed = _build_cli(workdir, env={"DPSYNRAG_KILL_AT": point})
    assert killed.returncode == -9, (point, killed.stderr[-2000:])
    assert not os.path.exists(os.path.join(workdir, "private", "FINISHED")), point
    pipeline.build_synthetic_db(medical_synth.get_config("tiny"), workdir)
    assert _released(workdir) == expected, point
    # Nothing charged twice: the ledger is the uninterrupted build's, entry for entry.
    assert open(os.path.join(workdir, "private", "ledger.json"), "rb").read() == private_ledger
    generated = wd_lib.read_jsonl(os.path.join(workdir, "private", "generated.jsonl"))
    assert len({r["cluster"] for r in generated}) == len(generated), point
