"""One engine's work: a batch of rows -> prompts -> Kiln's continuous-batching engine -> output
rows and failed rows, written to the run's work folder and recorded in its ledger.

`RowGenerator` is what a Ray Data actor (or the inline loop) holds: the model is loaded once and
one `Engine` decodes every batch the actor takes. Rows join the running batch as slots free up
(`Engine.run` on this thread). A row that cannot run (a missing template field, a prompt too long
for the context, a failing forward) is a failed row with its reason, never a failed batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.generate.config import GenerateConfig
from kiln.curator.generate.model import chat_template_for, load_generator
from kiln.curator.generate.prompts import PromptBuilder, PromptError
from kiln.curator.ledger import Ledger, write_atomic
from kiln.engine.engine import Engine
from kiln.engine.request import EngineEvent, EngineRequest
from kiln.engine.sampler import SEED_MAX, SamplingParams
from kiln.platform.errors import KilnError

log = logging.getLogger("kiln.curator.generate")

PROMPT_TOO_LONG = "prompt_too_long"
PROMPT_TEMPLATE = "prompt_template"
GENERATE_FAILED = "generate_failed"
JUDGE_SCORE = "judge_score"


def _unheard(event: EngineEvent) -> None:
    """Rows are read from their requests once the batch has run."""


def row_seed(seed: int, row_id: str, sample: int) -> int:
    """A seed per row and sample from the stage's: the same text wherever the row is batched."""
    digest = hashlib.blake2b(f"{seed}|{row_id}|{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_MAX


def batch_paths(work_dir: str, index: int) -> tuple[str, str]:
    """(generated rows, failed rows) of batch `index`."""
    folder = os.path.join(work_dir, "batches")
    return (
        os.path.join(folder, f"batch-{index:06d}.parquet"),
        os.path.join(folder, f"failed-{index:06d}.parquet"),
    )


class RowGenerator:
    """The model, its engine and the prompt template of one worker."""

    def __init__(self, cfg: GenerateConfig) -> None:
        self.cfg = cfg
        self.generator = load_generator(cfg.model or "")
        self.prompts = PromptBuilder(cfg, chat_template_for(self.generator, cfg.chat_template))
        context = self.generator.max_seq_len - 1
        self.max_prompt_tokens = min(cfg.max_prompt_tokens or context, context)
        self.engine = self._engine()

    def _engine(self) -> Engine:
        # a shared instruction or system prompt is computed once per engine (prefix caching)
        return Engine(self.generator, **self.cfg.batching.engine_options())

    def _params(self, row_id: str, sample: int) -> SamplingParams:
        p = self.cfg.sampling
        if p.seed is None:
            return p
        return p.model_copy(update={"seed": row_seed(p.seed, row_id, sample)})

    def run(self, rows: list[dict]) -> tuple[list[dict], list[dict]]:
        """(generated rows, failed rows with `reason` and `error`) for `rows`."""
        out_field = self.cfg.output_field
        pending: list[tuple[dict, str, int, EngineRequest]] = []
        failed: list[dict] = []
        for row in rows:
            base = dict(row)
            if out_field in base:  # the input's column keeps its content under another name
                base[f"input_{out_field}"] = base.pop(out_field)
            for k in range(self.cfg.n):
                one = {**base, "id": row["id"] if self.cfg.n == 1 else f"{row['id']}/{k}"}
                one["sample"] = k
                try:
                    prompt = self.prompts.render(row)
                except PromptError as e:
                    reason = {"reason": PROMPT_TEMPLATE, "error": str(e)}
                    failed.append({**one, "prompt": None, **reason})
                    continue
                one["prompt"] = prompt
                request = self._submit(one, prompt, failed)
                if request is not None:
                    pending.append((one, prompt, k, request))
        self._drain([r for *_, r in pending])
        done = []
        for one, _prompt, _k, request in pending:
            seq = request.seq
            if request.error is not None:
                failed.append({**one, "reason": GENERATE_FAILED, "error": str(request.error)})
                continue
            text = seq.text if seq.text is not None else self.generator.decode(seq.token_ids)
            one.update(
                {
                    out_field: text,
                    "prompt_tokens": len(seq.prompt_ids),
                    "completion_tokens": len(seq.token_ids),
                    "finish_reason": seq.finish_reason or "length",
                }
            )
            if self.cfg.judge is not None and not self._judged(one, text):
                failed.append({**one, "reason": JUDGE_SCORE, "error": None})
                continue
            done.append(one)
        return done, failed

    def _submit(self, one: dict, prompt: str, failed: list[dict]) -> EngineRequest | None:
        try:
            ids = self.generator.encode(prompt)
            if len(ids) > self.max_prompt_tokens:
                raise KilnError(
                    f"prompt has {len(ids)} tokens; at most {self.max_prompt_tokens} fit"
                )
            return self.engine.submit(ids, self._params(one["id"], one["sample"]), _unheard)
        except KilnError as e:
            failed.append({**one, "reason": PROMPT_TOO_LONG, "error": str(e)})
            return None

    def _drain(self, requests: list[EngineRequest]) -> None:
        """Step the engine until `requests` finish; a step that raises fails the unfinished
        ones and the engine is rebuilt (its slots' state is unknown)."""
        try:
            for _ in self.engine.run(requests):
                pass
        except Exception as e:  # noqa: BLE001 - recorded on each unfinished row
            log.warning("generate: engine step failed: %s", e)
            for request in requests:
                if not request.finished:
                    request.fail(e)
            self.engine = self._engine()

    def _judged(self, one: dict, text: str) -> bool:
        """Parse the score into the row; whether it reaches the judge's minimum."""
        judge = self.cfg.judge
        score = judge.score(text)  # type: ignore[union-attr]
        one[judge.score_field] = score  # type: ignore[union-attr]
        return score is not None and score >= judge.min_score  # type: ignore[union-attr]


def _write_rows(rows: list[dict], path: str) -> None:
    if not rows:
        return
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink, compression="zstd")
    write_atomic(path, sink.getvalue().to_pybytes())


def run_batch(worker: RowGenerator, index: int, rows: list[dict], work_dir: str) -> dict:
    """Generate one batch into the work folder and record it; returns its counts."""
    t = time.perf_counter()
    done, failed = worker.run(rows)
    seconds = time.perf_counter() - t
    done_path, failed_path = batch_paths(work_dir, index)
    _write_rows(done, done_path)
    _write_rows(failed, failed_path)
    reasons: dict[str, int] = {}
    for row in failed:
        reasons[row["reason"]] = reasons.get(row["reason"], 0) + 1
    counts = {
        "batch": index,
        "rows": len(rows),
        "generated": len(done),
        "failed": reasons,
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in done + failed),
        "completion_tokens": sum(r.get("completion_tokens") or 0 for r in done + failed),
        "seconds": seconds,
    }
    Ledger(work_dir).record(index, counts)
    return counts


class GenerateActor:
    """A Ray Data actor: one model and one engine, a batch of rows per call."""

    def __init__(self, cfg_json: str, work_dir: str) -> None:
        self.worker = RowGenerator(GenerateConfig.model_validate_json(cfg_json))
        self.work_dir = work_dir

    def __call__(self, batch: dict) -> dict:
        out = [
            run_batch(self.worker, int(i), json.loads(rows), self.work_dir)
            for i, rows in zip(batch["batch"], batch["rows"], strict=True)
        ]
        return {"stats": [json.dumps(s) for s in out]}
