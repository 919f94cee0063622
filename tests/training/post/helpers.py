"""A tokenizer trained on the spot with chat control tokens, saved as a HF tokenizer directory."""

from __future__ import annotations

import json
import os

import torch

from kiln.training.post.chat_dataset import IGNORE_INDEX
from kiln.training.post.objectives import token_logps

SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "what is the capital of france? paris is the capital of france.",
    "kiln turns raw text into a served language model",
    "you are a helpful assistant. answer briefly.",
    "東京は日本の首都です。 富士山は日本で一番高い山です。",
]

# ChatML with transformers' {% generation %} markers around what the assistant writes.
CHATML_GENERATION = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Llama-2 style: bos/eos variables, a system block, whitespace control and raise_exception.
LLAMA2_STYLE = """{{ bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- '<<SYS>>\\n' + message['content'] | trim + '\\n<</SYS>>\\n\\n' }}
    {%- elif message['role'] == 'user' %}
        {{- '[INST] ' + message['content'] | trim + ' [/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- else %}
        {{- raise_exception('unknown role') }}
    {%- endif %}
{%- endfor %}
"""

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital of France."},
    {"role": "user", "content": "東京は？"},
    {"role": "assistant", "content": "東京は日本の首都です。"},
]


def chat_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    return tok


def save_hf_tokenizer(tok, out_dir: str, chat_template: str | None) -> str:
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return out_dir


def per_document_losses(
    logits: torch.Tensor, labels: torch.Tensor, document_ids: torch.Tensor
) -> dict[tuple[int, int], torch.Tensor]:
    """Mean loss of each (row, document) of a packed batch: comparable with unpacked rows."""
    nll = -token_logps(logits, labels)
    trained = labels != IGNORE_INDEX
    out = {}
    for row in range(labels.shape[0]):
        for doc in document_ids[row].unique().tolist():
            sel = (document_ids[row] == doc) & trained[row]
            if doc >= 0 and sel.any():
                out[(row, doc)] = nll[row][sel].mean()
    return out
