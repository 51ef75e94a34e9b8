"""The experiment apps on their tiny configs (what CI runs of them)."""

import json
import os

from experiments import evaluate
from experiments.configs import evaluate as evaluate_config


def test_evaluate_tiny_writes_rows_table_and_plot(tmp_path):
  config = evaluate_config.get_config("tiny")
  rows = evaluate.run(config, str(tmp_path))
  methods = {r["method"] for r in rows}
  assert methods == {"Non-RAG", "RAG", "DP-SynRAG", "DP-Synth", "DP-RAG", "Aug-PE"}
  by_method = {r["method"]: r for r in rows}
  assert by_method["Non-RAG"]["epsilon"] == 0 and by_method["Non-RAG"]["context_recall"] is None
  assert by_method["RAG"]["epsilon"] == float("inf")
  for name in ("DP-SynRAG", "DP-Synth", "DP-RAG", "Aug-PE"):
    assert abs(by_method[name]["epsilon"] - config.epsilon) < 1e-6, name
  assert by_method["RAG"]["context_recall"] >= 0.5
  for name in ("table.md", "results.json", "accuracy.png"):
    assert os.path.getsize(tmp_path / name) > 0
  table = (tmp_path / "table.md").read_text()
  assert "| medical | DP-SynRAG |" in table
  # A rerun skips finished rows (nothing is rebuilt or re-answered).
  again = evaluate.run(config, str(tmp_path))
  assert len(again) == len(rows)
  assert len(json.load(open(tmp_path / "results.json"))["rows"]) == len(rows)
