"""Why RabbitMQ refused a connection, in words: a login (``ACCESS_REFUSED``), a virtual host
that does not exist or that the user may not use (``NOT_ALLOWED``), retried as Celery retries
them, a login never."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlparse

from worker_core.slots import ConnectFailure

__all__ = ["explain"]

ACCESS_REFUSED = 403
NOT_ALLOWED = 530


def _vhost(url: str) -> str:
    path = urlparse(url.split(";")[0]).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _user(url: str) -> str:
    return unquote(urlparse(url.split(";")[0]).username or "guest")


def explain(exc: BaseException, url: str) -> ConnectFailure | None:
    code = getattr(exc, "reply_code", None)
    text = " ".join(str(getattr(exc, "reply_text", "") or "").split())
    if code == ACCESS_REFUSED:
        return ConnectFailure(f"RabbitMQ refused the login of user {_user(url)!r} ({text.split(' - ')[0]}): "
                              "check the user name and password in the broker URL", retry=False)
    if code == NOT_ALLOWED:
        vhost = _vhost(url)
        found = re.search(r"vhost '?([^' ]+)'? not found", text)
        if found:
            return ConnectFailure(f"RabbitMQ has no virtual host {found.group(1)!r} (NOT_ALLOWED): create it "
                                  f"(rabbitmqctl add_vhost {found.group(1)}) or fix the broker URL's path")
        return ConnectFailure(f"RabbitMQ does not let user {_user(url)!r} use virtual host {vhost!r} "
                              f"(NOT_ALLOWED): grant it (rabbitmqctl set_permissions -p {vhost} {_user(url)} "
                              "'.*' '.*' '.*')")
    return None
