"""Ray Serve autoscaling from the serve config: validated, and handed to the deployment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.serving.app import AppSettings, DeploymentOptions
from tests.serving.rest.conftest import AUTOSCALING


def test_the_deployment_runs_with_the_configured_autoscaling(endpoint):
    """Serve's own view of the running app (its controller's details) holds the options."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    deployment = details["applications"]["rest-test"]["deployments"]["KilnServer"]
    config = deployment["deployment_config"]["autoscaling_config"]
    for key, value in AUTOSCALING.items():
        assert config[key] == value, key
    assert deployment["target_num_replicas"] == 1
    assert deployment["deployment_config"]["max_ongoing_requests"] == 256


@pytest.mark.parametrize(
    ("autoscaling", "field"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"),
        ({"max_replicas": 0}, "max_replicas"),
        ({"max_replicas": 2, "target_ongoing_requests": 0}, "target_ongoing_requests"),
        ({"max_replicas": 2, "initial_replicas": 5}, "initial_replicas"),
        ({"max_replicas": 2, "target_num_ongoing": 4}, "target_num_ongoing"),
    ],
)
def test_bad_autoscaling_is_refused_naming_the_field(autoscaling, field):
    with pytest.raises(ValidationError, match=field):
        AppSettings(model_dir="m", deployment={"autoscaling": autoscaling})


def test_autoscaling_replaces_a_fixed_replica_count():
    from kiln.serving.app import build_app

    opts = DeploymentOptions(autoscaling={"max_replicas": 4, "target_ongoing_requests": 8})
    app = build_app(AppSettings(model_dir="m", deployment=opts))
    config = app._bound_deployment._deployment_config
    assert config.autoscaling_config.max_replicas == 4
    assert config.autoscaling_config.target_ongoing_requests == 8
