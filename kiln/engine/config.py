"""How many sequences the engine runs at once, how many tokens a step computes and how its KV
cache is paged: the `batching` options of every stage that starts an endpoint (serve,
evaluate). vLLM's names in the descriptions where they differ."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kiln.engine.speculative_config import SpeculativeConfig


class BatchingConfig(BaseModel):
    """How the local backend batches concurrent prompts: continuously (kiln.engine: rows join
    and leave the running batch at every decoding step) over a paged KV cache with automatic
    prefix caching; requests are preempted and recomputed, never failed, when blocks run out."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(
        128,
        ge=1,
        description="sequences running at once at most (vLLM's max_num_seqs, whose OpenAI server "
        "default on CPU is 128); the token budget and free KV blocks decide how many of them run",
    )
    prefill_chunk: int = Field(
        256, ge=1, description="prompt tokens prefilled per step (long prompts chunked)"
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="tokens one step computes, decode rows included (default: prefill_chunk + "
        "max_batch_size)",
    )
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block")
    kv_cache_memory_gb: float | None = Field(
        None,
        gt=0,
        description="GiB of KV-cache blocks (vLLM-CPU's VLLM_CPU_KVCACHE_SPACE; default: "
        "max_batch_size full contexts, at most 4); touched only as blocks fill",
    )
    enable_prefix_caching: bool = Field(
        True, description="reuse the KV blocks of prompt prefixes across requests"
    )
    speculative: SpeculativeConfig | None = Field(
        None,
        description="speculative decoding (vLLM's speculative_config): ngram prompt lookup or a "
        "draft model proposes tokens, the model verifies them in one forward",
    )

    def engine_options(self) -> dict:
        """The `Engine(...)` keyword arguments these options set."""
        memory = self.kv_cache_memory_gb
        return {
            "max_slots": self.max_batch_size,
            "prefill_chunk": self.prefill_chunk,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "kv_cache_memory": None if memory is None else int(memory * (1 << 30)),
            "enable_prefix_caching": self.enable_prefix_caching,
            "speculative": self.speculative,
        }
