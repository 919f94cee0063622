"""Entry point under torchrun.

    python -m torch.distributed.run --nproc-per-node N -m kiln.training.torchrun_main --config FILE

FILE is YAML or JSON holding a TrainConfig (optionally under a `train:` key).
"""

from __future__ import annotations

import argparse
import logging
import sys

from kiln.platform.config import load_config as load
from kiln.platform.errors import KilnError
from kiln.training.config import TrainConfig
from kiln.training.launch import init_process_group_from_env
from kiln.training.trainer import Trainer


def load_config(path: str):
    """A TrainConfig from a YAML/JSON file; errors name the file and the field."""

    return load(TrainConfig, path, block="train")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln.training.torchrun_main")
    parser.add_argument("--config", required=True, help="TrainConfig as YAML or JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import torch.distributed as dist

    try:
        cfg = load_config(args.config)
        init_process_group_from_env(cfg.device, cfg.optimizer_offload)
        Trainer(cfg).train()
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
