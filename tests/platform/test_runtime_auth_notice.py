"""The embedded Ray keeps Ray's token-auth default but not its terminal notice."""

from __future__ import annotations

import logging

from ray._private.authentication import authentication_token_setup as ray_auth

from kiln.platform.runtime import _quiet_auth_notice


def test_rays_own_notice_is_silenced_only_while_starting(caplog):
    caplog.set_level(logging.WARNING)
    with _quiet_auth_notice():
        ray_auth._warn_token_auth_enabled()  # what ray.init calls for a fresh local cluster
    assert "Token authentication" not in caplog.text
    ray_auth._warn_token_auth_enabled()
    assert "Token authentication is enabled" in caplog.text  # the logger is Ray's, unchanged
