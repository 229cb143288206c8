"""matrix-js-sdk's account management (``getCapabilities``, ``setPassword`` through
user-interactive auth, ``deactivateAccount``, the start-up calls) against a real
``roomstream run`` process, on SQLite and PostgreSQL."""

from __future__ import annotations

from tests.support.homeserver import RunningServer
from tests.support.js_sdk import JS_DIR, run_script


async def test_matrix_js_sdk_changes_the_password_and_deactivates(
    running_server: RunningServer,
) -> None:
    assert (JS_DIR / "node_modules" / "matrix-js-sdk").is_dir(), (
        "matrix-js-sdk is not installed: run `make setup` (npm ci in tests/client/js)"
    )
    report = await run_script("account_management.mjs", running_server.url)
    assert report == {
        "changePassword": {"enabled": True},
        "flows": [{"stages": ["m.login.password"]}],
        "stillLoggedIn": True,
        "otherDevice": "M_UNKNOWN_TOKEN",
        "oldPassword": "M_FORBIDDEN",
        "turn": {},
        "protocols": {},
        "threepids": {"threepids": []},
        "guest": "M_GUEST_ACCESS_FORBIDDEN",
        "deactivated": {"id_server_unbind_result": "no-support"},
        "afterDeactivation": "M_USER_DEACTIVATED",
    }
