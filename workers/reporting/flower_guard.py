"""Flower may listen beyond localhost only behind authentication.

Flower shows every worker and task, and its pages can shut workers down and
revoke tasks. With no authentication set, anyone who can reach its port can do
all of that. So `celery -A workers flower` refuses to start when it would listen
on anything other than loopback (`--address` empty, 0.0.0.0, ::, or a
non-loopback host) unless basic auth (`FLOWER_BASIC_AUTH=user:password`,
`--basic-auth`) or OAuth (`--auth`, `FLOWER_AUTH`) is set.

Flower has no start hook of its own. Its app constructor calls the Celery
loader's `import_default_modules`, and that sends Celery's `import_modules`
signal. By then Flower has read all of its options: the command line,
flowerconfig.py and the FLOWER_* environment. It has not yet bound its port.
Workers send the same signal too, so the check runs only when the running
click command is `flower`.
"""
from __future__ import annotations

import ipaddress
import socket

from celery import signals

HINT = ("set FLOWER_BASIC_AUTH=user:password (or --basic-auth=user:password, or OAuth with "
        "--auth / FLOWER_AUTH), or bind it to localhost with --address=127.0.0.1")


def is_loopback(address: str) -> bool:
    """True if every address this host name resolves to is loopback ('' means every interface)."""
    if not address:
        return False
    try:
        infos = socket.getaddrinfo(address, None)
    except OSError:
        return False
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def has_auth(options) -> bool:
    pairs = [p for p in (options.basic_auth or []) if p]
    basic = bool(pairs) and all(user and password for user, _, password in (p.partition(":") for p in pairs))
    return basic or bool(options.auth)


def refusal(options) -> str | None:
    """Why Flower with these (tornado) options must not start, or None."""
    if options.unix_socket or is_loopback(options.address) or has_auth(options):
        return None
    where = options.address or "every interface"
    return (f"Refusing to start Flower: it would listen on {where} (port {options.port}) "
            f"without authentication; {HINT}.")


def _running_flower() -> bool:
    import click

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.command.name == "flower"


@signals.import_modules.connect
def _check_flower(**_) -> None:
    if not _running_flower():
        return
    from tornado.options import options

    reason = refusal(options)
    if reason:
        raise SystemExit(reason)
