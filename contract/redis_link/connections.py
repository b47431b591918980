"""Redis clients for state outside the broker, and URLs safe to print.

One shared, thread-safe client per URL; built when first asked for, never at import.
A URL is either plain (`redis://`, `rediss://`, `unix://`) or names Redis Sentinels in
kombu's own form, `sentinel://[user:pw@]h1:26379;sentinel://h2:26379/0`: the client
then asks the Sentinels where the master named `FLEET_SENTINEL_MASTER` (default
`mymaster`) is, and again after every failover (redis-py's `Sentinel.master_for`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote, urlsplit

import redis
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from contract.redis_link import retries
from contract.redis_link.scripts import LOADER

SENTINEL_SCHEME = "sentinel"
MASTER_ENV, DEFAULT_MASTER = "FLEET_SENTINEL_MASTER", "mymaster"
# A frozen primary (SIGSTOP, a hung VM) still completes TCP handshakes and keepalives, so only
# a read deadline ends a call to it; the retries then ask the Sentinels for the new master.
SOCKET = dict(socket_timeout=30, socket_connect_timeout=5, socket_keepalive=True, health_check_interval=30)
SENTINEL_SOCKET = dict(socket_timeout=2, socket_connect_timeout=2)  # one Sentinel's answer, or the next one


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")


def sentinel_master() -> str:
    """The name the Sentinels monitor the fleet's master by (`FLEET_SENTINEL_MASTER`)."""
    return os.environ.get(MASTER_ENV) or DEFAULT_MASTER


@dataclass(frozen=True)
class SentinelURL:
    """A `sentinel://` URL read as kombu reads it: `;`-separated parts, each a Sentinel
    (default port 26379); the credentials are the master's, from the first part that has
    them, and the database from the last part that names one (kombu's `/db` suffix)."""
    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelURL:
    """Raises ValueError (naming no secret) for a part that is not `sentinel://host[:port]`."""
    hosts, db, username, password = [], 0, None, None
    for n, part in enumerate(p for p in url.split(";") if p.strip()):
        parsed = urlsplit(part.strip())
        if parsed.scheme != SENTINEL_SCHEME or not parsed.hostname:
            raise ValueError(f"part {n + 1} of a Sentinel URL is not sentinel://host:port")
        hosts.append((parsed.hostname, parsed.port or 26379))
        if parsed.password is not None and password is None:
            username, password = unquote(parsed.username or "") or None, unquote(parsed.password)
        path = parsed.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(f"part {n + 1} of a Sentinel URL names database {path!r}, not a number")
            db = int(path)
    if not hosts:
        raise ValueError("a Sentinel URL names no Sentinel")
    return SentinelURL(tuple(hosts), db, username, password)


@lru_cache(maxsize=8)
def redis_for(url: str, max_connections: int = 64) -> redis.Redis:
    """A blocking pool: hundreds of task threads share a few connections and wait
    for one rather than fail; retries carry a call through a Redis restart (and, behind
    Sentinel, through a failover: each reconnect finds the current master), except a call
    of a thread that must not wait (`retries.failing_fast`: a worker's event loop)."""
    return client_for(url, retry=retries.shared(), max_connections=max_connections)


def client_for(url: str, retry: Retry, max_connections: int = 64) -> redis.Redis:
    """A new client on `url` (either form) with the fleet's timeouts and `retry`."""
    # READONLY is not retried here: it is a refusal (`contract/redis_link/write_refusal.py`) that the worker
    # pauses on, dropping its pooled connections so the next write reconnects (a managed Redis's
    # DNS name that moved on failover); behind Sentinel redis-py turns it into a ConnectionError
    options = dict(SOCKET, retry=retry, retry_on_error=[redis.ConnectionError, redis.TimeoutError],
                   max_connections=max_connections, timeout=60)
    if not is_sentinel(url):
        return redis.Redis(connection_pool=BlockingPool.from_url(url, **options))
    parts = parse_sentinel_url(url)
    sentinels = Sentinel(list(parts.sentinels), sentinel_kwargs=dict(SENTINEL_SOCKET),
                         db=parts.db, username=parts.username, password=parts.password)
    return sentinels.master_for(sentinel_master(), connection_pool_class=BlockingSentinelPool, **options)


