"""`kiln serve MODEL_DIR` (a REST endpoint on Ray Serve) and `kiln generate --url URL PROMPT`."""

from __future__ import annotations

import argparse
import os

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
        "--max-batch-size",
        type=int,
        help="local backend: sequences running at once at most (vLLM's --max-num-seqs; default "
        "128); the token budget and free KV blocks decide how many of them run",
    )
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft_model"],
        help="local backend: speculative decoding by prompt lookup (ngram: no extra model) or a "
        "draft model (--speculative-model)",
    )
    p.add_argument(
        "--speculative-model",
        metavar="PATH",
        help="draft model for speculative decoding: a smaller model with the same vocabulary",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        help="tokens drafted and verified per step (default 4)",
    )
    p.add_argument(
        "--speculative-disable-by-batch-size",
        type=int,
        metavar="N",
        help="decode plainly in steps where N or more requests decode at once",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "fp32", "bf16"],
        default="float32",
        help="local backend: weights and KV cache dtype; bfloat16 (bf16) packs the weights for "
        "the CPU's AMX / AVX-512-BF16 units when it has them",
    )
    p.add_argument(
        "--no-cpu-compile",
        dest="cpu_compile",
        action="store_false",
        help="local backend, bfloat16 on CPU: keep the RMSNorms eager (by default inductor "
        "compiles them at load, 5-20 s)",
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
    p.add_argument(
        "--lora",
        action="append",
        metavar="NAME=PATH",
        help="local backend: serve the PEFT LoRA adapter folder PATH as model NAME (repeatable; "
        "turns on POST /v1/load_lora_adapter)",
    )
    p.add_argument(
        "--max-loras",
        type=int,
        help="LoRA adapters held at once, the least recently used idle one evicted (default 4; "
        "alone it turns LoRA serving on with no adapter yet)",
    )
    p.add_argument("--max-lora-rank", type=int, help="largest LoRA rank accepted (default 16)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, help="autoscale between --replicas and this")
    p.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=2.0,
        help="autoscaling: ongoing requests per replica to aim for",
    )
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica")
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (fp8 needs one)")
    p.add_argument(
        "--max-new-tokens", type=int, default=512, help="largest max_tokens a request may ask"
    )
    p.add_argument(
        "--address", help="Ray cluster address (default: RAY_ADDRESS or an embedded Ray)"
    )
    p.set_defaults(handler="kiln.serving.commands:serve_command")

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
    g.set_defaults(handler="kiln.serving.commands:generate_command")
