"""The embedded Ray keeps Ray's token-auth default but not its terminal notice."""

from __future__ import annotations

import logging

from ray._private.authentication import authentication_token_setup as ray_auth

from kiln.platform.runtime import _quiet_auth_notice


def test_rays_own_notice_is_silenced_only_while_starting():
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    notice = logging.getLogger(ray_auth.__name__)  # wherever Ray's logging config routes it
    notice.addHandler(handler)
    try:
        with _quiet_auth_notice():
            ray_auth._warn_token_auth_enabled()  # what ray.init calls for a fresh local cluster
        assert seen == []
        ray_auth._warn_token_auth_enabled()
        assert len(seen) == 1 and "Token authentication is enabled" in seen[0]
    finally:
        notice.removeHandler(handler)
