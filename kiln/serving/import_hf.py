"""`kiln import-hf`: a Hugging Face Llama / Mistral / Mixtral / Qwen2 folder or Hub id
(`org/name`, kiln.model.formats.hub), or a GGUF file (or an installed package shipping one),
becomes a weights-only kiln checkpoint.

The checkpoint is the checkpointer's own layout (a DCP step folder with `kiln.json`, and a
`latest` pointer), so `train` continues pretraining from it (`init_from:`) and `export` /
`Generator.load` read it like any other. The tokenizer files land next to it.
"""

from __future__ import annotations

from kiln.model.formats.weights import read_model, write_model_checkpoint


def import_hf(source: str, out_dir: str, *, step: int = 0, revision: str | None = None) -> str:
    """Write `source` (an HF folder or Hub id, a .gguf file or a package shipping one) as a kiln
    checkpoint under `out_dir`, its tokenizer beside it; returns the step folder."""
    cfg, state = read_model(source, out_dir, revision)
    return write_model_checkpoint(out_dir, cfg, state, step=step)
