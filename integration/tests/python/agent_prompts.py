"""Token ids transformers renders for the conversations agents logged through keel's gateway.

Usage: python3 agent_prompts.py MODEL_DIR LOG_DIR OUT.json
For every LOG_DIR/*.json ({"messages", "tools"}) writes, in file-name order:
  first:  the first call's messages (up to and with the first user message after the preamble,
          i.e. everything before the first assistant message) with `tools` and the generation
          prompt: what keel's first prompt must be (CC-1).
  whole:  the whole conversation with `tools` (assistant turns as the agent echoed them).
  answers: the assistant contents the agent received, in order.
  logprobs: per answer, the content tokens' log-probs the gateway returned (when asked).
  segments: for each conversation a segment started from (an agent that rewrote its history,
          "segments" in the log), its ids with `tools` and the generation prompt. Tool-call
          arguments are given to the template as objects, as transformers documents them.
"""
import json
import os
import sys

from transformers import AutoTokenizer


def ids(tok, messages, tools, generation):
    out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=generation,
                                  tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def with_object_arguments(messages):
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"],
                                   "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]]
        out.append(m)
    return out


def main(folder, logs, out):
    tok = AutoTokenizer.from_pretrained(folder)
    result = []
    for name in sorted(os.listdir(logs)):
        log = json.load(open(os.path.join(logs, name)))
        messages, tools = log["messages"], log["tools"]
        first_answer = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        result.append({
            "first": ids(tok, messages[:first_answer], tools, True),
            "whole": ids(tok, messages, tools, False),
            "answers": [m.get("content") or "" for m in messages if m["role"] == "assistant"],
            "logprobs": log.get("logprobs") or [],
            "segments": [ids(tok, with_object_arguments(s), tools, True)
                         for s in log.get("segments") or []],
        })
    json.dump(result, open(out, "w"))
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
