"""`complete`: send prompts to a live Endpoint and print the completions (the quickstart's
last step)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from kiln.platform.stage import Stage, StageConfig, StageContext


class CompleteConfig(StageConfig):
    prompts: list[str] = Field(
        default_factory=lambda: ["The Python language"], description="Prompts to send."
    )
    max_tokens: int = Field(48, ge=1, description="New tokens per completion.")
    temperature: float = Field(0.0, ge=0, description="0: greedy.")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the endpoint's API key."
    )


class CompleteStage(Stage):
    """Ask the endpoint for one completion per prompt over its OpenAI-compatible route and print
    them."""

    type_name = "complete"
    Config = CompleteConfig
    input_kinds: ClassVar[dict[str, str]] = {"endpoint": "Endpoint"}
    output_kinds: ClassVar[dict[str, str]] = {"completions": "Text"}
    cacheable: ClassVar[bool] = False

    def run(self, ctx: StageContext) -> dict[str, Any]:
        import os

        from kiln.serving.client import KilnClient

        meta = ctx.inputs["endpoint"].meta
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        client = KilnClient(meta["url"], api_key=key)
        results = []
        for prompt in self.config.prompts:
            text = client.complete(
                prompt, max_tokens=self.config.max_tokens, temperature=self.config.temperature
            )
            results.append({"prompt": prompt, "completion": text})
            print(f"\n>>> {prompt}{text}\n", flush=True)
        out = ctx.outputs["completions"]
        (Path(out.path) / "completions.json").write_text(
            json.dumps(results, indent=2, ensure_ascii=False)
        )
        out.counts = {"completions": len(results)}
        return {"url": meta["url"], "completions": len(results)}
