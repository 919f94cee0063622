"""The handlers of kiln.serving.cli's commands (imported only when one runs)."""

from __future__ import annotations

import argparse
import logging
import sys

from kiln.engine.lora_config import parse_lora_flags
from kiln.platform.errors import InputError
from kiln.platform.runtime import Runtime
from kiln.platform.signals import stop_on_signals
from kiln.serving.client import KilnClient
from kiln.serving.exposure import public_bind_warning
from kiln.serving.launch import launch
from kiln.serving.ray_idle import quiet_idle_ray


def serve_settings(args: argparse.Namespace) -> dict:
    """The endpoint settings (`AppSettings` fields) of a parsed `kiln serve` command line."""
    deployment: dict = {
        "num_replicas": args.replicas,
        "num_cpus": args.num_cpus,
        "num_gpus": args.num_gpus,
    }
    if args.max_replicas:
        deployment["autoscaling"] = {
            "min_replicas": args.replicas,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": args.target_ongoing_requests,
        }
    return {
        "backend": args.backend,
        "model_name": args.model_name,
        "api_key": args.api_key,
        "triton_url": args.triton_url,
        "triton_model": args.triton_model,
        "limits": {"max_new_tokens": args.max_new_tokens},
        "batching": {
            **({} if args.max_batch_size is None else {"max_batch_size": args.max_batch_size}),
            "speculative": speculative_settings(args),
        },
        "dtype": {"bf16": "bfloat16", "fp32": "float32"}.get(args.dtype, args.dtype),
        "quantize": args.quantize,
        "quantize_group_size": args.quantize_group_size,
        "cpu_compile": args.cpu_compile,
        "lora": lora_settings(args),
        "deployment": deployment,
    }


def speculative_settings(args: argparse.Namespace) -> dict | None:
    """`batching.speculative` from --speculative, --speculative-model, --num-speculative-tokens
    and --speculative-disable-by-batch-size (None: speculative decoding off)."""
    method, model = args.speculative, args.speculative_model
    extra = {
        "num_speculative_tokens": (args.num_speculative_tokens, "--num-speculative-tokens"),
        "disable_by_batch_size": (
            args.speculative_disable_by_batch_size,
            "--speculative-disable-by-batch-size",
        ),
    }
    if method is None and model is None:
        for value, flag in extra.values():
            if value is not None:
                raise InputError(f"{flag}: needs --speculative ngram or --speculative-model PATH")
        return None
    options: dict = {"method": method, "model": model}
    options.update({key: value for key, (value, _) in extra.items() if value is not None})
    return options


def lora_settings(args: argparse.Namespace) -> dict | None:
    """The `lora` settings of `--lora NAME=PATH` / `--max-loras` / `--max-lora-rank` (None when
    none is given: LoRA serving off)."""
    flags = {"max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank}
    if not args.lora and all(v is None for v in flags.values()):
        return None
    lora = {k: v for k, v in flags.items() if v is not None}
    return {"adapters": parse_lora_flags(args.lora), **lora}


def serve_command(args: argparse.Namespace) -> int:
    settings = serve_settings(args)
    if warning := public_bind_warning(args.host, args.api_key):
        print(warning, file=sys.stderr, flush=True)
    stop_on_signals()  # SIGINT stops it even where the shell started it with SIGINT ignored
    quiet_idle_ray()  # an embedded Ray's Serve controller polls once a second, not 10 times
    runtime = Runtime(address=args.address).ensure()
    try:
        endpoint = launch(args.model_dir, settings, host=args.host, port=args.port)
        print(f"kiln: serving {endpoint.model_name!r} at {endpoint.url}", flush=True)
        print(
            f"  OpenAI:  {endpoint.url}/v1/completions, {endpoint.url}/v1/chat/completions\n"
            f"  KServe v2: {endpoint.url}/v2/models/{endpoint.model_name}/infer",
            flush=True,
        )
        print("  Ctrl-C to stop", flush=True)
        endpoint.wait()
    finally:
        runtime.shutdown()
    print(f"kiln: stopped serving at {endpoint.url} (replicas and Ray shut down)", flush=True)
    return 0


def generate_command(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no per-request log lines

    fields = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop,
    }
    with KilnClient(args.url, api_key=args.api_key, model=args.model) as client:
        chat = (
            args.chat
            if args.chat is not None
            else client.model_card().get("has_chat_template", False)
        )
        messages = [{"role": "user", "content": args.prompt}]
        if args.stream:
            deltas = (
                client.stream_chat(messages, **fields)
                if chat
                else client.stream(args.prompt, **fields)
            )
            text = ""
            for delta in deltas:
                text += delta
                sys.stdout.write(delta)
                sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            text = (
                client.chat(messages, **fields) if chat else client.complete(args.prompt, **fields)
            )
            print(text)
    if not text.strip():
        hint = "a chat model wants --chat" if not chat else "try another prompt or --max-tokens"
        print(f"kiln: warning: the model returned no text ({hint})", file=sys.stderr)
    return 0
