"""The private-corpus loader: every policy and every error, on small files in tmp_path."""

import csv
import logging

import pytest

from dpsynrag_jax.data.corpus import CorpusError, load_corpus


def _write(tmp_path, name, content):
  path = tmp_path / name
  path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
  return path


# ---------------------------------------------------------------- JSONL


def test_jsonl_plain(tmp_path, caplog):
  path = _write(tmp_path, "docs.jsonl", '{"text": "first doc"}\n{"text": " second \\n doc ", '
                '"id": 2}\n')
  with caplog.at_level(logging.INFO):
    corpus = load_corpus(path)
  assert corpus.texts == ["first doc", "second \n doc"]
  assert corpus.line_numbers == [1, 2]
  assert corpus.report.records == corpus.report.kept == 2
  assert corpus.report.file_format == "jsonl"
  summary = [r.getMessage() for r in caplog.records if "Loaded 2 documents" in r.getMessage()]
  assert len(summary) == 1 and "first doc" not in summary[0]


def test_jsonl_custom_field_crlf_and_bom(tmp_path):
  path = _write(tmp_path, "docs.JSONL", b'\xef\xbb\xbf{"body": "a"}\r\n{"body": "b"}\r\n')
  assert load_corpus(path, text_field="body").texts == ["a", "b"]


def test_empty_lines_and_texts_skipped_by_default(tmp_path):
  path = _write(tmp_path, "docs.jsonl", '{"text": "a"}\n\n   \n{"text": "  "}\n{"text": "b"}\n')
  corpus = load_corpus(path)
  assert corpus.texts == ["a", "b"]
  assert corpus.line_numbers == [1, 5]
  assert corpus.report.skipped_empty == 3
  assert corpus.report.records == 3  # blank lines are not records


@pytest.mark.parametrize("content, line", [('{"text": "a"}\n\n{"text": "b"}\n', 2),
                                           ('{"text": "a"}\n{"text": ""}\n', 2)])
def test_empty_error_names_the_line(tmp_path, content, line):
  path = _write(tmp_path, "docs.jsonl", content)
  with pytest.raises(CorpusError, match=rf"docs\.jsonl, line {line}: empty document"):
    load_corpus(path, on_empty="error")


def test_duplicates_keep_skip_error(tmp_path):
  path = _write(tmp_path, "docs.jsonl",
                '{"text": "a"}\n{"text": "b"}\n{"text": " a "}\n{"text": "a"}\n')
  kept = load_corpus(path)
  assert kept.texts == ["a", "b", "a", "a"]
  assert kept.report.kept_duplicates == 2 and kept.report.skipped_duplicates == 0
  skipped = load_corpus(path, on_duplicate="skip")
  assert skipped.texts == ["a", "b"] and skipped.line_numbers == [1, 2]
  assert skipped.report.skipped_duplicates == 2
  with pytest.raises(CorpusError, match=r"line 3: duplicate of the document on line 1"):
    load_corpus(path, on_duplicate="error")


