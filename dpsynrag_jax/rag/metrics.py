"""Scores of a method's answers; gold answers are read here and nowhere upstream.

accuracy        answer names a gold answer (Task.matches)
context_recall  a retrieved text names a gold answer: separates the database's quality from
                the reader's
leakage         outputs that contain a private full name
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def accuracy(answers: Sequence[str], golds: Sequence[Sequence[str]],
             matches: Callable[[str, Sequence[str]], bool]) -> float:
  """Fraction of answers that name one of their gold answers."""
  if len(answers) != len(golds):
    raise ValueError("answers and golds must have the same length.")
  if not answers:
    return float("nan")
  return float(np.mean([matches(a, g) for a, g in zip(answers, golds)]))


def context_recall(contexts: Sequence[Sequence[str]], golds: Sequence[Sequence[str]],
                   matches: Callable[[str, Sequence[str]], bool]) -> float:
  """Fraction of questions with at least one retrieved text naming a gold answer."""
  if len(contexts) != len(golds):
    raise ValueError("contexts and golds must have the same length.")
  if not contexts:
    return float("nan")
  return float(np.mean([any(matches(c, g) for c in ctx) for ctx, g in zip(contexts, golds)]))


def leaked_names(text: str, private_names: Sequence[str]) -> list[str]:
  """The private full names that appear in `text` (case-insensitive, whole name)."""
  low = text.lower()
  return [n for n in private_names if n and n.lower() in low]


def leakage(outputs: Sequence[str], private_names: Sequence[str]) -> int:
  """How many outputs contain at least one private full name."""
  return sum(bool(leaked_names(o, private_names)) for o in outputs)
