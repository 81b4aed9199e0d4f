"""Builds tiny random models of four real families, with their REAL chat templates and special tokens.

Usage: python3 make_family_models.py OUT_DIR

Writes OUT_DIR/qwen2.5 (Qwen2ForCausalLM), OUT_DIR/qwen3 (Qwen3ForCausalLM), OUT_DIR/llama3.1 and
OUT_DIR/llama3.2 (LlamaForCausalLM). Each folder loads with transformers' AutoModelForCausalLM and
AutoTokenizer and holds:
  config.json, generation_config.json, model.safetensors   (model.save_pretrained; f32, untied)
  tokenizer.json, tokenizer_config.json                     (written here, shaped like the real repos)
  chat_template.jinja                                       (byte-for-byte copy of ../data/templates/*.jinja,
                                                             where transformers 5 keeps the template)
  family.json                                               (the tiny ids of the family's special tokens)

Model: 2 layers, hidden 64, 4 heads / 2 KV heads, head_dim 16, intermediate 128; every weight redrawn
from a fixed seed (embeddings std 1.0, lm_head std 0.5, so logits are far from uniform).
Tokenizer: one byte-level BPE (vocab 1000, trained with `tokenizers` on built-in English/arithmetic
text; the family's real pre-tokenizer regex, so any text encodes) plus the family's real special tokens
as added tokens, in the real order, with the real `special` flags:
  Qwen2.5: <|endoftext|> <|im_start|> <|im_end|> (special), <tool_call> </tool_call> (not special)
  Qwen3:   the same plus <tool_response> </tool_response> <think> </think> (not special)
  Llama 3.1/3.2: <|begin_of_text|> <|end_of_text|> <|start_header_id|> <|end_header_id|> <|eom_id|>
                 <|eot_id|> <|python_tag|> (special); a TemplateProcessing post-processor adds
                 <|begin_of_text|> as the real Llama 3 tokenizer.json does.
eos/bos ids of config.json and generation_config.json mirror the real models, mapped to tiny ids:
  Qwen2.5-Instruct / Qwen3: config eos = <|im_end|>, generation eos = [<|im_end|>, <|endoftext|>],
                            bos = pad = <|endoftext|>
  Llama-3.1/3.2-Instruct:   config and generation eos = [<|end_of_text|>, <|eom_id|>, <|eot_id|>],
                            bos = <|begin_of_text|>
Deterministic: running twice gives byte-identical files.
"""
import json
import os
import random
import sys

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "data", "templates")
BPE_VOCAB = 1000

# The real pre-tokenizer regexes (Qwen2/2.5/3 tokenizer.json, Llama 3 tokenizer.json).
QWEN_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

QWEN25_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<tool_call>", False), ("</tool_call>", False)]
QWEN3_ADDED = QWEN25_ADDED + [("<tool_response>", False), ("</tool_response>", False),
                              ("<think>", False), ("</think>", False)]
LLAMA3_ADDED = [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                ("<|end_header_id|>", True), ("<|eom_id|>", True), ("<|eot_id|>", True),
                ("<|python_tag|>", True)]

FAMILIES = {
    "qwen2.5": dict(template="Qwen-Qwen2.5-7B-Instruct.jinja", added=QWEN25_ADDED, regex=QWEN_REGEX,
                    seed=25, sampling=dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20,
                                           repetition_penalty=1.05)),
    "qwen3": dict(template="Qwen-Qwen3-0.6B.jinja", added=QWEN3_ADDED, regex=QWEN_REGEX, seed=3,
                  sampling=dict(do_sample=True, temperature=0.6, top_p=0.95, top_k=20)),
    "llama3.1": dict(template="meta-llama-Llama-3.1-8B-Instruct.jinja", added=LLAMA3_ADDED,
                     regex=LLAMA3_REGEX, seed=31, sampling=dict(do_sample=True, temperature=0.6, top_p=0.9)),
    "llama3.2": dict(template="meta-llama-Llama-3.2-3B-Instruct.jinja", added=LLAMA3_ADDED,
                     regex=LLAMA3_REGEX, seed=32, sampling=dict(do_sample=True, temperature=0.6, top_p=0.9)),
}

