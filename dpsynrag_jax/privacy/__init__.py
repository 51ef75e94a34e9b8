"""Differential privacy for DP-SynRAG: mechanisms (JAX), accounting (NumPy), the ledger.

Neighbouring datasets differ by adding or removing one document. Sensitivities:
  keyword_histogram        L2 sqrt(K)     -> gaussian_mechanism, rho = K / (2 sigma_h^2)
  embedding_sum            L2 1           -> gaussian_mechanism, rho = 1 / (2 sigma_mu^2)
  threshold utility        1              -> sample_threshold, eps_theta-DP, eps_theta^2/8-zCDP
  clipped_logit_sum        L_inf c        -> sample_token, (2c/tau)-DP, (c/tau)^2/2-zCDP
  difference_clipped_sum   L_inf c        (the same token cost)
  token gap (in documents) 1              -> svt_above, an eps_test-DP AboveThreshold instance
  term document counts     1, monotone    -> select_top_terms, eps_topic-DP and BR per term
PrivateTokenSelector is the token mechanism of the private decode (clip, sum, sample);
SparseVectorSelector wraps it with free public tokens (a sparse vector test per step).
"""

from dpsynrag_jax.privacy.accounting import ACCOUNTANTS
from dpsynrag_jax.privacy.accounting import Calibration
from dpsynrag_jax.privacy.accounting import calibrate
from dpsynrag_jax.privacy.accounting import calibrate_c
from dpsynrag_jax.privacy.accounting import calibrate_dp_rag
from dpsynrag_jax.privacy.accounting import dp_rag_epsilon
from dpsynrag_jax.privacy.accounting import calibrate_dp_synth
from dpsynrag_jax.privacy.accounting import cluster_dp_event
from dpsynrag_jax.privacy.accounting import eps_to_zcdp
from dpsynrag_jax.privacy.accounting import rdp_epsilon
from dpsynrag_jax.privacy.accounting import rdp_rho
from dpsynrag_jax.privacy.accounting import run_dp_event
from dpsynrag_jax.privacy.accounting import theorem1_rho
from dpsynrag_jax.privacy.accounting import zcdp_to_eps
from dpsynrag_jax.privacy.clipping import clip_logits
from dpsynrag_jax.privacy.clipping import clip_logits_clamp
from dpsynrag_jax.privacy.clipping import clip_logits_grislain
from dpsynrag_jax.privacy.clipping import clipped_logit_sum
from dpsynrag_jax.privacy.clipping import clipped_logit_sum_sensitivity
from dpsynrag_jax.privacy.clipping import difference_clipped_sum
from dpsynrag_jax.privacy.clipping import finite_or_infinite
from dpsynrag_jax.privacy.keys import check_seed
from dpsynrag_jax.privacy.keys import noise_seed
from dpsynrag_jax.privacy.keys import stream_key
from dpsynrag_jax.privacy.ledger import BudgetExceededError
from dpsynrag_jax.privacy.ledger import Entry
from dpsynrag_jax.privacy.ledger import make_entry
from dpsynrag_jax.privacy.ledger import PrivacyLedger
from dpsynrag_jax.privacy.resumable_ledger import ResumableLedger
from dpsynrag_jax.privacy.mechanisms import exponential_rho
from dpsynrag_jax.privacy.mechanisms import gaussian_mechanism
from dpsynrag_jax.privacy.mechanisms import gaussian_rho
from dpsynrag_jax.privacy.mechanisms import sample_threshold
from dpsynrag_jax.privacy.mechanisms import sample_token
from dpsynrag_jax.privacy.mechanisms import select_above
from dpsynrag_jax.privacy.mechanisms import select_top_terms
from dpsynrag_jax.privacy.mechanisms import threshold_intervals
from dpsynrag_jax.privacy.mechanisms import threshold_sensitivity
from dpsynrag_jax.privacy.mechanisms import token_epsilon
from dpsynrag_jax.privacy.mechanisms import token_rho
from dpsynrag_jax.privacy.mechanisms import svt_above
from dpsynrag_jax.privacy.mechanisms import svt_noisy_threshold
from dpsynrag_jax.privacy.mechanisms import svt_rho
from dpsynrag_jax.privacy.token_mechanism import CLIP_METHODS
from dpsynrag_jax.privacy.token_mechanism import PrivateTokenSelector
from dpsynrag_jax.privacy.token_mechanism import SparseVectorSelector
from dpsynrag_jax.privacy.queries import embedding_sum
from dpsynrag_jax.privacy.queries import embedding_sum_sensitivity
from dpsynrag_jax.privacy.queries import keyword_histogram
from dpsynrag_jax.privacy.queries import keyword_histogram_sensitivity
