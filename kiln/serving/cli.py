"""`kiln serve MODEL_DIR` (a REST endpoint on Ray Serve) and `kiln generate --url URL PROMPT`."""

from __future__ import annotations

import argparse
import os
import sys

from kiln.serving.export import cli as export_cli

LOCAL_PORT = 8000
LOCAL_URL = f"http://127.0.0.1:{LOCAL_PORT}"  # where `kiln serve` listens by default


def register(subparsers) -> None:
    """Serving's commands: export's (`export`, `import-hf`, ...), then `serve` and the client."""
    export_cli.register(subparsers)
    _register_serve(subparsers)


def _register_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve an exported model over REST (OpenAI, KServe v2, Triton generate) on Ray Serve",
        description="Serve an exported model (an ExportedModel dir or a Hugging Face dir) "
        "until Ctrl-C.",
    )
    p.add_argument(
        "model_dir", metavar="MODEL_DIR", help="exported model (with hf/ and/or triton/)"
    )
    p.add_argument("--backend", choices=["local", "triton"], default="local")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=LOCAL_PORT)
    p.add_argument("--model-name", help="name clients use (default: the model's)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("KILN_API_KEY"),
        help="require this Bearer key (env KILN_API_KEY)",
    )
    p.add_argument("--triton-url", help="existing Triton gRPC host:port (default: start one)")
    p.add_argument("--triton-model", help="model name in the Triton repository")
    p.add_argument(
        "--max-batch-size", type=int, default=8, help="local backend: sequences decoded at once"
    )
    p.add_argument(
        "--quantize",
        choices=["int8", "int4", "fp8"],
        help="local backend: weight-only int8 / int4 on CPU, fp8 on CUDA GPUs (capability 8.9+)",
    )
    p.add_argument(
        "--quantize-group-size",
        type=int,
        choices=[32, 64, 128, 256],
        default=32,
        help="int4: inputs that share one scale (default 32)",
    )
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, help="autoscale between --replicas and this")
    p.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=2.0,
        help="autoscaling: ongoing requests per replica to aim for",
    )
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica")
    p.add_argument(
        "--max-new-tokens", type=int, default=512, help="largest max_tokens a request may ask"
    )
    p.add_argument(
        "--address", help="Ray cluster address (default: RAY_ADDRESS or an embedded Ray)"
    )
    p.set_defaults(func=_serve)

    g = subparsers.add_parser("generate", help="complete a prompt with a running endpoint")
    g.add_argument("prompt", metavar="PROMPT")
    g.add_argument(
        "--url",
        default=os.environ.get("KILN_URL", LOCAL_URL),
        help=f"endpoint base URL (default: $KILN_URL, else {LOCAL_URL}: `kiln serve`'s)",
    )
    g.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send PROMPT as a user message through the model's chat template (default: when "
        "the served model has a chat template)",
    )
    g.add_argument("--api-key", default=os.environ.get("KILN_API_KEY"))
    g.add_argument("--model")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--stream", action="store_true", help="print text as it arrives")
    g.set_defaults(func=_generate)


def serve_settings(args: argparse.Namespace) -> dict:
    """The endpoint settings (`AppSettings` fields) of a parsed `kiln serve` command line."""
    deployment: dict = {"num_replicas": args.replicas, "num_cpus": args.num_cpus}
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
        "batching": {"max_batch_size": args.max_batch_size},
        "quantize": args.quantize,
        "quantize_group_size": args.quantize_group_size,
        "deployment": deployment,
    }


def _serve(args: argparse.Namespace) -> int:
    from kiln.platform.runtime import Runtime
    from kiln.platform.signals import stop_on_signals
    from kiln.serving.exposure import public_bind_warning
    from kiln.serving.launch import launch

    settings = serve_settings(args)
    if warning := public_bind_warning(args.host, args.api_key):
        print(warning, file=sys.stderr, flush=True)
    stop_on_signals()  # SIGINT stops it even where the shell started it with SIGINT ignored
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


def _generate(args: argparse.Namespace) -> int:
    import logging

    from kiln.serving.client import KilnClient

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
