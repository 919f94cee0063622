"""The `lora` options of an endpoint (`kiln serve --lora NAME=PATH --max-loras N`, the serve
stage's `lora:`): which PEFT adapters it serves over its base model from the start, and how many
the engine holds at once. Present (even empty) = multi-LoRA serving on, including
`POST /v1/load_lora_adapter`; vLLM's names."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kiln.engine.lora_registry import DEFAULT_MAX_LORA_RANK
from kiln.platform.errors import ConfigError


class LoRAServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="adapter name (the `model` requests ask for) -> PEFT adapter folder (what "
        "`kiln sft` with lora writes as export/adapter)",
    )
    max_loras: int = Field(
        4,
        ge=1,
        description="adapters the engine holds at once (one forward mixes up to this many); "
        "an idle one is evicted, least recently used first, for another",
    )
    max_lora_rank: int = Field(
        DEFAULT_MAX_LORA_RANK, ge=1, description="largest adapter rank accepted"
    )

    @field_validator("adapters")
    @classmethod
    def _named(cls, v: dict[str, str]) -> dict[str, str]:
        for name, path in v.items():
            if not name.strip() or not path:
                raise ConfigError(f"lora.adapters: {name!r}: {path!r} needs a name and a path")
        return v

    def engine_options(self) -> dict:
        """The `Engine(...)` keyword arguments these options set."""
        return {"max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank}


def parse_lora_flags(flags: list[str] | None) -> dict[str, str]:
    """`--lora NAME=PATH` flags -> {name: path} (ConfigError naming the bad one)."""
    out: dict[str, str] = {}
    for flag in flags or []:
        name, sep, path = flag.partition("=")
        if not sep or not name.strip() or not path:
            raise ConfigError(f"--lora {flag!r}: expected NAME=PATH (a PEFT adapter folder)")
        if name in out:
            raise ConfigError(f"--lora {flag!r}: adapter {name!r} is named twice")
        out[name] = path
    return out