SENTENCES = [
    "You are a helpful assistant.",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "The agent reads the question, calls a tool, and answers with the result.",
    "What is the weather like in Paris today?",
    "Please reason step by step, and put your final answer within a box.",
    "The calculator returns the sum of the two numbers.",
    "Cutting Knowledge Date: December 2023",
    "Today Date: 26 Jul 2024",
    "Environment: ipython",
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.",
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables.",
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments within XML tags:",
    "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12 + 30\"}}",
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}}, \"required\": [\"query\"]}}}",
    "system user assistant tool ipython",
    "The quick brown fox jumps over the lazy dog.",
    "A policy is trained with rewards from an environment; the learner updates the weights.",
    "Let me think about this. First, add the tens; then add the ones.",
    "The answer is 42.",
    "I don't know, but I'll check the tool's output and we'll see.",
    "Hello! How can I help you today?",
    "Thank you. Is there anything else you would like to know?",
    "The model generates tokens until it reaches the end of the turn.",
    "Reinforcement learning of language model agents needs many rollouts.",
    "The reference model and the critic share the same tokenizer.",
    "Here is the result of the search: three pages were found.",
    "Once upon a time, a small robot lived in a quiet village near the mountains.",
    "Every morning it walked to the river, counted the stones, and wrote the numbers in a notebook.",
    "The teacher asked the students to explain their reasoning before giving the final answer.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The library opens at nine o'clock and closes at six in the evening.",
    "She bought apples, oranges, bananas and grapes at the market.",
    "Python, Rust and JavaScript are popular programming languages.",
    "The function takes a list of integers and returns their average.",
    "Error: the file was not found. Please check the path and try again.",
    "The train leaves the station at half past seven every weekday.",
    "Mathematics is the study of numbers, shapes, patterns and change.",
    "A triangle has three sides; a square has four equal sides.",
    "The price of the book is twelve dollars, plus tax.",
    "Scientists measure temperature, pressure and humidity every hour.",
    "He opened the window because the room was warm and bright.",
    "The sun rises in the east and sets in the west.",
    "Computers store information as sequences of bits and bytes.",
    "Please summarize the following article in two sentences.",
    "Translate the sentence into French, German and Spanish.",
    "The meeting was moved from Tuesday to Thursday afternoon.",
    "Our results show a significant improvement over the baseline.",
    "Write a short poem about the ocean, the wind and the stars.",
    "The recipe needs flour, sugar, butter, eggs and a pinch of salt.",
    "Large language models predict the next token given the previous ones.",
    "The weather forecast says it will rain tomorrow, then clear up on Friday.",
    "Check whether the number is prime; if it is, print yes, otherwise print no.",
    "The population of the city grew quickly during the last century.",
    "Good questions often lead to better answers and deeper understanding.",
    "Sorting algorithms include bubble sort, merge sort and quick sort.",
    "The garden has roses, tulips, lilies and a tall oak tree.",
    "January, February, March, April, May, June, July, August, September, October, November, December.",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.",
    "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.",
]


def corpus():
    """A few hundred lines of built-in English and arithmetic, fixed by a seed."""
    rng = random.Random(1234)
    lines = list(SENTENCES) * 4
    ops = [("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b)]
    for _ in range(300):
        a, b = rng.randint(0, 99), rng.randint(1, 99)
        sym, fn = ops[rng.randrange(3)]
        lines.append(f"What is {a} {sym} {b}? {a} {sym} {b} = {fn(a, b)}.")
    for _ in range(100):
        s = rng.choice(SENTENCES).split()
        rng.shuffle(s)
        lines.append(" ".join(s))
    return lines


def bpe_tokenizer(regex, llama):
    tok = Tokenizer(models.BPE(ignore_merges=llama) if llama else models.BPE())
    if not llama:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=not llama, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    return tok


def family_tokenizer(spec, llama):
    tok = bpe_tokenizer(spec["regex"], llama)
    for content, special in spec["added"]:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    ids = {content: tok.token_to_id(content) for content, _ in spec["added"]}
    if llama:
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, ids[bos])]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok, ids


