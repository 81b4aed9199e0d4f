"""Loads a folder written by `keel ckpt export` with transformers, as a user would.

Usage: python3 check_export.py DIR TEXT OUT.json
Loads DIR with AutoModelForCausalLM and AutoTokenizer, tokenizes TEXT, renders a two-message chat
with the folder's chat template, runs the model on the ids and writes JSON: the ids, the chat
ids, the architecture and the logits (nested lists, f32).
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(folder, text, out):
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    chat = tok.apply_chat_template(
        [{"role": "user", "content": text}, {"role": "assistant", "content": text}],
        tokenize=True,
    )
    if hasattr(chat, "keys"):
        chat = chat["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    json.dump(
        {
            "ids": ids,
            "chat_ids": list(chat),
            "architecture": type(model).__name__,
            "logits": logits.tolist(),
        },
        open(out, "w"),
    )
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
