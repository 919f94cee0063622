"""kiln/pipelines/rl.yaml and its SDK twin (kiln/pipelines/rl.py) build the same pipeline."""

from kiln.pipelines.rl import build
from kiln.platform.spec import load_pipeline


def _shape(pipeline):
    return [(s.type_name, s.name, s.config.model_dump(mode="json")) for s in pipeline.stages]


def test_rl_yaml_and_its_sdk_twin_are_the_same_pipeline(tmp_path):
    from_yaml = load_pipeline("kiln/pipelines/rl.yaml", runs_dir=str(tmp_path))
    assert _shape(from_yaml) == _shape(build())
    assert from_yaml.wiring == build().wiring
    assert from_yaml.wiring["grpo"] == {"model": "base.model"}
    # the async option reaches the stage's config the same way from both
    lagged = load_pipeline(
        "kiln/pipelines/rl.yaml", ["grpo.max_policy_lag=1"], runs_dir=str(tmp_path)
    )
    assert _shape(lagged) == _shape(build(max_policy_lag=1))
    assert lagged.stages[1].config.max_policy_lag == 1