def added_tokens_decoder(spec, ids):
    return {str(ids[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": s} for c, s in spec["added"]}


def tokenizer_config(name, spec, ids):
    if name.startswith("qwen"):
        return {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added_tokens_decoder(spec, ids),
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "model_max_length": 131072,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
    return {
        "added_tokens_decoder": added_tokens_decoder(spec, ids),
        "bos_token": "<|begin_of_text|>",
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def build_model(name, ids, vocab_size):
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                  tie_word_embeddings=False, use_cache=True, dtype="float32")
    if name == "qwen2.5":
        cfg = Qwen2Config(**common, max_position_embeddings=32768, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          use_sliding_window=False, sliding_window=None,
                          bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
        return Qwen2ForCausalLM(cfg)
    if name == "qwen3":
        cfg = Qwen3Config(**common, max_position_embeddings=40960, rms_norm_eps=1e-6, attention_bias=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          use_sliding_window=False, sliding_window=None,
                          bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
        return Qwen3ForCausalLM(cfg)
    factor = 8.0 if name == "llama3.1" else 32.0
    cfg = LlamaConfig(**common, max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=False,
                      mlp_bias=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192},
                      bos_token_id=ids["<|begin_of_text|>"],
                      eos_token_id=[ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]])
    return LlamaForCausalLM(cfg)


def redraw(model, seed):
    """Every parameter redrawn from one generator, in name order: the logits are far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("embed_tokens.weight"):
                p.copy_(1.0 * torch.randn(p.shape, generator=g))
            elif name.startswith("lm_head"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # attention and MLP matrices: std ~ 1.5 / sqrt(fan_in)
                p.copy_(1.5 / p.shape[1] ** 0.5 * torch.randn(p.shape, generator=g))


def generation_config(name, ids, sampling):
    if name.startswith("qwen"):
        eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
        return GenerationConfig(bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"],
                                eos_token_id=eos, **sampling)
    eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
    return GenerationConfig(bos_token_id=ids["<|begin_of_text|>"], eos_token_id=eos, **sampling)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def build(out, name, spec):
    llama = name.startswith("llama")
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    tok, ids = family_tokenizer(spec, llama)
    # Qwen's embedding is padded past the tokenizer (151936 rows for 151665 tokens); Llama 3's is not.
    vocab_size = tok.get_vocab_size() if llama else 1024
    torch.manual_seed(spec["seed"])
    model = build_model(name, ids, vocab_size).float().eval()
    redraw(model, spec["seed"])
    model.generation_config = generation_config(name, ids, spec["sampling"])
    model.save_pretrained(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    write_json(os.path.join(d, "tokenizer_config.json"), tokenizer_config(name, spec, ids))
    with open(os.path.join(TEMPLATES, spec["template"]), "rb") as f:
        template = f.read()
    with open(os.path.join(d, "chat_template.jinja"), "wb") as f:
        f.write(template)
    write_json(os.path.join(d, "family.json"), {
        "family": name, "template": spec["template"], "vocab_size": vocab_size,
        "tokenizer_size": tok.get_vocab_size(), "special_token_ids": ids,
        "special_flags": {c: s for c, s in spec["added"]},
        "config_eos_token_id": model.config.eos_token_id,
        "generation_eos_token_id": model.generation_config.eos_token_id,
    })
    return ids


def main(out):
    for name, spec in FAMILIES.items():
        ids = build(out, name, spec)
        print(name, json.dumps(ids))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
