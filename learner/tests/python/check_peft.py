"""Loads keel's unmerged LoRA export with peft and runs it on reference inputs.

Usage: python3 check_peft.py INPUTS.safetensors OUT.safetensors BASE_DIR ADAPTER_DIR
Stores `lora` (the logits of PeftModel.from_pretrained(base, ADAPTER_DIR)) and `base` (the same
model with its adapters disabled) for INPUTS' `input_ids`.
"""
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def main(inputs, out, base_dir, adapter_dir):
    ids = load_file(inputs)["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        lora = model(input_ids=ids).logits.float().contiguous()
        with model.disable_adapter():
            plain = model(input_ids=ids).logits.float().contiguous()
    save_file({"lora": lora, "base": plain}, out)
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:5])
