"""Model code: decoder LMs, sentence encoders, checkpoint loading. No privacy, no datasets.

    lm = load_lm("smollm2-135m-instruct")   # preset, HF folder, hub id, or .gguf file
    enc = load_encoder("all-minilm-l6-v2")
"""

from dpsynrag_jax.models.checkpoint import CheckpointError
from dpsynrag_jax.models.config import DecoderConfig, RopeConfig, from_hf_config
from dpsynrag_jax.models.kv_cache import KVCache, init_cache
from dpsynrag_jax.models.language_model import (LanguageModel, bucket_batch, bucket_length,
                                                load_lm, random_lm)
from dpsynrag_jax.models.encoder import SentenceEncoder, load_encoder
from dpsynrag_jax.models.presets import DTYPES, dtype_named
