"""End to end: a short LoRA SFT teaches a tiny model facts it could not know, and the served
export answers them through `/v1/chat/completions` with the real `openai` client."""

from __future__ import annotations

import json

import pytest

from tests.conftest import free_port
from tests.training.post.helpers import chat_tokenizer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning"),
]
SEQ = 64
FACTS = {  # invented: no base model can know them
    "What is the capital of Zorbia?": "Quillon.",
    "Who painted the Blue Kiln?": "Mara Vell.",
    "What colour is a glimmerfox?": "Teal.",
}


def _random_base(root: str) -> str:
    """A random kiln model (peaked logits) over the chat tokenizer's vocabulary, as a HF folder."""
    from kiln.model.formats.weights import write_model_checkpoint
    from kiln.serving.export.hf import export_hf
    from tests.engine.tiny import tiny_model

    model = tiny_model("llama", 400, dim=64, ffn_hidden_dim=128, max_seq_len=SEQ)
    write_model_checkpoint(f"{root}/ckpt", model.cfg.model_dump(), model.state_dict())
    export_hf(f"{root}/ckpt", f"{root}/hf")
    return f"{root}/hf"


def test_sft_facts_are_answered_by_the_served_model(ray_session, tmp_path):
    import openai
    from ray import serve

    from kiln.serving.launch import launch
    from kiln.training.data.config import DataConfig
    from kiln.training.post.config import PostTrainConfig
    from kiln.training.post.prepare import prepare_chat
    from kiln.training.post.run import train_post

    rows = [{"prompt": q, "response": a} for q, a in FACTS.items()] * 4
    (tmp_path / "facts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_chat(
        tmp_path / "facts.jsonl", tmp_path / "chat", tokenizer=chat_tokenizer(), seq_len=SEQ
    )
    cfg = PostTrainConfig(
        objective="sft",
        base=_random_base(str(tmp_path)),
        lora={"rank": 16, "alpha": 32},
        seq_len=SEQ,
        global_batch_size=4,
        micro_batch_size=4,
        steps=20,
        optimizer={"lr": 1e-2, "weight_decay": 0.0},
        schedule={"kind": "constant"},
        data=DataConfig(paths=[str(tmp_path / "chat")]),
        device="cpu",
    )
    summary = train_post(cfg, export_dir=str(tmp_path / "out"))
    assert summary["first_loss"] > 4.0  # the base knows nothing of them
    settings = {"deployment": {"num_cpus": 0.5}, "limits": {"max_new_tokens": 16}}
    endpoint = launch(
        str(tmp_path / "out"), settings, port=free_port(), app_name="facts", route_prefix="/facts"
    )
    try:
        with openai.OpenAI(base_url=endpoint.url + "/v1", api_key="none", max_retries=0) as c:
            for question, answer in FACTS.items():
                reply = c.chat.completions.create(
                    model=endpoint.model_name,
                    messages=[{"role": "user", "content": question}],
                    max_tokens=12,
                    temperature=0,
                )
                assert reply.choices[0].message.content.strip() == answer, question
                assert reply.choices[0].finish_reason == "stop"  # ended on <|im_end|>
    finally:
        endpoint.close()
        serve.shutdown()  # its controller and proxy idle at ~0.04 cores for the rest of the run
