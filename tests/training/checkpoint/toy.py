"""A small trainer that hands the Checkpointer its components (model parts, optimizers, lr
schedulers, data loader, TrainState, ParallelDims), parallelised with DTensor TP and FSDP2.
It keeps the checkpoint tests independent of the full Trainer; the Trainer tests cover that path."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from kiln.training.checkpoint import CheckpointConfig, Checkpointer
from kiln.training.data import build_dataloader
from kiln.training.data.config import DataConfig
from kiln.training.parallel.dims import ParallelDims
from kiln.training.train_state import TrainState

VOCAB, DIM, HIDDEN, LAYERS, SEQ, MICRO = 64, 32, 64, 2, 16, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return x + self.w2(F.silu(self.w1(x)) * self.w3(x))


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(h)


class ToyTrainer:
    def __init__(
        self, ckpt: CheckpointConfig, tp: int = 1, dp_shard: int = 1, steps: int = 10, seed: int = 0
    ):
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.dims = ParallelDims(dp_shard=dp_shard, tp=tp, world_size=world)
        torch.manual_seed(seed)
        model = ToyModel()
        if dist.is_initialized():
            self.dims.build_mesh("cpu")
            if tp > 1:
                for block in model.layers.values():
                    parallelize_module(
                        block,
                        self.dims.mesh("tp"),
                        {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()},
                    )
            for block in model.layers.values():
                fully_shard(block, mesh=self.dims.mesh("dp_shard"))
            fully_shard(model, mesh=self.dims.mesh("dp_shard"))
        dp_rank, dp_size = self.dims.dp_rank, self.dims.dp_size
        self.model_parts = [model]
        self.optimizers = [
            torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
        ]
        self.lr_schedulers = [
            torch.optim.lr_scheduler.LambdaLR(self.optimizers[0], lambda s: 1.0 / (1 + s))
        ]
        self.global_batch = MICRO * 4  # fixed across layouts, so losses compare across dp sizes
        self.micro = self.global_batch // dp_size
        self.dataloader = build_dataloader(
            DataConfig(synthetic=True, prefetch=0),
            seq_len=SEQ,
            micro_batch_size=self.micro,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=0,
            vocab_size=VOCAB,  # model seed varies, data stays
        )
        self.train_state = TrainState()
        self.checkpointer = None
        if ckpt.dir or ckpt.load_from:
            self.checkpointer = Checkpointer(
                ckpt,
                model_parts=self.model_parts,
                optimizers=self.optimizers,
                lr_schedulers=self.lr_schedulers,
                dataloader=self.dataloader,
                train_state=self.train_state,
                dims=self.dims,
                total_steps=steps,
                model_config={"dim": DIM, "vocab_size": VOCAB},
            )

    @property
    def step(self) -> int:
        return self.train_state.step

    def train_step(self) -> float:
        model, opt = self.model_parts[0], self.optimizers[0]
        tokens, labels = next(iter(self.dataloader))
        logits = model(tokens)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten()
        )  # FSDP averages grads over dp
        loss.backward()
        opt.step()
        opt.zero_grad()
        self.lr_schedulers[0].step()
        if dist.is_initialized():
            loss = loss.detach().clone()
            dist.all_reduce(
                loss
            )  # every tp peer holds the same value: the mean over ranks is the global loss
            loss = loss / dist.get_world_size()
        self.train_state.step += 1
        self.train_state.tokens_seen += self.global_batch * SEQ
        return float(loss.detach())

    def train(self, until: int) -> list[float]:
        losses = []
        while self.step < until:
            losses.append(self.train_step())
            if self.checkpointer:
                self.checkpointer.save(self.step)
        if self.checkpointer:
            self.checkpointer.close()
        return losses


def portable(state: dict[str, torch.Tensor]) -> dict:
    """Plain pickles: tensors put on a multiprocessing queue need their sender alive to be read."""
    return {k: v.numpy() for k, v in state.items()}
