"""Data-loader benchmark: batch assembly from memory-mapped indexed datasets, and index build time.

Prints both sides of each comparison and the ratio, from one run:

1. tokens/s of batch assembly (random access, seq 2048, batch 8) by kiln's loader from a
   memory-mapped Megatron indexed dataset, in steady state: each repeat times 2048 fresh batches,
   so the figure includes the piece tables built every 512 batches, first-touch page faults of
   the memory map and a pass (epoch) index build; against
   - the memcpy limit: the same tokens already in RAM as one flat array, each sample one
     contiguous slice copied out (no index, no memory map, no document boundaries), and
   - tokenising JSONL on the fly (read a line, json-decode, BPE-encode, pack), the usual
     alternative to pre-tokenised data;
2. seconds to build the document/sample/shuffle indices for 1M documents: kiln's vectorised numpy
   against Megatron-Core's own functions (C++ `build_sample_idx`) on the same lengths.

    .venv/bin/python bench/dataloader.py            # ~1-2 minutes on 2 cores
    .venv/bin/python bench/dataloader.py --docs 5000 --copies 2 --batches 200   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

SEQ, BATCH = 2048, 8


def make_corpus(n_docs: int, seed: int = 0) -> list[str]:
    """Zipf-distributed pseudo-words, documents of log-normal length (a few hundred words)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, int(rng.integers(2, 9)))) for _ in range(5000)]
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    lengths = np.clip(rng.lognormal(5.5, 0.7, n_docs).astype(int), 5, 4000)
    return [" ".join(np.asarray(vocab)[rng.choice(len(vocab), n, p=p)]) + "." for n in lengths]


def best_rate(fn, n_batches: int, repeats: int = 3) -> float:
    """Tokens/s of `fn(batch_number)` over n_batches, best of `repeats`.

    Timed in CPU seconds of this process (`time.process_time`): the benchmark machine is shared,
    and wall-clock time there mostly measures other people's load. Everything timed is
    single-threaded, so CPU time is the time the work takes on an idle core."""
    best = 0.0
    for r in range(repeats):
        t0 = time.process_time()
        for b in range(n_batches):
            fn(r * n_batches + b)
        best = max(best, n_batches * SEQ * BATCH / max(time.process_time() - t0, 1e-9))
    return best


