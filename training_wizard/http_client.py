"""One JSON POST with a timeout, retried with exponential backoff: what the chat judge and the remote reward share.

Retried: a timeout, a connection error, HTTP 429 or 5xx, a reply that is not JSON, and a reply the caller's `parse`
cannot use (it returns None). Any other HTTP status is refused at once. Every failure is a one-line UserError
starting with the caller's `label`, never a traceback.
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from training_wizard.errors import UserError


def post_json(
    url: str,
    payload: Any,
    *,
    label: str,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    parse: Callable[[Any], Any] = lambda reply: reply,
    unusable: str = "an unusable reply",
    api_key: str = "",
) -> Any:
    """`parse(reply)` of the first usable JSON reply to POSTing `payload` to `url`.

    retries: tries after the first; backoff_s: the first retry's delay, doubled at each retry; unusable: how the
    last problem reads when `parse` returned None; api_key: sent as a bearer token when not empty.
    """
    body = json.dumps(json_safe(payload), default=str, allow_nan=False).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                parsed = parse(json.loads(response.read().decode()))
            if parsed is not None:
                return parsed
            problem = unusable
        except urllib.error.HTTPError as exc:
            if exc.code != 429 and exc.code < 500:
                raise UserError(f"{label}: the endpoint refused the request (HTTP {exc.code}: {exc.reason})") from None
            problem = f"HTTP {exc.code}"
        except (urllib.error.URLError, http.client.HTTPException, TimeoutError, OSError, ValueError) as exc:
            # HTTPException: a reply cut off or malformed (IncompleteRead, BadStatusLine), as worth a retry
            problem = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
    raise UserError(f"{label}: no usable answer after {retries + 1} tries (last: {problem})")


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (a missing value read as NaN) as None, i.e. JSON null: strict JSON
    has no NaN, and a server would refuse the whole request."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def check_http_url(url: str) -> str:
    """`url` when it is an http(s) address with a host and a valid port, else a ValueError saying what is wrong."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// address with a host, got '{url}'")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"the port of '{url}' is not a number from 0 to 65535") from None
    return url
