"""The handlers of kiln.serving.export.cli's commands (imported only when one runs)."""

from __future__ import annotations

import argparse
import os

from kiln.model.formats.weights import import_model
from kiln.platform.errors import ConfigError, InputError
from kiln.platform.signals import stop_on_signals
from kiln.serving.export.compare import PROMPTS, compare, load_for_compare
from kiln.serving.export.convert import convert, open_model
from kiln.serving.export.stages import ExportConfig, export_model
from kiln.serving.export.triton import TritonExportConfig
from kiln.serving.triton.server import TritonServer


def export_command(args: argparse.Namespace) -> int:
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in ("hf", "triton", "gguf")]
    if bad or not formats:
        raise ConfigError(f"--format: expected some of hf, triton, gguf (got {args.format!r})")
    triton = TritonExportConfig(
        max_batch_size=args.max_batch_size,
        instance_kind="KIND_GPU" if args.instance_kind == "gpu" else "KIND_CPU",
        instance_count=args.instances,
        decoupled=args.decoupled,
    )
    cfg = ExportConfig(
        formats=formats,
        model_name=args.model_name,
        dtype=args.dtype,
        gguf_type=args.gguf_type,
        quantize=args.quantize,
        triton=triton,
    )
    summary = export_model(args.checkpoint, args.out, cfg, tokenizer=args.tokenizer)
    print(
        f"exported {summary['architecture']} ({summary['parameters']:,} parameters) to {args.out}"
    )
    for key in ("hf_dir", "triton_repo", "gguf_file"):
        if key in summary:
            print(f"  {key.replace('_', ' ')}: {args.out.rstrip('/')}/{summary[key]}")
    for key in ("check_hf_max_logit_diff", "check_gguf_max_logit_diff"):
        if key in summary:
            print(f"  {key.split('_')[1]} vs source, max logit diff: {summary[key]:.3g}")
    return 0


def convert_command(args: argparse.Namespace) -> int:
    summary = convert(
        args.source,
        args.dest,
        to=args.to,
        tokenizer=args.tokenizer,
        gguf_type=args.gguf_type,
        dtype=args.dtype,
    )
    print(f"converted {args.source} to {args.to} at {args.dest} ({summary['parameters']:,} params)")
    return 0


def compare_models_command(args: argparse.Namespace) -> int:
    with open_model(args.a, args.tokenizer) as (cfg_a, state_a, tok_a, _):
        model_a = load_for_compare(cfg_a, state_a)
    with open_model(args.b, args.tokenizer) as (cfg_b, state_b, tok_b, _):
        model_b = load_for_compare(cfg_b, state_b)
    tok = tok_a or tok_b
    if tok is None:
        raise InputError("compare-models: no tokenizer beside A or B (pass --tokenizer)")
    prompts = [tok.encode(p).ids for p in (args.prompt or PROMPTS)]
    result = compare(
        model_a, model_b, prompts, tolerance=args.tolerance, greedy_tokens=args.greedy_tokens
    )
    for line in result.lines():
        print(line)
    return 0 if result.passed else 1


def import_hf_command(args: argparse.Namespace) -> int:
    ckpt = import_model(args.hf_dir, args.out, revision=args.revision)
    print(f"imported {args.hf_dir} as kiln checkpoint {ckpt}")
    return 0


def triton_up_command(args: argparse.Namespace) -> int:
    repo = args.repo
    if os.path.isdir(os.path.join(repo, "triton")):
        repo = os.path.join(repo, "triton")
    server = TritonServer(
        repo,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        log_verbose=args.log_verbose,
        restart=args.max_restarts > 0,  # the supervisor serve's own server has
        max_restarts=args.max_restarts,
    )
    # SIGINT/SIGTERM stop Triton cleanly, whatever dispositions this process inherited (a
    # background job of a non-interactive shell starts with SIGINT ignored)
    stop_on_signals()
    with server:
        # the ready line is inside the try: a Ctrl-C sent as soon as it is read still stops cleanly
        try:
            proc = server.process  # None if it died already: the supervisor restarts it
            print(
                f"tritonserver ready (pid {proc.pid if proc else '?'}): http {server.http_url}  "
                f"grpc {server.grpc_url}  metrics {server.metrics_url}",
                flush=True,
            )
            print("Ctrl-C to stop", flush=True)
            code = server.wait()
        except KeyboardInterrupt:
            code = 0
    if server.gave_up:  # the supervisor's error line said why
        return 1
    print("tritonserver stopped", flush=True)
    return code
