"""The model a generate worker decodes with: any Kiln-loadable model (a Kiln checkpoint, an HF or
ExportedModel folder, a .gguf file or a package shipping one), stopping at its end of turn as
`kiln serve` does."""

from __future__ import annotations

import os
import tempfile

from kiln.engine.generator import Generator
from kiln.model.formats.weights import build_model, read_model
from kiln.text.chat_template import ChatTemplate, end_of_turn_markers, load_chat_config
from kiln.text.tokenizer import end_of_text_ids, find_tokenizer, vocabulary_ids


def load_generator(source: str) -> Generator:
    """A `Generator` for `source`; a GGUF's tokenizer files go to a temporary folder."""
    if os.path.isdir(source):
        gen = Generator.load(source)
    else:
        tok_dir = tempfile.mkdtemp(prefix="kiln-generate-")
        cfg, state = read_model(source, tok_dir)
        tok, tok_dir = find_tokenizer(None, search=[tok_dir])
        model = build_model(cfg, state, device="cpu")
        gen = Generator(model, tok, eos_token_ids=end_of_text_ids(tok, tok_dir))
        gen.tokenizer_dir = tok_dir
    template, special = load_chat_config(gen.tokenizer_dir)
    # a chat model's end-of-turn token ends a completion, as its end-of-text does (LocalBackend)
    markers = end_of_turn_markers(template, special)
    gen.eos_token_ids.update(vocabulary_ids(gen.tokenizer, markers))
    return gen


def chat_template_for(gen: Generator, spec: str | None) -> ChatTemplate | None:
    """`spec` (a built-in name or a tokenizer folder), else the model's own template, if any."""
    if spec is not None:
        return ChatTemplate.resolve(spec)
    template, special = load_chat_config(gen.tokenizer_dir)
    return ChatTemplate(template, special) if template else None
