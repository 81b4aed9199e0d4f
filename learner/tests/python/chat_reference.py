"""transformers' reference renderings of a conversation with a model folder's chat template.

Usage: python3 chat_reference.py MODEL_DIR CONVERSATION.json OUT.json

CONVERSATION.json is an object:
  {"messages": [...],                 OpenAI-shaped messages; an assistant tool call is
                                      {"type": "function", "function": {"name": ..., "arguments": {...}}}
   "tools": [...] or null,            passed as apply_chat_template(tools=...)
   "kwargs": {...},                   extra template variables, e.g. {"enable_thinking": false}
   "date": "26 Jul 2024" or null}     pins the date: passed as the template variable `date_string`

Pinning the date: the Llama 3.1 template uses `date_string` when it is defined and "26 Jul 2024"
otherwise; the Llama 3.2 template uses `date_string` when it is defined and otherwise
strftime_now("%d %b %Y"), i.e. TODAY, which makes its output change from day to day. So give "date"
(or "date_string" in kwargs) for Llama 3.2 references. Qwen templates ignore the variable.

OUT.json gets:
  full_ids, full_text   apply_chat_template(messages, tools=tools,
                        add_generation_prompt=<last message is not an assistant's>, **kwargs), with
                        tokenize=True (flat list of ints: transformers 5 returns a BatchEncoding, its
                        input_ids are taken) and tokenize=False
  add_generation_prompt the value used above
  prefixes              one entry per assistant message i: {"index": i, "ids": ..., "text": ...}, the
                        rendering of messages[:i] with add_generation_prompt=True (the prompt the model
                        saw before that turn); ids/text are null when the template cannot render
                        messages[:i] (e.g. i == 0), with "error" saying why
  prefix_ids            {"<i>": ids} for the same prefixes (null where the template failed)
  system_prefix_ids     verl's initialize_system_prompt (verl/utils/chat_template.py): t1 = render
                        [{"role": "user", "content": ""}], t2 = the same message twice, both with
                        add_generation_prompt=False, tokenize=True and NO other arguments (as verl
                        does); system = t1[:-(len(t2) - len(t1))]. For Llama 3.2 this holds today's date.
  system_prefix_ids_with_kwargs   the same computation with this conversation's tools-free kwargs
                        (date pinned), reproducible for every family
  eos_token_ids         sorted union of GenerationConfig.from_pretrained(MODEL_DIR).eos_token_id,
                        the model config's eos_token_id and tokenizer.eos_token_id
  bos_token_id, pad_token_id, eos_token (tokenizer's), template_kwargs (the kwargs used, date included)
  turns_ids             the episode turn by turn, token-in/token-out, every piece rendered by
                        transformers: the prompt before the first assistant message; each assistant
                        message as the template renders it when it is the last one (rendering through
                        it without a generation prompt, less the prompt before it, up to and including
                        its eos token); the text the template puts after that eos token (Qwen's "\n");
                        the messages up to the next assistant message rendered alone with the
                        generation prompt, less system_prefix_ids_with_kwargs (verl's agent loop:
                        apply_chat_template(add_messages, remove_system_prompt=True)). Null with
                        "turns_error" when a piece does not fit (the template cannot be appended to).
"""
import json
import sys

from transformers import AutoConfig, AutoTokenizer, GenerationConfig


def as_ids(out):
    """apply_chat_template(tokenize=True) -> flat list of ints, whatever transformers returned."""
    if hasattr(out, "keys") and "input_ids" in out.keys():
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):
        assert len(out) == 1, "expected one conversation"
        out = list(out[0])
    return [int(i) for i in out]


def id_list(value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def system_prefix(render):
    """verl's initialize_system_prompt on flat ids."""
    t1 = render([{"role": "user", "content": ""}])
    t2 = render([{"role": "user", "content": ""}] * 2)
    return t1[: -(len(t2) - len(t1))]


def turns(messages, render, system, eos):
    """The episode turn by turn with verl's method plus the template's separator (see turns_ids)."""
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    seq = render(messages[: assistants[0]], True, True)
    for k, i in enumerate(assistants):
        before = render(messages[:i], True, True)
        closed = render(messages[: i + 1], False, True)
        assert closed[: len(before)] == before, f"assistant message {i}: its prompt is not a prefix"
        rest = closed[len(before):]
        end = rest.index(eos) + 1
        seq += rest[:end]
        stop = assistants[k + 1] if k + 1 < len(assistants) else len(messages)
        new = messages[i + 1: stop]
        if new:
            alone = render(new, True, True)
            assert alone[: len(system)] == system, f"messages {i + 1}..{stop} alone lack the system prefix"
            seq += rest[end:] + alone[len(system):]
    return seq


def main(model_dir, conversation_path, out_path):
    with open(conversation_path, encoding="utf-8") as f:
        conv = json.load(f)
    messages = conv["messages"]
    tools = conv.get("tools") or None
    kwargs = dict(conv.get("kwargs") or {})
    if conv.get("date") is not None:
        kwargs["date_string"] = conv["date"]

    tok = AutoTokenizer.from_pretrained(model_dir)

    def render(msgs, add_generation_prompt, tokenize, with_tools=True):
        out = tok.apply_chat_template(msgs, tools=tools if with_tools else None,
                                      add_generation_prompt=add_generation_prompt, tokenize=tokenize, **kwargs)
        return as_ids(out) if tokenize else out

    add_gen = messages[-1]["role"] != "assistant"
    result = {
        "model_dir": model_dir,
        "template_kwargs": kwargs,
        "add_generation_prompt": add_gen,
        "full_text": render(messages, add_gen, False),
        "full_ids": render(messages, add_gen, True),
    }

    prefixes, prefix_ids = [], {}
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        entry = {"index": i, "ids": None, "text": None}
        try:
            entry["ids"] = render(messages[:i], True, True)
            entry["text"] = render(messages[:i], True, False)
        except Exception as e:  # e.g. the Qwen templates index messages[0]: an empty prefix fails
            entry["error"] = f"{type(e).__name__}: {e}"
        prefixes.append(entry)
        prefix_ids[str(i)] = entry["ids"]
    result["prefixes"] = prefixes
    result["prefix_ids"] = prefix_ids

    def plain(msgs):  # exactly verl's call: no tools, no template kwargs
        return as_ids(tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=True))

    result["system_prefix_ids"] = system_prefix(plain)
    result["system_prefix_ids_with_kwargs"] = system_prefix(lambda msgs: render(msgs, False, True, False))

    eos = set(id_list(tok.eos_token_id))
    eos |= set(id_list(AutoConfig.from_pretrained(model_dir).eos_token_id))
    try:
        eos |= set(id_list(GenerationConfig.from_pretrained(model_dir).eos_token_id))
    except OSError:  # no generation_config.json
        pass
    result["eos_token_ids"] = sorted(eos)
    result["eos_token"] = tok.eos_token
    result["bos_token_id"] = tok.bos_token_id
    result["pad_token_id"] = tok.pad_token_id

    try:
        result["turns_ids"] = turns(messages, render, result["system_prefix_ids_with_kwargs"], tok.eos_token_id)
    except (AssertionError, ValueError) as e:
        result["turns_ids"], result["turns_error"] = None, str(e)

    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
