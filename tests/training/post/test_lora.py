"""LoRA as a module swap: forward and gradients equal peft's; the PEFT adapter folder loads in
peft onto the HF export of the base and gives the merged export's logits."""

from __future__ import annotations

import copy

import pytest
import torch

from kiln.model.formats.peft import export_peft_adapter
from kiln.model.lora import (
    LoRAConfig,
    adapter_state_dict,
    adapters_disabled,
    apply_lora,
)
from kiln.training.post.lora_export import export_merged_hf
from tests.training.post.lora_helpers import (
    VOCAB,
    adapter_grads,
    export_base,
    merge_lora,
    peft_model,
    random_adapters,
    unmerge_lora,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")


@pytest.fixture(scope="module")
def base_export(tmp_path_factory):
    return export_base(str(tmp_path_factory.mktemp("lora")))


@pytest.mark.parametrize("targets", ["all-linear", ["wq", "wv"]])
def test_forward_and_adapter_gradients_equal_peft(base_export, targets):
    base, hf_dir = base_export
    cfg = LoRAConfig(rank=4, alpha=8, targets=targets)
    model = copy.deepcopy(base)
    swapped = apply_lora(model, cfg)
    assert len(swapped) == 2 * len(cfg.target_names)
    random_adapters(model)
    peft = peft_model(hf_dir, cfg, model)
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    ours, theirs = model(tokens), peft(tokens).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    ours.square().mean().backward()
    theirs.square().mean().backward()
    ours_grads, peft_grads = adapter_grads(model, peft=False), adapter_grads(peft, peft=True)
    assert sorted(ours_grads) == sorted(peft_grads) and len(ours_grads) == 2 * len(swapped)
    for name, g in ours_grads.items():
        torch.testing.assert_close(g, peft_grads[name], rtol=1e-4, atol=1e-6)


def test_only_adapters_train_and_merge_disable_roundtrip(base_export):
    base, _ = base_export
    model = copy.deepcopy(base)
    apply_lora(model, LoRAConfig(rank=2, alpha=4))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_a", "lora_b")) for n in trainable)
    model.load_state_dict(base.state_dict(), strict=False)  # base names are unchanged
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), base(tokens))  # B = 0 at init
        random_adapters(model)
        adapted = model(tokens)
        assert (adapted - base(tokens)).abs().max() > 1e-3
        with adapters_disabled(model):
            torch.testing.assert_close(model(tokens), base(tokens))
        # W x + s B A x and (W + s B A) x round differently: float32 relative tolerance
        merge_lora(model)
        torch.testing.assert_close(model(tokens), adapted, rtol=1e-5, atol=1e-5)
        unmerge_lora(model)
        torch.testing.assert_close(model(tokens), adapted, rtol=1e-5, atol=1e-5)
        merge_lora(model)
        with adapters_disabled(model):  # merged weights are the adapted model
            torch.testing.assert_close(model(tokens), adapted, rtol=1e-5, atol=1e-5)


def test_peft_adapter_folder_loads_in_peft_and_equals_merged_export(base_export, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, hf_dir = base_export
    cfg = LoRAConfig(rank=4, alpha=16, targets="all-linear")
    model = copy.deepcopy(base)
    apply_lora(model, cfg)
    random_adapters(model, seed=5)
    state = model.state_dict()
    summary = export_peft_adapter(state, cfg, str(tmp_path / "adapter"), hf_dir)
    assert summary["tensors"] == len(adapter_state_dict(state)) == 4 * 7
    export_merged_hf(model.cfg.model_dump(), state, cfg, str(tmp_path / "merged"))

    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    hf_base = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    with_adapter = PeftModel.from_pretrained(hf_base, str(tmp_path / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "merged"), attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        want = model(tokens)
        torch.testing.assert_close(merged(tokens).logits, want, rtol=0, atol=1e-4)
        torch.testing.assert_close(with_adapter(tokens).logits, want, rtol=0, atol=1e-4)


def test_serving_base_plus_adapter_equals_the_merged_export(base_export, tmp_path):
    """An adapter folder written by `peft` itself (save_pretrained), served as base + adapter by
    the local backend (the base named in adapter_config.json): the merged export's logits."""
    import asyncio

    from kiln.engine.generator import Generator
    from kiln.model.formats.hf import find_hf_dir
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend
    from tests.training.post.helpers import chat_tokenizer, save_hf_tokenizer

    base, hf_dir = base_export
    cfg = LoRAConfig(rank=4, alpha=16, targets=["wq", "wv", "w2"])
    model = copy.deepcopy(base)
    apply_lora(model, cfg)
    random_adapters(model, seed=7)
    adapter_dir = str(tmp_path / "adapter")
    peft_model(hf_dir, cfg, model).save_pretrained(adapter_dir)
    save_hf_tokenizer(chat_tokenizer(), adapter_dir, None)
    export_merged_hf(model.cfg.model_dump(), model.state_dict(), cfg, str(tmp_path / "merged"))
    assert find_hf_dir(adapter_dir) == adapter_dir

    backend = LocalBackend(adapter_dir, "tiny", BatchingConfig())
    merged = Generator.load(str(tmp_path / "merged"), tokenizer=adapter_dir, device="cpu").model
    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    try:
        with torch.no_grad():
            served = backend.generator.model(tokens)
            torch.testing.assert_close(served, merged(tokens), rtol=0, atol=1e-4)
            torch.testing.assert_close(served, model(tokens), rtol=0, atol=1e-4)
    finally:
        asyncio.run(backend.close())
