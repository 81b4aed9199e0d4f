"""Loads folders saved by keel with transformers and runs them on reference inputs.

Usage: python3 check_saved.py INPUTS.safetensors OUT.safetensors DIR [DIR...]
For each DIR (a keel-saved folder), INPUTS' `input_ids` are run through the model loaded with
AutoModelForCausalLM (or AutoModelForTokenClassification when the config says so) and the
output is stored in OUT under the folder's base name.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification


def main(inputs, out, dirs):
    ids = load_file(inputs)["input_ids"]
    result = {}
    for d in dirs:
        cfg = AutoConfig.from_pretrained(d)
        critic = any(a.endswith("ForTokenClassification") for a in (cfg.architectures or []))
        cls = AutoModelForTokenClassification if critic else AutoModelForCausalLM
        model = cls.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            result[os.path.basename(d.rstrip("/"))] = model(input_ids=ids).logits.float().contiguous()
    save_file(result, out)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
