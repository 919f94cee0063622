"""How an on-policy loop's resume state holds the policy and its optimizer: as one process has
them (`PlainState`), or gathered whole from a policy laid out over ranks (`GatheredState`,
layouts.py), so a laid-out run saves one file that rank 0 writes and every rank reads back
into its own shards: FSDP2's and TP's DTensors go in and out through torch's
`get_state_dict` / `set_state_dict` with full (unsharded) state dicts."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer


class PlainState:
    writes = True  # this process writes the state file

    def get(self, policy: nn.Module, optimizer: Optimizer) -> tuple[dict, dict]:
        return policy.state_dict(), optimizer.state_dict()

    def set(self, policy: nn.Module, optimizer: Optimizer, model: dict, optim: dict) -> None:
        policy.load_state_dict(model)
        optimizer.load_state_dict(optim)


class GatheredState:
    """Full state dicts of a laid-out policy: gathered to rank 0 (a collective: every rank
    calls `get`), which alone writes them; each rank loads the whole file into its shards."""

    def __init__(self) -> None:
        self.writes = dist.get_rank() == 0

    def get(self, policy: nn.Module, optimizer: Optimizer) -> tuple[dict, dict]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(policy, optimizer, options=options)

    def set(self, policy: nn.Module, optimizer: Optimizer, model: dict, optim: dict) -> None:
        options = StateDictOptions(full_state_dict=True)
        set_state_dict(
            policy, optimizer, model_state_dict=model, optim_state_dict=optim, options=options
        )