def test_bad_utf8_error_replace_skip(tmp_path):
  path = _write(tmp_path, "docs.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n{"text": "z"}\n')
  with pytest.raises(CorpusError, match=r"docs\.jsonl, line 2: bytes that are not UTF-8"):
    load_corpus(path)
  replaced = load_corpus(path, on_bad_utf8="replace")
  assert replaced.texts == ["ok", "caf\ufffd", "z"]
  assert replaced.report.replaced_bad_utf8 == 1
  skipped = load_corpus(path, on_bad_utf8="skip")
  assert skipped.texts == ["ok", "z"] and skipped.line_numbers == [1, 3]
  assert skipped.report.skipped_bad_utf8 == 1


def test_max_chars_truncates_and_counts(tmp_path):
  path = _write(tmp_path, "docs.jsonl", '{"text": "abcdef"}\n{"text": "abc"}\n{"text": "abcxyz"}\n')
  corpus = load_corpus(path, max_chars=3)
  assert corpus.texts == ["abc", "abc", "abc"]
  assert corpus.report.truncated == 2
  # Duplicates are judged on what the pipeline would see, i.e. after truncation.
  assert corpus.report.kept_duplicates == 2
  assert load_corpus(path, max_chars=3, on_duplicate="skip").texts == ["abc"]
  with pytest.raises(ValueError, match="max_chars"):
    load_corpus(path, max_chars=0)


@pytest.mark.parametrize("line, message", [
    ('{"text": "a"', r"line 2: malformed JSON"),
    ('["a"]', r"line 2: expected a JSON object .* got a JSON list"),
    ('"a"', r"line 2: expected a JSON object .* got a JSON str"),
    ('{"body": "a"}', r"line 2: the object has no 'text' field \(its fields: 'body'\)"),
    ('{"text": 3}', r"line 2: field 'text' must be a string, got int"),
    ('{"text": null}', r"line 2: field 'text' must be a string, got NoneType"),
])
def test_jsonl_errors_name_the_line(tmp_path, line, message):
  path = _write(tmp_path, "docs.jsonl", '{"text": "fine"}\n' + line + "\n")
  with pytest.raises(CorpusError, match=r"docs\.jsonl, " + message):
    load_corpus(path)


# ---------------------------------------------------------------- CSV


def test_csv_with_quoted_newline_and_commas(tmp_path):
  rows = [["id", "text"], ["1", "plain"], ["2", "two\nlines, with a comma"], ["3", 'say "hi"']]
  path = tmp_path / "docs.csv"
  with open(path, "w", newline="", encoding="utf-8") as f:
    csv.writer(f).writerows(rows)
  corpus = load_corpus(path)
  assert corpus.texts == ["plain", "two\nlines, with a comma", 'say "hi"']
  assert corpus.line_numbers == [2, 3, 5]  # csv.writer ends rows with \r\n; the quoted row spans 2
  assert corpus.report.file_format == "csv" and corpus.report.records == 3


def test_tsv_and_explicit_format(tmp_path):
  path = _write(tmp_path, "docs.tsv", "text\tlabel\nhello, world\tx\n")
  assert load_corpus(path).texts == ["hello, world"]
  other = _write(tmp_path, "docs.txt", "doc\nhello\n")
  assert load_corpus(other, file_format="csv", text_field="doc").texts == ["hello"]


def test_csv_policies(tmp_path):
  content = b'text\n"a"\n\n""\n"caf\xe9"\n"a"\n'
  path = _write(tmp_path, "docs.csv", content)
  corpus = load_corpus(path, on_bad_utf8="replace", on_duplicate="skip")
  assert corpus.texts == ["a", "caf\ufffd"]
  assert corpus.line_numbers == [2, 5]
  r = corpus.report
  assert (r.skipped_empty, r.replaced_bad_utf8, r.skipped_duplicates) == (2, 1, 1)
  with pytest.raises(CorpusError, match=r"docs\.csv, line 5: bytes that are not UTF-8"):
    load_corpus(path)
  with pytest.raises(CorpusError, match=r"docs\.csv, line 3: empty document"):
    load_corpus(path, on_bad_utf8="skip", on_empty="error")


def test_csv_bad_bytes_in_a_multiline_row_skip_the_whole_row(tmp_path):
  path = _write(tmp_path, "docs.csv", b'text\n"one\nt\xffwo"\nthree\n')
  corpus = load_corpus(path, on_bad_utf8="skip")
  assert corpus.texts == ["three"] and corpus.line_numbers == [4]


@pytest.mark.parametrize("content, message", [
    ("id,body\n1,a\n", r"line 1: the header has no column 'text' \(columns: 'id', 'body'\)"),
    ("text,text\na,b\n", r"line 1: the header has more than one column 'text'"),
    ("\ntext\na\n", r"line 1: expected a header row"),
    ("id,text\n1,a\n2,b,c\n", r"line 3: the row has 3 fields, the header has 2"),
    ("id,text\n1,a\n2\n", r"line 3: the row has 1 fields, the header has 2"),
    ('id,text\n1,a\n2,"never closed\n3,b\n', r"line 3: malformed CSV \(unexpected end of data"),
    ('id,text\n1,"a"b\n', r"line 2: malformed CSV"),
])
def test_csv_errors_name_the_line(tmp_path, content, message):
  path = _write(tmp_path, "docs.csv", content)
  with pytest.raises(CorpusError, match=r"docs\.csv, " + message):
    load_corpus(path)


def test_csv_long_field_beyond_the_csv_default_limit(tmp_path):
  before = csv.field_size_limit()
  long_text = "x" * (before + 10)
  path = _write(tmp_path, "docs.csv", f"text\n{long_text}\n")
  assert load_corpus(path).texts == [long_text]
  assert csv.field_size_limit() == before  # the global limit is restored


# ---------------------------------------------------------------- files and arguments


def test_empty_file_and_nothing_left(tmp_path):
  with pytest.raises(CorpusError, match=r"docs\.jsonl is empty"):
    load_corpus(_write(tmp_path, "docs.jsonl", ""))
  with pytest.raises(CorpusError, match=r"no documents left.*skipped 2 empty"):
    load_corpus(_write(tmp_path, "blank.jsonl", '\n{"text": " "}\n'))
  with pytest.raises(CorpusError, match=r"no documents left"):
    load_corpus(_write(tmp_path, "header.csv", "text\n"))


def test_unknown_extension_lists_the_supported_ones(tmp_path):
  path = _write(tmp_path, "docs.txt", "hello\n")
  with pytest.raises(CorpusError, match=r"unknown extension '\.txt'; supported: \.csv, \.jsonl, "
                     r"\.ndjson, \.tsv"):
    load_corpus(path)


def test_bad_arguments(tmp_path):
  path = _write(tmp_path, "docs.jsonl", '{"text": "a"}\n')
  with pytest.raises(ValueError, match="on_duplicate"):
    load_corpus(path, on_duplicate="drop")
  with pytest.raises(ValueError, match="on_empty"):
    load_corpus(path, on_empty="keep")
  with pytest.raises(ValueError, match="on_bad_utf8"):
    load_corpus(path, on_bad_utf8="ignore")
  with pytest.raises(ValueError, match="file_format"):
    load_corpus(path, file_format="parquet")
  with pytest.raises(FileNotFoundError):
    load_corpus(tmp_path / "missing.jsonl")
  folder = tmp_path / "dir.jsonl"
  folder.mkdir()
  with pytest.raises(CorpusError, match="is a folder"):
    load_corpus(folder)
