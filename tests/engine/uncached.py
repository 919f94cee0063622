"""The reference decoder the engine is checked against (and bench/serving.py's no-KV-cache
baseline): the model's own forward over the whole sequence at every step, one prompt at a time."""

from __future__ import annotations

import torch

from kiln.engine.generator import Completion, Generator
from kiln.engine.sampler import SamplingParams, make_generator, sample_next
from kiln.engine.sequence import Sequence, StopRule


@torch.inference_mode()
def uncached_generate(
    gen: Generator, prompts: list[str], params: SamplingParams
) -> list[Completion]:
    rule = StopRule(gen.eos_token_ids, gen.max_seq_len, gen.decode)
    completions = []
    for prompt in prompts:
        seq = Sequence(gen.encode(prompt), params, make_generator(params, gen.device))
        if params.max_new_tokens == 0:
            seq.finish_reason = "length"
        while not seq.done:
            ids = torch.tensor([seq.prompt_ids + seq.token_ids], device=gen.device)
            logits = gen.model(ids)[:, -1]
            history = [(seq.prompt_ids, seq.token_ids)]
            rule.push(seq, sample_next(logits, [seq.params], [seq.rng], history).item())
        completions.append(
            Completion(
                text=seq.text if seq.text is not None else gen.decode(seq.token_ids),
                token_ids=seq.token_ids,
                finish_reason=seq.finish_reason or "length",
                prompt_tokens=len(seq.prompt_ids),
                completion_tokens=len(seq.token_ids),
            )
        )
    return completions
