"""Token ids of a text-completions agent's prompts as transformers' tokenizer encodes them.

Usage: python3 text_ids.py MODEL_DIR LOGS_DIR OUT.json
For each log of examples/agents/text_agent.py (prompts: first, its retry, the follow-up, and
with --rewrite a fresh prompt) writes: `first` = the first prompt with the tokenizer's special
tokens (as a server encodes a prompt); `rest` = what the follow-up adds after the first prompt
and its answer, without them; `fresh` = the rewritten prompt, if any, with them.
"""
import json
import os
import sys

from transformers import AutoTokenizer


def main(folder, logs, out):
    tok = AutoTokenizer.from_pretrained(folder)
    rows = []
    for name in sorted(os.listdir(logs)):
        log = json.load(open(os.path.join(logs, name)))
        prompts, texts = log["prompts"], log["texts"]
        said = prompts[0] + texts[0]
        assert prompts[2].startswith(said)
        row = {
            "texts": texts,
            "logprobs": log["logprobs"],
            "first": tok(prompts[0])["input_ids"],
            "rest": tok(prompts[2][len(said):], add_special_tokens=False)["input_ids"],
        }
        if len(prompts) > 3:
            row["fresh"] = tok(prompts[3])["input_ids"]
        rows.append(row)
    json.dump(rows, open(out, "w"))
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
