"""Chat templates render and tokenise exactly as transformers' apply_chat_template does."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.text.chat_template import CHATML, ChatTemplate, add_chat_tokens
from kiln.training.post.chat_encode import encode_chat
from tests.training.post.helpers import (
    CHATML_GENERATION,
    CONVERSATION,
    LLAMA2_STYLE,
    chat_tokenizer,
    save_hf_tokenizer,
)


def _hf_ids(hf_tok, messages, **kwargs):
    out = hf_tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("source", [CHATML, CHATML_GENERATION, LLAMA2_STYLE])
def test_token_ids_equal_transformers_apply_chat_template(source, tmp_path):
    from transformers import AutoTokenizer

    tok = chat_tokenizer()
    path = save_hf_tokenizer(tok, str(tmp_path / "tok"), source)
    hf_tok = AutoTokenizer.from_pretrained(path)
    template = ChatTemplate.from_pretrained(path)
    assert template.special_tokens["bos_token"] == "<s>"
    for messages in (CONVERSATION, CONVERSATION[1:3]):
        ids, _ = encode_chat(template, tok, messages, loss_mask="all")
        assert ids.tolist() == _hf_ids(hf_tok, messages)
        assert template.render(messages) == hf_tok.apply_chat_template(messages, tokenize=False)
    prompt = CONVERSATION[:2]
    assert template.render(prompt, add_generation_prompt=True) == hf_tok.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=True
    )


def test_builtin_chatml_equals_transformers_with_the_same_template(tmp_path):
    from transformers import AutoTokenizer

    tok = chat_tokenizer()
    hf_tok = AutoTokenizer.from_pretrained(save_hf_tokenizer(tok, str(tmp_path / "t"), CHATML))
    ids, _ = encode_chat(ChatTemplate.builtin("chatml"), tok, CONVERSATION)
    assert ids.tolist() == _hf_ids(hf_tok, CONVERSATION)
    assert ChatTemplate.builtin("chatml").end_of_turn == "<|im_end|>"


def test_assistant_mask_equals_transformers_generation_mask(tmp_path):
    """transformers marks `{% generation %}` text; kiln finds the same tokens by rendering prefixes
    (so it also works on the many templates without the markers)."""
    from transformers import AutoTokenizer

    tok = chat_tokenizer()
    path = save_hf_tokenizer(tok, str(tmp_path / "tok"), CHATML_GENERATION)
    hf = AutoTokenizer.from_pretrained(path).apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = encode_chat(ChatTemplate.from_pretrained(path), tok, CONVERSATION)
    assert ids.tolist() == list(hf["input_ids"])
    assert mask.tolist() == list(hf["assistant_masks"])
    assert 0 < mask.sum() < len(mask)


def test_loss_mask_modes_select_turns():
    tok = chat_tokenizer()
    template = ChatTemplate.builtin("chatml")
    ids, every = encode_chat(template, tok, CONVERSATION, "all")
    _, assistant = encode_chat(template, tok, CONVERSATION, "assistant")
    _, last = encode_chat(template, tok, CONVERSATION, "last")
    assert every.all()
    assert (last <= assistant).all() and 0 < last.sum() < assistant.sum()
    decoded = tok.decode(ids[last.astype(bool)].tolist(), skip_special_tokens=False)
    assert decoded == "東京は日本の首都です。<|im_end|>"
    first = tok.decode(ids[(assistant - last).astype(bool)].tolist(), skip_special_tokens=False)
    assert first == "Paris is the capital of France.<|im_end|>"


def test_add_chat_tokens_makes_control_tokens_single_ids():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["hello there"] * 4,
        trainers.BpeTrainer(
            vocab_size=300,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    template = ChatTemplate.builtin("chatml")
    assert len(tok.encode("<|im_end|>").ids) > 1
    assert add_chat_tokens(tok, template) == ["<|im_start|>", "<|im_end|>"]
    assert len(tok.encode("<|im_end|>").ids) == 1
    assert add_chat_tokens(tok, template) == []
    ids, mask = encode_chat(template, tok, CONVERSATION[1:3])
    assert np.asarray(ids).dtype == np.int64 and mask.any()