def kombu_sentinel_url(url: str) -> str:
    """The same Sentinels with the credentials and database in every part: kombu (and Flower)
    read them from the first part only, so `sentinel://h1;sentinel://h2/3` would otherwise put
    the broker on database 0 and the ledger on 3."""
    parts = parse_sentinel_url(url)
    cred = ""
    if parts.password is not None:
        cred = f"{quote(parts.username or '', safe='')}:{quote(parts.password, safe='')}@"
    return ";".join(f"{SENTINEL_SCHEME}://{cred}{host}:{port}/{parts.db}" for host, port in parts.sentinels)


class LoadsScripts:
    """A pool whose every connection has the process's Lua scripts loaded when it connects, so
    its pipelines send EVALSHA without asking SCRIPT EXISTS first (`scripts.py`)."""
    loads_scripts = True

    def make_connection(self):
        connection = super().make_connection()
        LOADER.attach(connection)
        return connection


class BlockingPool(LoadsScripts, retries.PoolWait, redis.BlockingConnectionPool):
    """A pool that waits for a free connection (briefly, for a thread failing fast)."""


class BlockingSentinelPool(LoadsScripts, retries.PoolWait, SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's master pool that waits for a free connection, as `redis_for`'s plain pool does
    (a connection to a master that lost its role is dropped when released: Sentinel's own rule)."""


SECRET_PARAMS = ("password", "passwd", "pass", "pwd", "token", "key", "secret", "auth", "credential")


def redact_url(url: str) -> str:
    """The URL with its secrets starred, so that it can be logged, printed or stored.

    Hidden: the value of any query parameter whose name looks secret
    (`?password=pw`), then everything before the last `@` (the user part:
    `redis://:pw@`, `redis://user:pw@`, where the user name stays, and a lone
    `redis://pw@`, which may be a password). Taking the last `@` anywhere keeps a
    password holding an unescaped `/`, `?`, `#` or `@` hidden, where a URL parser
    would read part of it as a path or a query; an `@` in a query makes it hide
    too much, never too little.
    """
    return _split(url)[0]


def redact_text(text: str, url: str) -> str:
    """`text` (an error message that may quote `url` or its parts) with every secret that
    `redact_url` hides starred, as written in the URL and percent-decoded."""
    from urllib.parse import unquote

    secrets = _split(url)[1]
    for secret in sorted({s for raw in secrets for s in (raw, unquote(raw)) if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _split(url: str) -> tuple[str, list[str]]:
    """(the URL redacted, the secrets it hid): the one reading of a URL's secrets. A Sentinel
    URL's parts (`sentinel://:pw@h1;sentinel://:pw@h2`, as kombu splits it) are read one by
    one, so each host stays shown; where a part does not start as one (a `;` in a password),
    the whole URL is read as one, which hides too much, never too little."""
    parts = url.split(";")
    if len(parts) > 1 and all(part.startswith(f"{SENTINEL_SCHEME}://") for part in parts):
        split = [_split_one(part) for part in parts]
        return ";".join(shown for shown, _ in split), [secret for _, hidden in split for secret in hidden]
    return _split_one(url)


def _split_one(url: str) -> tuple[str, list[str]]:
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    secrets: list[str] = []
    head, question, query = rest.partition("?")
    if question:
        rest = head + "?" + "&".join(_redact_param(pair, secrets) for pair in query.split("&"))
    userinfo, at, host = rest.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        safe_user = colon and user and not any(c in user for c in "/?#")
        secrets += ([password] if colon else []) + ([] if safe_user else [userinfo])
        rest = (f"{user}:***@" if safe_user else "***@") + host
    return (f"{scheme}://" if sep else "") + rest, secrets


def _redact_param(pair: str, secrets: list[str]) -> str:
    name, eq, value = pair.partition("=")
    if eq and any(s in name.lower() for s in SECRET_PARAMS):
        secrets.append(value)
        return f"{name}=***"
    return pair
