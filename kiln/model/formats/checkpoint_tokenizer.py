"""The tokenizer that travels with a Kiln checkpoint: `tokenizer.json` and `tokenizer_config.json`
(special tokens, chat template) in the checkpoint root beside `latest`. `export`,
`Generator.load`, `prepare-chat` and `tokenize` find them there as they find an HF folder's, so
a model keeps its tokenizer and chat template from `import-model` through training to `export`.
"""

from __future__ import annotations

import json
import os
import shutil

from kiln.text.tokenizer import TOKENIZER_FILES


def tokenizer_folder(model: str) -> str:
    """The folder holding a model's tokenizer files: an ExportedModel's `hf/`, else `model`."""
    hf = os.path.join(model, "hf")
    return hf if os.path.isfile(os.path.join(hf, "tokenizer.json")) else model


def has_tokenizer(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "tokenizer.json"))


def copy_tokenizer(source: str, root: str) -> list[str]:
    """Copy the tokenizer files of `source` (a checkpoint root, an HF folder or an ExportedModel)
    into the checkpoint root `root`; returns the names copied."""
    folder = tokenizer_folder(source)
    os.makedirs(root, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            shutil.copyfile(os.path.join(folder, name), os.path.join(root, name))
            copied.append(name)
    return copied


def set_chat_template(root: str, template: str, end_of_turn: str | None) -> None:
    """Record the chat template a model was trained with in its tokenizer_config.json, so
    `apply_chat_template` on its export renders prompts as training saw them; a chat model's end
    of sequence is the end of its turn (as SmolLM2-Instruct's)."""
    path = os.path.join(root, "tokenizer_config.json")
    config = {}
    if os.path.isfile(path):
        with open(path) as f:
            config = json.load(f)
    config["chat_template"] = template
    if end_of_turn:
        config["eos_token"] = end_of_turn
    with open(path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
