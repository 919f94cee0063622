"""Continued pretraining: a Hugging Face Llama imported with `kiln import-hf` starts a training run
(`checkpoint.init_from`) with exactly its weights and a fresh optimizer; once the run has its own
checkpoint, resuming wins over init_from."""

from __future__ import annotations

import torch

from kiln.model.formats.weights import import_model
from kiln.training.checkpoint import load_model_state
from kiln.training.config import TrainConfig
from kiln.training.trainer import Trainer


def _hf_llama(tmp_path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    path = str(tmp_path / "hf")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _config(model_cfg: dict, ckpt_dir: str, init_from: str, steps: int) -> TrainConfig:
    return TrainConfig(
        model=model_cfg,
        steps=steps,
        seq_len=32,
        global_batch_size=2,
        micro_batch_size=2,
        parallel={"dp_shard": 1},
        data={"synthetic": True},
        checkpoint={"dir": ckpt_dir, "init_from": init_from},
    )


def test_init_from_imported_hf_weights_then_resume_wins(tmp_path):
    root = str(tmp_path / "imported")
    import_model(_hf_llama(tmp_path), root)
    model_cfg, imported = load_model_state(root)

    trainer = Trainer(_config(model_cfg, str(tmp_path / "run"), root, steps=2)).setup()
    assert trainer.step == 0  # a fresh run, not a resumed one
    live = trainer.model_parts[0].state_dict()
    for name, tensor in imported.items():
        torch.testing.assert_close(live[name], tensor, rtol=0, atol=0)
    trainer.train()

    resumed = Trainer(_config(model_cfg, str(tmp_path / "run"), root, steps=3)).setup()
    assert resumed.step == 2  # the run's own latest checkpoint, not the imported weights
    _, saved = load_model_state(str(tmp_path / "run"))
    for name, tensor in saved.items():
        torch.testing.assert_close(
            resumed.model_parts[0].state_dict()[name], tensor, rtol=0, atol=0
        )


def test_a_new_run_from_another_runs_checkpoint_saves_its_own_last_step(tmp_path):
    """init_from a checkpoint taken at step N, then train N steps: the new run's final save is
    its own (it used to be skipped as "already saved at step N", and the source was reported as
    the new run's newest checkpoint)."""
    model_cfg = {"preset": "tiny", "n_layers": 1}
    first = str(tmp_path / "first")
    Trainer(_config(model_cfg, first, None, steps=2)).setup().train()
    second = str(tmp_path / "second")
    trainer = Trainer(_config(model_cfg, second, first, steps=2)).setup()
    assert trainer.checkpointer.committed is None  # nothing of this run is saved yet
    trainer.train()
    step, path = trainer.checkpointer.committed
    assert step == 2 and path.startswith(second)
    resumed = Trainer(_config(model_cfg, second, first, steps=3)).setup()
    assert resumed.step == 2
