"""The REST triton backend renders chat with the model's own template: kiln's Triton export puts
the template and special tokens in config.pbtxt, and the backend reads them from the server's
model config (before the first request, since chat renders first)."""

from __future__ import annotations

import json

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from kiln.serving.chat_template import render_chat, triton_chat_config

# newlines, quotes, backslashes and non-ASCII text: what the pbtxt string must carry intact
TEMPLATE = (
    "{% for m in messages %}<|user|>\n{{ m['content'] }}\\n \"ok\" 日本語{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def as_served(pbtxt: str) -> dict:
    """What `get_model_config(as_json=True)["config"]` returns for this config.pbtxt."""
    cfg = text_format.Parse(pbtxt, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def export(tmp_path, template: str | None) -> str:
    from kiln.serving.export.hf import export_hf
    from kiln.serving.export.triton import export_triton
    from tests.engine.tiny import tiny_generator, train_tokenizer

    hf = tmp_path / "hf"
    export_hf(tiny_generator("llama", train_tokenizer()), str(hf))
    config = json.loads((hf / "tokenizer_config.json").read_text())
    if template is not None:
        config["chat_template"] = TEMPLATE
    config["eos_token"] = "<|endoftext|>"
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    model_dir = export_triton(str(hf), str(tmp_path / "repo"), model_name="tiny")
    with open(f"{model_dir}/config.pbtxt", encoding="utf-8") as f:
        return f.read()


def test_export_carries_the_models_template_and_the_backend_renders_with_it(tmp_path, monkeypatch):
    import tritonclient.grpc as grpcclient

    from kiln.serving.backends.triton import TritonBackend

    served = as_served(export(tmp_path, TEMPLATE))
    template, special = triton_chat_config(served)
    assert template == TEMPLATE
    assert special["eos_token"] == "<|endoftext|>"

    calls = []

    class Client:  # the server's get_model_config, as tritonclient returns it
        def __init__(self, url):
            calls.append(url)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def get_model_config(self, name, as_json=False):
            assert name == "tiny" and as_json
            return {"config": served}

    monkeypatch.setattr(grpcclient, "InferenceServerClient", Client)
    backend = TritonBackend("grpc://localhost:1", "tiny")
    messages = [{"role": "user", "content": "hi"}]
    prompt = render_chat(messages, backend.chat_template, backend.special_tokens)
    assert prompt == '<|user|>\nhi\\n "ok" 日本語<|endoftext|>\n<|assistant|>\n'
    assert backend.special_tokens["eos_token"] == "<|endoftext|>"
    assert calls == ["localhost:1"]  # read once


def test_a_model_without_a_template_gets_chatml(tmp_path):
    template, _ = triton_chat_config(as_served(export(tmp_path, None)))
    assert template is None
    prompt = render_chat([{"role": "user", "content": "hi"}], template, {})
    assert prompt.startswith("<|im_start|>user\nhi<|im_end|>")
