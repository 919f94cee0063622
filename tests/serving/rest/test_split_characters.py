"""The local backend's answer text for a token-id prompt that ends inside a UTF-8 character: the
completion's first bytes finish that character (as in transformers' full decode of prompt +
completion), instead of a U+FFFD from decoding the completion alone."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from kiln.engine.request import EngineEvent
from kiln.engine.sampler import SamplingParams
from kiln.serving.backends.backend import Job
from kiln.serving.backends.local import LocalBackend
from tests.engine.test_detokenize import byte_ids


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    backend = LocalBackend(tiny_model_dir)
    yield backend
    backend._engine.stop()


def test_token_id_prompt_cut_inside_a_character(backend):
    tok = backend.generator.tokenizer
    prompt = tok.encode("the fox ").ids + byte_ids(tok, "狐")[:2]
    completion = byte_ids(tok, "狐")[2:] + byte_ids(tok, "が跳ぶ") + tok.encode(" dog").ids
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    assert hf.decode(prompt + completion) == "the fox 狐が跳ぶ dog"
    job = Job(prompt, SamplingParams(max_new_tokens=len(completion)), prompt)
    assert backend._result_from_ids(job, completion).text == "狐が跳ぶ dog"
    stopped = Job(prompt, SamplingParams(max_new_tokens=99, stop=[" dog"]), prompt)
    assert backend._result_from_ids(stopped, completion).text == "狐が跳ぶ"
    # a finished stream's last text: the engine's stop-cut decode lacks the prompt's bytes
    cut = backend.generator.decode(completion)[: -len(" dog")]
    event = EngineEvent("finish", completion, "stop", text=cut)
    assert event.text.startswith("\ufffd")
    assert backend._final_text(stopped, event) == "狐が跳ぶ"
