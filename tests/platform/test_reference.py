"""The YAML reference in docs/ is generated from the configs; stale means this fails."""

from pathlib import Path

from kiln.platform.reference import render

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "yaml-reference.md"


def test_yaml_reference_matches_the_code():
    assert REFERENCE.read_text() == render(), (
        "docs/yaml-reference.md is stale: run `kiln reference --write docs/yaml-reference.md`"
    )


def test_reference_covers_every_stage_field():
    from kiln.platform.registry import public_stages, stage_class

    text = render()
    for name in public_stages():
        assert f"## `{name}`" in text
        for field, info in stage_class(name).Config.model_fields.items():
            assert f"`{info.alias or field}`" in text, f"{name}.{field} missing"


def test_every_user_facing_field_has_a_description():
    """`kiln stages NAME` and the reference show each field's description: none may be blank."""
    from kiln.platform.reference import field_rows, ray_section
    from kiln.platform.registry import public_stages, stage_class
    from kiln.platform.runtime import RayConfig

    assert ray_section()  # the `ray:` block is user-facing too
    blank = [f"ray.{key}" for key, _, _, desc in field_rows(RayConfig) if not desc.strip()]
    for name in public_stages():
        config = stage_class(name).Config
        blank += [f"{name}.{key}" for key, _, _, desc in field_rows(config) if not desc.strip()]
    assert not blank, f"{len(blank)} config fields have no description: {blank}"
