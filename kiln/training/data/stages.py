"""The `tokenize` stage: Corpus -> Tokenizer + TokenDataset (Megatron indexed datasets per split).

TokenDataset layout:

    train.bin  train.idx  valid.bin  valid.idx  test.bin  test.idx
    tokenizer.json  tokenizer_config.json  tokens.json (vocab size, EOD id, dtype, counts per split)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow.parquet as pq
from pydantic import Field, model_validator

from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.text import indexed_dataset
from kiln.text.tokenizer import EOD_TOKEN, eod_id, load_tokenizer, model_eod_token, tokenizer_file
from kiln.training.data.parallel_tokenize import (
    SPLITS,
    ShardTokenizer,
    TokenizeProgress,
    corpus_files,
    tokenize_corpus,
)
from kiln.training.data.sources import TOKENS_META
from kiln.training.data.tokenizer import save_tokenizer, train_tokenizer


class TokenizeConfig(StageConfig):
    tokenizer: str | None = Field(
        None,
        description="An existing tokenizer instead of training one: a tokenizer.json, a folder "
        "holding one (HF model, `kiln import-hf` output, Tokenizer or ExportedModel artifact). "
        "Wiring a `model` input (e.g. an import-model stage) does the same.",
    )
    vocab_size: int = Field(
        32000, ge=260, description="Vocabulary size of the trained BPE (incl. special tokens)."
    )
    special_tokens: list[str] = Field(
        default_factory=list, description="Extra special tokens (after the EOD token)."
    )
    eod_token: str | None = Field(
        None,
        description=f"End-of-document token appended to every document (default {EOD_TOKEN}; "
        "a model's tokenizer: that token if it has it, else its eos_token).",
    )
    min_frequency: int = Field(
        2, ge=1, description="BPE merges need at least this many occurrences."
    )
    train_max_documents: int | None = Field(
        200_000, description="Train the tokenizer on at most this many documents (None: all)."
    )
    valid_fraction: float = Field(
        0.01, ge=0, lt=1, description="Share of documents in the valid split."
    )
    test_fraction: float = Field(
        0.01, ge=0, lt=1, description="Share of documents in the test split."
    )
    seed: int = Field(1234, description="Seed of the document -> split assignment.")
    batch_size: int = Field(
        1024, ge=1, description="Documents per Ray Data batch (one shard each)."
    )
    num_actors: int = Field(
        2, ge=1, description="Tokenizer actors (each with fractional CPUs on small machines)."
    )
    executor: Literal["ray", "inline"] = Field(
        "ray",
        description="ray: Ray Data tokenizer actors; inline: one loop in the stage's process "
        "(a few thousand documents: faster than starting actors).",
    )

    @model_validator(mode="after")
    def _fractions(self) -> TokenizeConfig:
        if self.valid_fraction + self.test_fraction >= 1:
            raise ValueError("valid_fraction + test_fraction must be < 1 (train needs documents)")
        return self


def _corpus_texts(files: list[str], limit: int | None):
    """Texts streamed from the Parquet shards, without loading the corpus into memory."""
    n = 0
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(columns=["text"], batch_size=4096):
            for text in batch.column(0).to_pylist():
                if limit is not None and n >= limit:
                    return
                n += 1
                yield text


def resolve_eod_token(cfg: TokenizeConfig, source: str | None) -> str:
    if cfg.eod_token:
        return cfg.eod_token
    return model_eod_token(source) if source else EOD_TOKEN


def obtain_tokenizer(cfg: TokenizeConfig, corpus_files: list[str], source: str | None = None):
    """The given tokenizer (`source`, else `cfg.tokenizer`), or byte-level BPE trained on (a
    prefix of) the corpus."""
    source = source or cfg.tokenizer
    if source:
        return load_tokenizer(source)
    eod = resolve_eod_token(cfg, None)
    specials = [eod, *[s for s in cfg.special_tokens if s != eod]]
    texts = _corpus_texts(corpus_files, cfg.train_max_documents)
    return train_tokenizer(texts, cfg.vocab_size, specials, cfg.min_frequency)


def tokenize_inline(corpus: str, out_dir: str, tokenizer_json: str, **kw) -> dict[str, dict]:
    """`tokenize_corpus` without Ray: the same shard writer over the Parquet batches in this
    process, shards merged in corpus order (the same files, ids for ids)."""
    vocab_size, batch_size = kw.pop("vocab_size"), kw.pop("batch_size")
    dtype = indexed_dataset.token_dtype(vocab_size)
    shard_dir = Path(out_dir) / "_shards"
    writer = ShardTokenizer(
        tokenizer_json=tokenizer_json, dtype=dtype.name, shard_dir=str(shard_dir), **kw
    )
    shards: list[tuple[str, str]] = []
    files = corpus_files(corpus)
    with TokenizeProgress(files) as progress:
        for f in files:
            for batch in pq.ParquetFile(f).iter_batches(
                columns=["id", "text"], batch_size=batch_size
            ):
                out = writer(
                    {k: batch.column(k).to_numpy(zero_copy_only=False) for k in ("id", "text")}
                )
                shards += list(zip(out["split"], out["prefix"], strict=True))
                for documents, tokens in zip(out["documents"], out["tokens"], strict=True):
                    progress.shard(documents, tokens)
    counts = {}
    for split in SPLITS:
        prefixes = [prefix for s, prefix in shards if s == split]
        merged = indexed_dataset.merge(prefixes, Path(out_dir) / split, dtype=dtype)
        counts[split] = {"documents": merged.num_documents, "tokens": merged.num_tokens}
    shutil.rmtree(shard_dir, ignore_errors=True)
    return counts


def plot_document_lengths(tokens_dir: str) -> None:
    """`document_lengths.png`: tokens per document of each split (log-scaled histogram)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for split in ("train", "valid", "test"):
        lengths = indexed_dataset.IndexedDataset(Path(tokens_dir) / split).sequence_lengths
        if len(lengths):
            bins = np.logspace(0, np.log10(max(int(lengths.max()), 2)), 40)
            ax.hist(lengths, bins=bins, histtype="step", label=f"{split} ({len(lengths)} docs)")
    ax.set_xscale("log")
    ax.set_xlabel("tokens per document (incl. EOD)")
    ax.set_ylabel("documents")
    ax.legend()
    fig.tight_layout()
    fig.savefig(Path(tokens_dir) / "document_lengths.png", dpi=100)
    plt.close(fig)


