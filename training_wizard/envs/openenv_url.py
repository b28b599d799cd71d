"""The address of an OpenEnv server (envs/openenv.py): its scheme checked, and the first contact with it.

A url OpenEnv's client cannot use is refused in one line: the client puts ws:// before any scheme but http(s)
and ws(s) (an ftp:// url would become ws://ftp://...). The first episode made for a url in a process tries the
server (its /health route): one that cannot be reached is a recipe mistake or a server not started, and the run
stops at its start in one line rather than failing every episode. After that first contact a server that stops
answering fails episodes (EnvironmentFailure), counted while the run goes on.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from typing import Any

from training_wizard.errors import UserError

KEY = "environment.factory_kwargs.url"
# What OpenEnv's client can talk to: it turns http(s) into ws(s) itself.
URL_SCHEMES = ("http", "https", "ws", "wss")
# The servers this process has reached, by url: only the first contact makes an unreachable server a start-up error.
REACHED_SERVERS: set[str] = set()


def checked_url(url: Any) -> str:
    """The server's url if OpenEnv's client can use it: an http(s):// or ws(s):// address with a host (without a
    scheme, http:// is meant), its scheme in lower case; one line naming the key otherwise."""
    if isinstance(url, str):
        scheme, separator, rest = url.partition("://")
        host = rest if separator else url
        if (not separator or scheme.lower() in URL_SCHEMES) and host.strip("/ "):
            # schemes are case-insensitive (RFC 3986, 3.1) but OpenEnv's client matches them in lower case only:
            # it would turn WS://host into ws://WS://host
            return scheme.lower() + "://" + rest if separator else "http://" + url
    raise UserError(f"{KEY}: expected the address of an OpenEnv server starting with "
                    f"{', '.join(scheme + '://' for scheme in URL_SCHEMES)}; got {url!r}")


def reach_server(url: str, timeout: float) -> None:
    """The first contact with the server at `url` in this process (GET its /health route, within `timeout`); an
    answer of any HTTP status counts as reached (a proxy in front of it may route only the WebSocket). One line
    when nothing answers: the run has not trained yet, and would only fail every episode."""
    if url in REACHED_SERVERS:
        return
    address = http_url(url).rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(address, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError, http.client.HTTPException) as error:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        raise UserError(f"{KEY}: cannot reach the OpenEnv server at {url} (GET {address}: "
                        f"{type(reason).__name__}: {reason}); start the server or correct the url") from None
    REACHED_SERVERS.add(url)


def http_url(url: str) -> str:
    """The HTTP address of a server given as http(s):// or ws(s)://, or with no scheme."""
    scheme, separator, rest = url.partition("://")
    scheme = scheme.lower()  # schemes are case-insensitive (RFC 3986, 3.1)
    return {"ws": "http", "wss": "https"}.get(scheme, scheme) + "://" + rest if separator else "http://" + url
