"""`kiln prepare-chat` -> `kiln sft --export` -> transformers/peft load the result; `kiln dpo`."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from kiln.platform.cli import main
from tests.platform.console_checks import assert_quiet
from tests.training.post.helpers import CONVERSATION, chat_tokenizer
from tests.training.post.lora_helpers import export_base

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")


@pytest.mark.slow  # ~4 s of peers loading the export: `make test` only
def test_prepare_sft_dpo_from_the_cli_and_the_export_loads_in_peers(tmp_path, capfd):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, base = export_base(str(tmp_path / "base"))
    chat_tokenizer().save(str(tmp_path / "tokenizer.json"))
    rows = [{"prompt": f"fact {i}?", "response": f"fact {i} is paris"} for i in range(8)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pref = [{"prompt": f"fact {i}?", "chosen": "paris", "rejected": "tokyo"} for i in range(8)]
    (tmp_path / "pref.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pref))
    tok = str(tmp_path / "tokenizer.json")
    for cmd, src in (("prepare-chat", "sft"), ("prepare-preference", "pref")):
        argv = [cmd, str(tmp_path / f"{src}.jsonl"), "--out", str(tmp_path / src)]
        assert main([*argv, "--tokenizer", tok, "--seq-len", "48"]) == 0
    config = {
        "base": base,
        "lora": {"rank": 4, "alpha": 8},
        "seq_len": 48,
        "global_batch_size": 4,
        "micro_batch_size": 4,
        "steps": 2,
        "device": "cpu",
        "data": {"paths": [str(tmp_path / "sft")]},
    }
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(config))
    capfd.readouterr()
    assert (
        main(["sft", "--config", str(tmp_path / "sft.yaml"), "--export", str(tmp_path / "out")])
        == 0
    )
    summary = assert_quiet(*capfd.readouterr())  # kiln's lines and a table: no JSON dump
    assert summary["steps"] == "2" and summary["model"] == str(tmp_path / "out" / "hf")

    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "hf")).eval()
    adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base), str(tmp_path / "out" / "adapter")
    ).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(tmp_path / "out" / "hf"))
    ids = hf_tok.apply_chat_template(CONVERSATION[1:3], tokenize=True, return_dict=True)
    tokens = torch.tensor([ids["input_ids"]])
    assert hf_tok.decode(tokens[0]).startswith("<|im_start|>user\n")
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens).logits, adapter(tokens).logits, atol=1e-4, rtol=0)
        assert (
            merged(tokens).logits - AutoModelForCausalLM.from_pretrained(base)(tokens).logits
        ).abs().max() > 1e-4

    dpo = {
        **config,
        "base": str(tmp_path / "out" / "hf"),
        "data": {"paths": [str(tmp_path / "pref")]},
    }
    (tmp_path / "dpo.yaml").write_text(yaml.safe_dump(dpo))
    capfd.readouterr()
    assert main(["dpo", "--config", str(tmp_path / "dpo.yaml"), "--set", "dpo.beta=0.5"]) == 0
    final = assert_quiet(*capfd.readouterr())
    assert {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"} <= set(
        final
    )
