"""Asks a built synthetic database questions: the texts it retrieves, with scores, and an answer.

    python -m experiments.ask --db=runs/demo \
        --question="I have a rash, a fever and sore joints. What is my disease?"
    python -m experiments.ask --db=docs/results/beyond_5 --questions=questions.txt --k=5
    python -m experiments.ask --db=runs/mine --lm=/path/to/hf_checkpoint --question="..."

Reads only the released files of --db (synthetic_db.jsonl, index.faiss, config.json; the index
is rebuilt from the texts when absent), never its private/ side: asking costs no privacy.
--lm: a preset or checkpoint to answer with (default: the build's own model.lm); --no_answer
prints the retrieved texts only. --questions: a text file, one question per line, or a JSONL
file with a "question" field per line.
"""

import json
import os

from absl import flags

from dpsynrag_jax.rag.database import DatabaseError, SyntheticDatabase
from experiments import cli

FLAGS = flags.FLAGS


def read_questions(path: str) -> list[str]:
  """Questions of a text file (one per line) or a JSONL file ({"question": ...} per line)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No questions file {path!r}.")
  questions = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      line = line.strip()
      if not line:
        continue
      if line.startswith("{"):
        try:
          line = json.loads(line)["question"]
        except (json.JSONDecodeError, KeyError, TypeError):
          raise ValueError(f"{path} line {n}: expected {{\"question\": ...}}.") from None
      questions.append(str(line))
  if not questions:
    raise ValueError(f"{path} holds no question.")
  return questions


def ask(db_dir: str, questions: list[str], *, k: int, lm_name: str = "", answer: bool = True,
        reader: str = "focused", task: str = "", max_new_tokens: int = 48) -> list[dict]:
  """For each question: {"question", "hits": [{"score", "text", "keyword"}], "answer"}."""
  db = SyntheticDatabase.load(db_dir)
  if not len(db):
    raise DatabaseError(f"{db_dir} holds an empty synthetic database (every text was filtered "
                        "out).")
  if answer:
    from dpsynrag_jax.models import load_lm  # pylint: disable=g-import-not-at-top
    lm = load_lm(lm_name or db.config.get("model", {}).get("lm") or "smollm2-135m-instruct")
    answers = db.answer_many(questions, lm, k, reader=reader, task=task or None,
                             max_new_tokens=max_new_tokens)
    rows = [(a.hits, a.text) for a in answers]
  else:
    rows = [(hits, None) for hits in db.search_many(questions, k)]
  return [{"question": q, "answer": text,
           "hits": [{"score": round(h.score, 4), "text": h.text, "keyword": h.keyword}
                    for h in hits]} for q, (hits, text) in zip(questions, rows)]


def main(argv):
  if len(argv) > 1:
    raise ValueError(f"Unexpected arguments: {argv[1:]}")
  cli.start_app()
  questions = list(FLAGS.question) + (read_questions(FLAGS.questions) if FLAGS.questions
                                      else [])
  if not questions:
    raise ValueError("Pass --question=... or --questions=FILE.")
  results = ask(FLAGS.db, questions, k=FLAGS.k, lm_name=FLAGS.lm, answer=not FLAGS.no_answer,
                reader=FLAGS.reader, task=FLAGS.task, max_new_tokens=FLAGS.max_new_tokens)
  if FLAGS.json:
    print(json.dumps(results, indent=1, ensure_ascii=False))
    return
  for result in results:
    print(f"Q: {result['question']}")
    for rank, hit in enumerate(result["hits"], 1):
      print(f"  {rank:2d}. [{hit['score']:.3f}] {hit['text']}")
    if result["answer"] is not None:
      print(f"A: {result['answer']}")
    print()


if __name__ == "__main__":
  flags.DEFINE_string("db", None, "A finished build's work dir (its released files).")
  flags.DEFINE_multi_string("question", [], "A question (repeat for several).")
  flags.DEFINE_string("questions", "", "A file of questions: one a line, or JSONL with "
                      "\"question\".")
  flags.DEFINE_integer("k", 10, "Texts retrieved per question.")
  flags.DEFINE_string("lm", "", "LM preset or checkpoint that answers (default: the build's).")
  flags.DEFINE_bool("no_answer", False, "Retrieve only.")
  flags.DEFINE_string("reader", "focused", "Reader prompt: focused, paper, ...")
  flags.DEFINE_string("task", "", "The reader prompt's task: medical, movielens, searchqa or "
                      "'' (generic).")
  flags.DEFINE_integer("max_new_tokens", 48, "Answer length in tokens.")
  flags.DEFINE_bool("json", False, "Print JSON instead of text.")
  flags.mark_flag_as_required("db")
  cli.define_compilation_cache()
  cli.run(main)
