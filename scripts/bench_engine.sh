#!/usr/bin/env bash
# keel's built-in sampler against the vLLM backend in the loop, on CPU: the same `keel train` job
# on calc (a random 6-layer tied Qwen2, hidden 256, f32; 4 RL steps of 8x4 episodes) once per
# backend, with tokens/s, their ratio, the engine/trainer log-prob mismatch and the weight swap
# time per version (scripts/python/bench_engine.py). About 1.5 minutes on 2 cores once vLLM is
# installed (scripts/vllm_env.sh, ~2.5 minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
VLLM_PY=${KEEL_VLLM_PYTHON:-$(bash scripts/vllm_env.sh)}
cargo build --release -p keel-ops
OUT=$(mktemp -d -t keel-bench-engine-XXXX)
trap 'rm -rf "$OUT"' EXIT
python3 - "$OUT/model" <<'PYEOF'
import sys, torch
sys.path.insert(0, "learner/tests/python")
from make_tiny_models import tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
tok = tokenizer()
cfg = Qwen2Config(vocab_size=384, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=True, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                  eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
Qwen2ForCausalLM(cfg).float().eval().save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
PYEOF
python3 scripts/python/bench_engine.py --keel target/release/keel --vllm-python "$VLLM_PY" \
  --model "$OUT/model" --out "$OUT" --steps 4 --tasks 8 --group 4 "$@"
