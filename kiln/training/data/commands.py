"""The handlers of kiln.training.data.cli's commands (imported only when one runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.platform import console
from kiln.platform.artifact import Artifact
from kiln.platform.errors import ConfigError, InputError
from kiln.platform.runtime import Runtime
from kiln.platform.signals import stop_on_signals
from kiln.platform.stage import StageContext, run_steps
from kiln.text.indexed_dataset import IndexedDataset
from kiln.training.data.sources import resolve_prefix
from kiln.training.data.stages import TokenizeStage


def tokenize_command(args) -> int:
    stop_on_signals()  # SIGINT/SIGTERM: exit 130/143, an embedded Ray shut down
    if not Path(args.corpus).is_dir():
        raise InputError(f"{args.corpus}: no such Corpus directory")
    stage = TokenizeStage(
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        special_tokens=args.special_tokens,
        eod_token=args.eod_token,
        valid_fraction=args.valid_fraction,
        test_fraction=args.test_fraction,
        seed=args.seed,
        batch_size=args.batch_size,
        num_actors=args.num_actors,
    )
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out: {out} exists and is not empty")
    try:
        corpus = Artifact.load(args.corpus)
    except InputError:  # a plain folder of Parquet shards is fine too
        corpus = Artifact(uri=args.corpus, kind="Corpus")
    outputs = {
        slot: Artifact(uri=str(out / slot), kind=kind, stage="tokenize")
        for slot, kind in stage.output_kinds.items()
    }
    for art in outputs.values():
        Path(art.uri).mkdir(parents=True)
    runtime = Runtime(address=args.address)
    ctx = StageContext(
        stage=stage,
        run_dir=out,
        stage_dir=out,
        inputs={"corpus": corpus},
        outputs=outputs,
        runtime=runtime,
    )
    try:
        with console.command_log(out):  # Ray's and Ray Data's output: <out>/logs/
            try:
                metrics = run_steps(stage, ctx)
            finally:
                runtime.shutdown()
    except BaseException:
        for art in outputs.values():
            shutil.rmtree(art.uri, ignore_errors=True)
        raise
    fp = stage.fingerprint({"corpus": corpus.fingerprint})
    for art in outputs.values():
        art.fingerprint = fp
        art.commit()
    console.summary(
        [
            ("documents", metrics["documents"]),
            ("tokens", metrics["tokens"]),
            ("vocab", metrics["vocab"]),
            ("tokens/s", round(metrics["tokens_per_s"])),
            ("tokens dir", outputs["tokens"].uri),
            ("tokenizer", outputs["tokenizer"].uri),
        ]
    )
    return 0


def describe_command(args) -> int:
    root = Path(args.path)
    if root.is_dir():
        splits = [args.split] if args.split else sorted(p.stem for p in root.glob("*.idx"))
        if not splits:
            inside = " (try its tokens/ folder)" if (root / "tokens").is_dir() else ""
            raise InputError(f"{args.path}: no .idx files: not a TokenDataset folder{inside}")
    elif not root.exists() and not Path(f"{args.path}.idx").exists():
        raise InputError(f"{args.path}: no such TokenDataset folder or .bin/.idx prefix")
    try:
        if root.is_dir():
            prefixes = [resolve_prefix(str(root), s) for s in splits]
        else:
            prefixes = [resolve_prefix(args.path, "train")]
    except InputError as e:  # its message names `data.paths`, the training config's field
        raise InputError(str(e).removeprefix("data.paths: ")) from None
    for prefix in prefixes:
        ds = IndexedDataset(prefix)
        lengths = ds.sequence_lengths
        mean = float(lengths.mean()) if len(lengths) else 0.0
        print(
            f"{prefix}: {ds.num_documents} documents, {len(ds)} sequences, {ds.num_tokens} tokens, "
            f"dtype {ds.dtype.name}, mean {mean:.1f} tokens/document"
        )
    return 0
