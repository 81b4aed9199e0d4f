"""Token ids of a chat as transformers renders it with a folder's tokenizer and chat template.

Usage: python3 chat_ids.py DIR PROMPT ACTION OBSERVATION OUT.json
Writes JSON: `prompt` = [user PROMPT] with the generation prompt; `episode` = [user PROMPT,
assistant ACTION, user OBSERVATION] with the generation prompt.
"""
import json
import sys

from transformers import AutoTokenizer


def ids(tok, messages):
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def main(folder, prompt, action, observation, out):
    tok = AutoTokenizer.from_pretrained(folder)
    user = {"role": "user", "content": prompt}
    json.dump({
        "prompt": ids(tok, [user]),
        "episode": ids(tok, [user, {"role": "assistant", "content": action},
                             {"role": "user", "content": observation}]),
    }, open(out, "w"))
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:6])
