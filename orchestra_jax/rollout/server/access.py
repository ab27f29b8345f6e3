"""Access, body limits and errors shared by the project's HTTP servers.

The rollout server (`rollout/server/app.py`) and the orchestrator service
(`serve/app.py`) follow one set of rules: they listen on loopback unless told
otherwise, a host beyond loopback needs an API key (read from an environment
variable, never the command line), a key once set is required as
`Authorization: Bearer <key>`, a body over the limit is a 413, and every error is
JSON in OpenAI's shape `{"object": "error", "error": {message, type, param, code}}`.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Callable
from typing import Any

from aiohttp import web

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def json_error(
    status: int, message: str, kind: str, param: str | None = None, **headers: str
) -> web.Response:
    """An error response in OpenAI's shape."""
    body = {"message": message, "type": kind, "param": param, "code": status}
    return web.json_response({"object": "error", "error": body}, status=status, headers=headers)


def require_key(api_key: str, *, open_to: Callable[[web.Request], bool] | None = None):
    """Middleware: 401 for a request without `Authorization: Bearer <api_key>`, but the
    requests `open_to` lets through."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler):
        if open_to is not None and open_to(request):
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return json_error(
                401, "a valid API key is required (Authorization: Bearer)", "Unauthorized"
            )
        return await handler(request)

    return check


def api_key_from(
    env_name: str, host: str, *, exposes: str, harm: str, default_env: str, flag: str
) -> str | None:
    """The key in `$env_name` (None when unset or empty); SystemExit, saying what
    `exposes` would let anyone do (`harm`), when `host` is beyond loopback and there
    is none."""
    key = (os.environ.get(env_name) or None) if env_name else None
    if key is None and host not in LOOPBACK:
        raise SystemExit(
            f"--host {host} exposes {exposes} beyond this machine, where anyone who reaches "
            f"the port could {harm}: set ${env_name or default_env} ({flag}) to the key the "
            "clients send"
        )
    return key


async def read_json_body(
    request: web.Request,
    *,
    max_body_bytes: int,
    flag: str,
    refuse: Callable[..., Exception],
) -> Any:
    """The request's JSON body (None when empty). `refuse(message, status=...)` builds
    the error raised for a body over the limit (413, naming `flag`), one nested too
    deeply or one that is not JSON (400)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise refuse(
            f"request body exceeds this server's limit of {max_body_bytes} bytes ({flag})",
            status=413,
        ) from None
    try:
        return json.loads(raw or b"null")
    except RecursionError:
        raise refuse("request body is JSON nested too deeply", status=400) from None
    except ValueError as e:
        raise refuse(f"body is not valid JSON: {e}", status=400) from None
