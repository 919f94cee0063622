"""The YAML reference in docs/ is generated from the configs; stale means this fails."""

from pathlib import Path

from kiln.platform.reference import render

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "yaml-reference.md"


def test_yaml_reference_matches_the_code():
    assert REFERENCE.read_text() == render(), (
        "docs/yaml-reference.md is stale: run `kiln reference --write docs/yaml-reference.md`"
    )


def test_reference_covers_every_stage_field():
    from kiln.platform.registry import available_stages, stage_class

    text = render()
    for name in available_stages():
        assert f"## `{name}`" in text
        for field, info in stage_class(name).Config.model_fields.items():
            assert f"`{info.alias or field}`" in text, f"{name}.{field} missing"
