"""`kiln curate --input PATH... --output DIR [--config FILE]`."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "curate", help="read, clean, filter and deduplicate text into a Parquet corpus"
    )
    p.add_argument(
        "--input", nargs="+", required=True, metavar="PATH", help="files, folders or globs"
    )
    p.add_argument("--output", required=True, metavar="DIR")
    p.add_argument("--config", metavar="FILE", help="YAML or JSON with CurateConfig fields")
    p.add_argument(
        "--stream", choices=["ray", "inline"], help="override config: where per-document work runs"
    )
    p.add_argument(
        "--cluster", choices=["local", "ray"], help="override config: Dask scheduler for dedup"
    )
    p.set_defaults(func=_curate)


def load_config(path: str | None, **overrides):
    import yaml
    from pydantic import ValidationError

    from kiln.curator.config import CurateConfig
    from kiln.platform.errors import ConfigError, InputError, format_validation_error

    body = {}
    if path:
        try:
            with open(path) as f:
                body = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise InputError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: expected a mapping of curate config fields")
        body = body.get("curate", body) if isinstance(body.get("curate"), dict) else body
    body.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return CurateConfig.model_validate(body)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "curate")) from None


def _curate(args) -> int:
    from kiln.curator.pipeline import curate

    cfg = load_config(args.config, input=args.input, stream=args.stream, cluster=args.cluster)
    report = curate(cfg, args.output)
    print(
        json.dumps(
            {k: report[k] for k in ("documents_in", "kept", "rejected", "removed_by_reason")},
            indent=2,
        )
    )
    print(f"wrote {args.output} ({report['docs_per_s']:.0f} docs/s)")
    return 0
