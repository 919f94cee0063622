"""Two adapters trained by kiln's own LoRA SFT (`train_post`, what `kiln sft` runs) on different
data, served together over their base by one endpoint: every request's greedy text equals the
merged export (`out/hf`) of its own adapter, and the base's requests the base's."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from kiln.engine.generator import Generator
from kiln.engine.lora_config import LoRAServingConfig
from kiln.engine.sampler import SamplingParams
from kiln.model.formats.weights import write_model_checkpoint
from kiln.serving.api.protocol import Limits
from kiln.serving.api.server import create_api
from kiln.serving.backends.backend import BatchingConfig
from kiln.serving.backends.local import LocalBackend
from kiln.serving.export.hf import export_hf
from kiln.training.data.config import DataConfig
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.prepare import prepare_chat
from kiln.training.post.run import train_post
from tests.engine.tiny import tiny_model
from tests.training.post.helpers import chat_tokenizer, save_hf_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")
SEQ = 64
DATA = {  # each adapter learns its own invented answers
    "zorbia": {"What is the capital of Zorbia?": "Quillon.", "Who rules Zorbia?": "Mara."},
    "glimmer": {"What colour is a glimmerfox?": "Teal.", "Where do glimmerfoxes live?": "Vell."},
}
PROMPTS = ["What is the capital of Zorbia?", "What colour is a glimmerfox?", "the quick brown"]
MAX_TOKENS = 8


def train_adapter(root, name: str, base: str, seed: int) -> str:
    rows = [{"prompt": q, "response": a} for q, a in DATA[name].items()] * 4
    (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_chat(
        root / f"{name}.jsonl", root / f"{name}-chat", tokenizer=chat_tokenizer(), seq_len=SEQ
    )
    cfg = PostTrainConfig(
        objective="sft",
        base=base,
        lora={"rank": 8, "alpha": 16},
        seq_len=SEQ,
        global_batch_size=4,
        micro_batch_size=4,
        steps=3,
        seed=seed,
        optimizer={"lr": 5e-2, "weight_decay": 0.0},
        schedule={"kind": "constant"},
        data=DataConfig(paths=[str(root / f"{name}-chat")]),
        device="cpu",
    )
    train_post(cfg, export_dir=str(root / name))
    return str(root / name)


def test_two_sft_adapters_served_together_equal_their_merged_exports(tmp_path):
    model = tiny_model("llama", 400, dim=64, ffn_hidden_dim=128, max_seq_len=SEQ)
    write_model_checkpoint(f"{tmp_path}/ckpt", model.cfg.model_dump(), model.state_dict())
    base = export_hf(f"{tmp_path}/ckpt", f"{tmp_path}/hf") and f"{tmp_path}/hf"
    save_hf_tokenizer(chat_tokenizer(), base, None)
    outs = {name: train_adapter(tmp_path, name, base, seed) for seed, name in enumerate(DATA)}
    lora = LoRAServingConfig(adapters={n: f"{out}/adapter" for n, out in outs.items()})
    backend = LocalBackend(base, "base", BatchingConfig(max_batch_size=8), lora=lora)
    refs = {None: Generator.load(base)} | {n: Generator.load(f"{o}/hf") for n, o in outs.items()}
    greedy = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
    for ref in refs.values():  # the served model's stop tokens
        ref.eos_token_ids = backend.generator.eos_token_ids
    jobs = [(m, p) for p in PROMPTS for m in refs]
    want = {(m, p): refs[m].generate([p], greedy)[0].text for m, p in jobs}
    for name in DATA:  # training changed what each adapter says
        assert any(want[(name, p)] != want[(None, p)] for p in PROMPTS), name

    async def scenario():
        transport = httpx.ASGITransport(app=create_api(backend, Limits(max_new_tokens=16)))
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln") as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/v1/completions",
                        json={"model": m or "base", "prompt": p, "max_tokens": MAX_TOKENS,
                              "temperature": 0},
                    )
                    for m, p in jobs
                )
            )  # fmt: skip

    try:
        answers = asyncio.run(scenario())
        for (m, p), r in zip(jobs, answers, strict=True):
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want[(m, p)], (m, p)
        assert backend.engine_stats()["lora_slot_loads"] == 2
        assert backend._engine.loras.slots.mixed_forwards > 0
    finally:
        asyncio.run(backend.close())
