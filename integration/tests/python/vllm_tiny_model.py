"""Writes the tiny model the vLLM engine tests serve: a 2-layer Qwen2 with head_dim 32 (vLLM's
CPU attention needs at least that), untied embeddings (vLLM on CPU applies only part of a tied
model's reload) and weights drawn with std 0.25, so that its log-probs are far from uniform
(a near-uniform model makes every log-prob comparison pass vacuously). The tokenizer is the
byte-level BPE with a ChatML template of learner/tests/python/make_tiny_models.py.

usage: vllm_tiny_model.py OUT_DIR [SEED] [tied|untied] [HEAD_DIM]
  tied: tie the embeddings, as SmolLM2 does; HEAD_DIM (default 32): below 32 makes a model keel
  loads and vLLM's CPU attention refuses (the bad-input test)
"""

import json
import os
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../learner/tests/python"))
from make_tiny_models import tokenizer  # noqa: E402

out = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
tied = len(sys.argv) > 3 and sys.argv[3] == "tied"
head_dim = int(sys.argv[4]) if len(sys.argv) > 4 else 32
torch.manual_seed(seed)
tok = tokenizer()
config = Qwen2Config(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=64 // head_dim,
    num_key_value_heads=1,
    max_position_embeddings=1024,
    tie_word_embeddings=tied,
    initializer_range=0.25,
    bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
)
assert len(tok) <= config.vocab_size
model = Qwen2ForCausalLM(config).to(torch.float32).eval()
model.save_pretrained(out)
tok.save_pretrained(out)
ids = torch.arange(1, 33).unsqueeze(0)
with torch.no_grad():
    logp = torch.log_softmax(model(ids).logits.float(), -1)
entropy = -(logp.exp() * logp).sum(-1).mean().item()
print(json.dumps({"dir": out, "mean_entropy": entropy, "uniform": float(torch.log(torch.tensor(384.0)))}))
