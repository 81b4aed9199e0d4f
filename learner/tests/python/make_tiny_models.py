"""Creates tiny random Llama, Qwen2 and Qwen3 models with transformers and dumps reference outputs.

Usage: python3 make_tiny_models.py OUT_DIR

For each architecture ARCH in (llama, qwen2, qwen3), OUT_DIR/ARCH is a model folder saved by
`save_pretrained` (config, safetensors - sharded for llama - tokenizer with a chat template) and
OUT_DIR/ARCH/reference.safetensors holds:
  input_ids [2, 12], logits [2, 12, V] (f32),
  padded_ids [2, 12], padded_mask [2, 12] (row 1 left-padded), padded_logits [2, 12, V],
  prompt_ids [2, 6], greedy_ids [2, 10] (greedy generate with the KV cache, no eos),
  nll [1] (mean next-token NLL of input_ids) and grad.NAME for every parameter NAME.
OUT_DIR/ARCH/reference.json holds tokenizer references: text, ids, chat text and chat ids.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

VOCAB = 320
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A template in the style of Qwen3's: namespace, reversed loops, string methods, tojson, `-` trims.
QWEN3_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\n' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}"
    "{{- '<|im_end|>\n' }}{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "  {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "  {%- if ns.multi_step_tool and message.role == 'user' and not message.content.startswith('<tool_response>') %}\n"
    "    {%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}\n"
    "  {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "  {%- set content = message.content.strip() %}\n"
    "  {%- if message.role == 'assistant' and '</think>' in content %}\n"
    "    {%- set content = content.split('</think>')[-1].lstrip('\n') %}\n"
    "  {%- endif %}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}\n"
    "  {%- if loop.index0 == ns.last_query_index %}{{- '' }}{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
TEXT = "the agent calls the calculator: 12 + 30 = 42, then answers 42."
MESSAGES = [{"role": "system", "content": "You are keel. "},
            {"role": "user", "content": "  what is 12 + 30?"},
            {"role": "assistant", "content": "<think>add</think>\n\n42"},
            {"role": "user", "content": "and 1 + 1?"}]


def tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [TEXT, "user assistant system message content", "what is the answer", "0123456789 +-*/="] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def build(arch):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=None)
    if arch == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=False, attention_bias=True,
                          rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 32})
        return LlamaForCausalLM(cfg)
    if arch == "qwen2":
        cfg = Qwen2Config(**common, tie_word_embeddings=True)
        return Qwen2ForCausalLM(cfg)
    cfg = Qwen3Config(**common, head_dim=16, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg)


def perturb(model, seed):
    """Random norms and biases too (HF initialises them to 1 and 0, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def main(out):
    tok = tokenizer()
    for seed, arch in enumerate(["llama", "qwen2", "qwen3"]):
        torch.manual_seed(seed)
        model = build(arch).float().eval()
        perturb(model, seed)
        d = os.path.join(out, arch)
        model.save_pretrained(d, max_shard_size="150KB" if arch == "llama" else "5GB")
        tok.chat_template = QWEN3_STYLE if arch == "qwen3" else CHATML
        tok.save_pretrained(d)
        g = torch.Generator().manual_seed(100 + seed)
        ids = torch.randint(0, VOCAB, (2, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
        prompt = ids[:, :6].clone()
        with torch.no_grad():
            logits = model(input_ids=ids).logits
            padded = model(input_ids=ids, attention_mask=mask).logits
            greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)[:, 6:]
        # Gradients of the mean next-token NLL (the learner's kind of loss) for every parameter.
        train_logits = model(input_ids=ids).logits
        nll = -torch.log_softmax(train_logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).mean()
        nll.backward()
        grads = {"grad." + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()}
        save_file({"input_ids": ids, "logits": logits.contiguous(), "padded_ids": ids.clone(), "padded_mask": mask,
                   "padded_logits": padded.contiguous(), "prompt_ids": prompt,
                   "greedy_ids": greedy.contiguous(), "nll": nll.detach().reshape(1), **grads},
                  os.path.join(d, "reference.safetensors"))
        chat = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        ref = {"text": TEXT, "ids": tok.encode(TEXT, add_special_tokens=False), "messages": MESSAGES,
               "chat_text": chat, "chat_ids": tok.encode(chat, add_special_tokens=False)}
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
