"""docs/your_corpus.md, run as written: the page's commands are the test's source of truth.

Every ```bash and ```python block of the page runs, in the page's order, in a fresh folder
(bash blocks with `bash -euo pipefail`, python blocks as a script), each from the folder's
root, so files pass from one block to the next; ```text blocks are shown only. The one change
to the commands is the one the page states: `your_corpus.py:cpu` becomes `your_corpus.py:tiny`
(a random 2-layer LM and 6 clusters). The folder holds the user's documents,
runs/my_documents/*.txt, generated here, and a link to the repository's experiments/ so that
`python -m experiments....` and the config path resolve as they do from the repository root.
"""

import json
import os
import random
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(REPO, "docs", "your_corpus.md")
RUN = ("bash", "python")                                   # languages of the blocks that run
SIZE = ("your_corpus.py:cpu", "your_corpus.py:tiny")      # the page's stated substitution
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)

TOPICS = {
    "bicycle": ["brakes", "chain", "derailleur", "saddle", "spokes", "puncture", "gears"],
    "garden": ["tomatoes", "compost", "seedlings", "mulch", "aphids", "trellis", "pruning"],
    "baking": ["sourdough", "yeast", "flour", "oven", "crust", "dough", "proofing"],
    "telescope": ["eyepiece", "nebula", "jupiter", "mount", "galaxy", "eclipse", "comet"],
    "sailing": ["mainsail", "rudder", "harbour", "anchor", "tide", "keel", "mooring"],
    "chess": ["opening", "bishop", "castling", "endgame", "gambit", "rook", "checkmate"],
}


def page_blocks(markdown: str) -> list[tuple[str, str]]:
  """(language, code) of every fenced block, in order."""
  return [(m.group(1), m.group(2)) for m in FENCE.finditer(markdown)]


def write_documents(folder: str, per_topic: int = 8) -> None:
  """The user's documents: short notes on a few topics, one .txt file each."""
  os.makedirs(folder)
  rng = random.Random(0)
  n = 0
  for topic, words in TOPICS.items():
    for _ in range(per_topic):
      a, b, c, d = rng.sample(words, 4)
      with open(os.path.join(folder, f"note_{n:03d}.txt"), "w", encoding="utf-8") as f:
        f.write(f"Notes on my {topic}: today I looked at the {a} and the {b}. The {c} needed "
                f"work, and next week I will see to the {d}.\n")
      n += 1


def _run_block(language: str, code: str, folder: str, env: dict, n: int) -> str:
  if language == "bash":
    command = ["bash", "-euo", "pipefail", "-c", code]
  else:
    script = os.path.join(folder, f".block_{n}.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(code)
    command = [sys.executable, script]
  result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
  assert result.returncode == 0, (f"block {n} ({language}) of docs/your_corpus.md failed:\n"
                                  f"{code}\n--- stderr ---\n{result.stderr[-4000:]}")
  return result.stdout


def _texts(db_dir: str) -> list[str]:
  with open(os.path.join(db_dir, "synthetic_db.jsonl"), encoding="utf-8") as f:
    return [json.loads(line)["text"] for line in f if line.strip()]


def _shows_a_text(line: str, texts: list[str]) -> bool:
  """`line` is the start of a released text (a text may span lines)."""
  return bool(line) and any(t.startswith(line) for t in texts)


@pytest.mark.slow   # a build, the accounting and two asks, as subprocesses
def test_the_page_runs_as_written_and_releases_what_it_says(tmp_path):
  with open(PAGE, encoding="utf-8") as f:
    blocks = [(lang, code) for lang, code in page_blocks(f.read()) if lang in RUN]
  commands = "\n".join(code for _, code in blocks)
  for step in ("experiments.accounting", "experiments.build_synthetic_db", "experiments.ask",
               "SyntheticDatabase.load", 'ledger["totals"]'):
    assert step in commands, f"no block of the page that runs runs {step}"
  assert all(SIZE[0] in code for _, code in blocks
             if "experiments.build_synthetic_db" in code or "experiments.accounting" in code), (
                 "the page's build and accounting blocks must use the substituted preset")

  folder = str(tmp_path)
  os.symlink(os.path.join(REPO, "experiments"), os.path.join(folder, "experiments"))
  write_documents(os.path.join(folder, "runs", "my_documents"))
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env["PYTHONPATH"] = REPO   # the package and experiments/ even without an installed checkout
  outputs = [(code, _run_block(lang, code.replace(*SIZE), folder, env, n))
             for n, (lang, code) in enumerate(blocks)]
  code_of = lambda needle: next(code for code, _ in outputs if needle in code)
  out = lambda needle: next(stdout for code, stdout in outputs if needle in code)
  flag = lambda needle, name: os.path.join(
      folder, re.search(rf"--{name}=(\S+)", code_of(needle)).group(1))

  # The build: its release at the top of the work dir, its state under private/, secret noise.
  workdir = flag("experiments.build_synthetic_db", "workdir")
  for name in ("synthetic_db.jsonl", "index.faiss", "privacy_ledger.json", "config.json"):
    assert os.path.isfile(os.path.join(workdir, name)), name
  assert os.path.isfile(os.path.join(workdir, "private", "noise_seed.json"))
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  assert config["model"]["lm"] == "tiny-random" and config["privacy"]["noise"] == "secret"
  assert config["data"]["name"] == "corpus"
  texts = _texts(workdir)
  assert texts

  # The ledger: spent within the budget, and what the accounting block printed beforehand.
  with open(os.path.join(workdir, "privacy_ledger.json"), encoding="utf-8") as f:
    ledger = json.load(f)
  totals, budget = ledger["totals"], ledger["budget"]
  spent = {"closed_form": "eps_closed_form", "rdp": "eps_dp_accounting_rdp"}
  assert totals[spent[totals["accountant"]]] <= budget["epsilon"] + 1e-9
  assert budget["epsilon"] == config["privacy"]["epsilon"]
  planned = json.loads(out("experiments.accounting"))
  assert planned["epsilon"] == budget["epsilon"] and planned["delta"] == budget["delta"]
  assert planned["eps_closed_form"] == pytest.approx(totals["eps_closed_form"], rel=1e-9)
  assert planned["rho_total"] == pytest.approx(totals["rho"], rel=1e-9)
  assert "eps_closed_form" in out('ledger["totals"]')

  # Asking reads a folder of released files alone: no private/ there.
  db_dir = flag("experiments.ask", "db")
  assert os.path.isdir(db_dir) and not os.path.exists(os.path.join(db_dir, "private"))
  assert _texts(db_dir) == texts
  asked = out("experiments.ask")
  hits = re.findall(r"^\s*\d+\. \[-?[\d.]+\] (.*)$", asked, re.M)
  assert hits and all(_shows_a_text(h, texts) for h in hits), asked
  assert re.search(r"^A: ", asked, re.M), asked

  # The Python API prints retrieved texts, then an answer.
  loaded = re.search(r'SyntheticDatabase\.load\("([^"]+)"\)', code_of("SyntheticDatabase.load"))
  assert os.path.join(folder, loaded.group(1)) == db_dir
  printed = re.findall(r"^-?[\d.]+ \[[^\]]*\] (.*)$", out("SyntheticDatabase.load"), re.M)
  assert printed and all(_shows_a_text(p, texts) for p in printed)


def test_a_misspelt_override_of_the_pages_config_is_a_one_line_error():
  result = subprocess.run(
      [sys.executable, "-m", "experiments.accounting",
       "--config=experiments/configs/your_corpus.py:cpu", "--config.privacy.epsilonn=3"],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
  (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert "'epsilonn'" in line and 'Did you mean "epsilon"' in line