def bench_assembly(root: Path, n_docs: int, n_batches: int, copies: int) -> None:
    import torch

    from kiln.text.indexed_dataset import IndexedDataset, IndexedDatasetWriter, token_dtype
    from kiln.text.tokenizer import EOD_TOKEN
    from kiln.training.data import DataConfig, build_dataloader
    from kiln.training.data.tokenizer import train_tokenizer

    texts = make_corpus(n_docs)
    tok = train_tokenizer(texts[:2000], vocab_size=8000, special_tokens=[EOD_TOKEN])
    eod = tok.token_to_id(EOD_TOKEN)
    # Each document is written `copies` times (the shuffle scatters the copies): the timed batches
    # then stay inside one pass, as they would on a real corpus, instead of timing the once-per-
    # epoch index build of a toy dataset's many short passes.
    encoded = [[*enc.ids, eod] for enc in tok.encode_batch(texts, add_special_tokens=False)]
    with IndexedDatasetWriter(root / "train", token_dtype(tok.get_vocab_size())) as w:
        for _ in range(copies):
            for ids in encoded:
                w.add_document(ids)
    del encoded  # millions of live ints would make the garbage collector part of every timing
    with open(root / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
    ds = IndexedDataset(root / "train")
    print(
        f"dataset: {ds.num_documents} documents, "
        f"{ds.num_tokens / 1e6:.1f}M tokens ({ds.dtype.name})"
    )

    # kiln: the training loader itself, assembling in the caller's thread (prefetch off)
    cfg = DataConfig(paths=[str(root / "train")], index_cache_dir=str(root / "cache"), prefetch=0)
    loader = build_dataloader(
        cfg, seq_len=SEQ, micro_batch_size=BATCH, dp_rank=0, dp_size=1, seed=0
    )
    next(loader)  # build the index outside the timing
    ours = best_rate(lambda b: next(loader), n_batches)

    # memcpy limit: the same tokens in RAM, each sample one contiguous slice, random offsets
    flat = np.fromfile(root / "train.bin", dtype=ds.dtype)
    rng = np.random.default_rng(1)
    starts = rng.integers(0, len(flat) - SEQ - 1, (4 * n_batches, BATCH))
    out_np = np.empty((BATCH, SEQ + 1), dtype=np.int64)

    def memcpy(b: int) -> None:
        for i, s in enumerate(starts[b]):
            out_np[i] = flat[s : s + SEQ + 1]
        return torch.from_numpy(out_np[:, :-1]), torch.from_numpy(out_np[:, 1:])

    limit = best_rate(memcpy, n_batches)

    # tokenising JSONL on the fly, packing documents into the same batches
    def jsonl_batches():
        buf: list[int] = []
        while True:
            with open(root / "corpus.jsonl") as f:
                for line in f:
                    buf.extend(tok.encode(json.loads(line)["text"], add_special_tokens=False).ids)
                    buf.append(eod)
                    while len(buf) >= BATCH * SEQ + 1:
                        t = torch.tensor(buf[: BATCH * SEQ + 1])
                        yield t[:-1].view(BATCH, SEQ), t[1:].view(BATCH, SEQ)
                        del buf[: BATCH * SEQ]

    it = jsonl_batches()
    jsonl = best_rate(lambda b: next(it), max(5, n_batches // 20), repeats=2)

    print(
        f"\nbatch assembly, seq {SEQ} x batch {BATCH}, random access "
        "(tokens per CPU-second, best of 3):"
    )
    print(f"  kiln loader (mmap indexed dataset) {ours / 1e6:10.1f} M tokens/s")
    print(
        f"  memcpy limit (in-RAM slices)       {limit / 1e6:10.1f} M tokens/s   "
        f"kiln/limit = {ours / limit:.2f}"
    )
    print(
        f"  JSONL tokenised on the fly         {jsonl / 1e6:10.1f} M tokens/s   "
        f"kiln/jsonl = {ours / jsonl:.0f}x"
    )


def bench_index(root: Path, n_docs: int) -> None:
    from kiln.text.indexed_dataset import IndexedDataset, write_index
    from kiln.training.data.gpt_dataset import GPTDataset, build_indices

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers_cpp
        from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index

    rng = np.random.default_rng(0)
    sizes = np.clip(rng.lognormal(6.0, 1.0, n_docs), 1, 30000).astype(np.int32)
    prefix = root / "million"
    write_index(f"{prefix}.idx", np.dtype(np.uint16), sizes, np.arange(n_docs + 1))
    with open(f"{prefix}.bin", "wb") as f:  # sparse: only the index matters here
        f.truncate(int(sizes.sum(dtype=np.int64)) * 2)
    ds = IndexedDataset(prefix)
    documents = np.arange(n_docs, dtype=np.int32)

    def kiln_build() -> float:
        t0 = time.process_time()
        build_indices(ds.sequence_lengths, documents, SEQ, 1234, None)
        return time.process_time() - t0

    def megatron_build() -> float:
        t0 = time.process_time()
        rs = np.random.RandomState(1234)
        doc_index = _build_document_index(documents, 1, rs, False)
        sample = helpers_cpp.build_sample_idx_int64(
            np.array(ds.sequence_lengths),
            doc_index,
            SEQ,
            1,
            int(sizes.sum(dtype=np.int64)),
            True,
            1,
        )
        _build_shuffle_index(len(sample) - 1, len(sample) - 1, rs)
        return time.process_time() - t0

    ours = min(kiln_build() for _ in range(3))
    theirs = min(megatron_build() for _ in range(3))
    t0 = time.process_time()
    GPTDataset(ds, SEQ, 1234, cache_dir=root / "idx-cache")
    cold = time.process_time() - t0
    t0 = time.process_time()
    GPTDataset(ds, SEQ, 1234, cache_dir=root / "idx-cache")
    warm = time.process_time() - t0
    print(
        f"\nindex build, {n_docs / 1e6:.1f}M documents, {sizes.sum() / 1e9:.2f}B tokens, "
        f"seq {SEQ} (CPU seconds, best of 3):"
    )
    print(f"  kiln (vectorised numpy)            {ours:8.3f} s")
    print(
        f"  Megatron-Core (C++ build_sample_idx){theirs:7.3f} s   "
        f"kiln/megatron time = {ours / theirs:.2f}"
    )
    print(
        f"  kiln GPTDataset incl. cache write  {cold:8.3f} s; from the on-disk cache {warm:.3f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=20000, help="documents in the assembly benchmark")
    ap.add_argument("--batches", type=int, default=2048, help="batches timed per repeat")
    ap.add_argument(
        "--copies", type=int, default=8, help="times each document is written to the dataset"
    )
    ap.add_argument("--index-docs", type=int, default=1_000_000)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        bench_assembly(Path(tmp), args.docs, args.batches, args.copies)
        bench_index(Path(tmp), args.index_docs)


if __name__ == "__main__":
    main()
