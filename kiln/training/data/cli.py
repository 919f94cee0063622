"""`kiln tokenize` (Corpus -> Tokenizer + TokenDataset) and `kiln tokens` (describe a dataset)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tokenize", help="train/load a tokenizer and write Megatron indexed datasets per split"
    )
    p.add_argument("corpus", help="a Corpus directory (Parquet shards with id, text)")
    p.add_argument(
        "--out",
        "--output",
        required=True,
        help="output folder: OUT/tokens (TokenDataset) and OUT/tokenizer",
    )
    p.add_argument(
        "--tokenizer", help="use this tokenizer.json (or folder holding one) instead of training"
    )
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument(
        "--special-token", dest="special_tokens", action="append", default=[], metavar="TOKEN"
    )
    p.add_argument("--eod-token", default="<|endoftext|>")
    p.add_argument("--valid-fraction", type=float, default=0.01)
    p.add_argument("--test-fraction", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch-size", type=int, default=1024, help="documents per Ray Data batch")
    p.add_argument("--num-actors", type=int, default=2, help="tokenizer actors")
    p.add_argument(
        "--address", help="Ray cluster to attach to (default: $RAY_ADDRESS, else an embedded Ray)"
    )
    p.set_defaults(func=_tokenize)

    p = sub.add_parser(
        "tokens", help="describe an indexed dataset (TokenDataset folder or .bin/.idx prefix)"
    )
    p.add_argument("path")
    p.add_argument("--split", default=None, help="only this split of a TokenDataset")
    p.set_defaults(func=_describe)


def _tokenize(args) -> int:
    from kiln.platform import console
    from kiln.platform.artifact import Artifact
    from kiln.platform.errors import ConfigError, InputError
    from kiln.platform.runtime import Runtime
    from kiln.platform.signals import stop_on_signals
    from kiln.platform.stage import StageContext, run_steps
    from kiln.training.data.stages import TokenizeStage

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


def _describe(args) -> int:
    from kiln.platform.errors import InputError
    from kiln.text.indexed_dataset import IndexedDataset
    from kiln.training.data.sources import resolve_prefix

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