class TokenizeStage(Stage):
    """Train (or load) a byte-level BPE tokenizer and tokenise the corpus into Megatron indexed
    datasets."""

    type_name = "tokenize"
    Config = TokenizeConfig
    input_kinds: ClassVar[dict[str, str]] = {"corpus": "Corpus", "model": "ExportedModel"}
    optional_inputs = frozenset({"model"})  # a model's tokenizer (import-model, sft, ...)
    output_kinds: ClassVar[dict[str, str]] = {"tokens": "TokenDataset", "tokenizer": "Tokenizer"}
    resources: ClassVar[Resources] = Resources(ray=True)  # Ray Data tokenizer actors

    def needs(self) -> Resources:
        """Ray for the Ray Data actors; inline leaves the runtime as it is."""
        return Resources(ray=True) if self.config.executor == "ray" else Resources()

    def extra_fingerprint(self) -> str:
        if not self.config.tokenizer:
            return ""
        return hashlib.sha256(tokenizer_file(self.config.tokenizer).read_bytes()).hexdigest()

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg: TokenizeConfig = self.config
        corpus = ctx.inputs["corpus"].path
        tokens_out = ctx.outputs["tokens"]
        t0 = time.perf_counter()
        tok = self._tokenizer(ctx, corpus_files(corpus))
        t_tok = time.perf_counter()
        common = {
            "eod_id": ctx.outputs["tokenizer"].meta["eod_id"],
            "vocab_size": tok.get_vocab_size(),
            "seed": cfg.seed,
            "valid_fraction": cfg.valid_fraction,
            "test_fraction": cfg.test_fraction,
            "batch_size": cfg.batch_size,
        }
        if cfg.executor == "inline":
            counts = tokenize_inline(corpus, tokens_out.path, tok.to_str(), **common)
        else:
            counts = tokenize_corpus(
                corpus,
                tokens_out.path,
                tok.to_str(),
                num_actors=cfg.num_actors,
                cpus_per_actor=ctx.ray().cpus_per_worker(),
                **common,
            )
        self._describe(ctx, tok, counts)
        total_tokens = tokens_out.counts["tokens"]
        return {
            "documents": tokens_out.counts["documents"],
            "tokens": total_tokens,
            "vocab": tok.get_vocab_size(),
            "tokenizer_s": round(t_tok - t0, 3),
            "tokenize_s": round(time.perf_counter() - t_tok, 3),
            "tokens_per_s": round(total_tokens / max(time.perf_counter() - t0, 1e-9), 1),
        }

    def _tokenizer(self, ctx: StageContext, files: list[str]):
        """Load or train the tokenizer and write it as the Tokenizer artifact."""
        cfg: TokenizeConfig = self.config
        source = cfg.tokenizer or (ctx.inputs["model"].path if "model" in ctx.inputs else None)
        tok = obtain_tokenizer(cfg, files, source)
        eod_token = resolve_eod_token(cfg, source)
        ctx.log.debug(
            "tokenize: %s tokenizer, vocab %d, end of document %s",
            "the model's" if source else "trained",
            tok.get_vocab_size(),
            eod_token,
        )
        tok_out = ctx.outputs["tokenizer"]
        source_dir = tokenizer_file(source).parent if source else None
        save_tokenizer(tok, tok_out.path, eod_token, source=source_dir)
        tok_out.counts = {"vocab_size": tok.get_vocab_size()}
        tok_out.meta = {
            "eod_token": eod_token,
            "eod_id": eod_id(tok, eod_token),
            "trained": not source,
        }
        return tok

    def _describe(self, ctx: StageContext, tok, counts: dict[str, dict[str, int]]) -> None:
        """The TokenDataset's tokenizer copy, tokens.json, length plot, counts and meta."""
        cfg: TokenizeConfig = self.config
        tokens_out, tok_out = ctx.outputs["tokens"], ctx.outputs["tokenizer"]
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tok_out.path) / name, Path(tokens_out.path) / name)
        vocab_size = tok.get_vocab_size()
        meta = {
            "vocab_size": vocab_size,
            "eod_token": tok_out.meta["eod_token"],
            "eod_id": tok_out.meta["eod_id"],
            "dtype": indexed_dataset.token_dtype(vocab_size).name,
            "splits": counts,
            "seed": cfg.seed,
        }
        (Path(tokens_out.path) / TOKENS_META).write_text(json.dumps(meta, indent=2))
        plot_document_lengths(tokens_out.path)
        tokens_out.counts = {
            "documents": sum(c["documents"] for c in counts.values()),
            "tokens": sum(c["tokens"] for c in counts.values()),
            **{f"{s}_{k}": v for s, c in counts.items() for k, v in c.items()},
        }
        tokens_out.meta = {k: v for k, v in meta.items() if k != "splits"}
