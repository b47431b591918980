"""Secrets in URLs: starred wherever a URL is shown, sent only where they belong."""
from __future__ import annotations

import base64

import httpx
import pytest

from contract.redis_link.connections import redact_text, redact_url
from workers.servers.auth import ServerCredentials
from workers.servers.bindings import ServerPool

SECRET = "s3cr3t-Pw"

# (a URL holding SECRET, what may be shown of it)
URLS = [
    (f"redis://:{SECRET}@redis-host:6379/0", "redis://***@redis-host:6379/0"),
    (f"redis://fleet:{SECRET}@redis-host:6379/0", "redis://fleet:***@redis-host:6379/0"),
    (f"redis://{SECRET}@redis-host:6379/0", "redis://***@redis-host:6379/0"),
    (f"rediss://:{SECRET}@redis-host:6380/1?ssl_cert_reqs=required",
     "rediss://***@redis-host:6380/1?ssl_cert_reqs=required"),
    (f"redis://redis-host:6379/0?password={SECRET}&db=2", "redis://redis-host:6379/0?password=***&db=2"),
    (f"unix:///run/redis.sock?db=0&password={SECRET}", "unix:///run/redis.sock?db=0&password=***"),
    (f"http://user:{SECRET}@gpu-1:30000", "http://user:***@gpu-1:30000"),
    (f"http://gpu-1:30000/?api_key={SECRET}", "http://gpu-1:30000/?api_key=***"),
    # unescaped characters that a URL parser would read as a path, a query or a fragment
    (f"redis://:{SECRET}/x@redis-host:6379/0", "redis://***@redis-host:6379/0"),
    (f"redis://:{SECRET}#x@redis-host:6379/0", "redis://***@redis-host:6379/0"),
    (f"redis://:{SECRET}?x@redis-host:6379/0", "redis://***@redis-host:6379/0"),
    (f"redis://:a@{SECRET}@redis-host:6379/0", "redis://***@redis-host:6379/0"),
    (f"redis://redis-host/0?password=a@{SECRET}", "redis://redis-host/0?password=***"),
    # a Sentinel URL: each part's secret hidden, every host shown
    (f"sentinel://:{SECRET}@s1:26379;sentinel://:{SECRET}@s2:26379/0",
     "sentinel://***@s1:26379;sentinel://***@s2:26379/0"),
    (f"sentinel://:{SECRET}@s1:26379;sentinel://s2:26379", "sentinel://***@s1:26379;sentinel://s2:26379"),
    # a `;` in a Sentinel password: the URL read as one part, hiding more than the password
    (f"sentinel://:a;{SECRET}@s1:26379;sentinel://s2:26379", "sentinel://***@s1:26379;sentinel://s2:26379"),
    (f"sentinel://:{SECRET};a@s1:26379", "sentinel://***@s1:26379"),
]


@pytest.mark.parametrize("url,shown", URLS, ids=[s for _, s in URLS])
def test_a_redacted_url_holds_no_secret(url, shown):
    assert redact_url(url) == shown
    assert SECRET not in redact_url(url)


@pytest.mark.parametrize("password", [f"{SECRET}?x", f"a@{SECRET}", f"{SECRET}#x", f"{SECRET}/x", f"?@#/{SECRET}"])
def test_a_password_holding_url_delimiters_is_hidden_in_the_url_and_in_an_error_that_quotes_it(password):
    # Given a Redis URL whose password holds unescaped ?, @, # or /
    url = f"redis://fleet:{password}@redis-host:6379/0"

    # When the URL, and an error message quoting the password, are shown
    shown, said = redact_url(url), redact_text(f"AUTH failed for {password!r} at {url}", url)

    # Then neither holds the password, and the user and the host stay readable
    assert shown == "redis://fleet:***@redis-host:6379/0"
    assert said == "AUTH failed for '***' at redis://fleet:***@redis-host:6379/0"


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "http://127.0.0.1:30000", "rediss://h:1/0?db=1"])
def test_a_url_without_secrets_is_shown_as_is(url):
    assert redact_url(url) == url


def test_server_bindings_record_the_redacted_url():
    pool = ServerPool([f"http://user:{SECRET}@gpu-1:30000", "http://gpu-2:30000"], max_inflight=4)
    assert [b.url for b in pool.bindings] == ["http://user:***@gpu-1:30000", "http://gpu-2:30000"]
    assert SECRET not in repr(pool.snapshot())


def test_credentials_from_a_url_are_sent_as_basic_auth_to_that_server_only():
    # Given a client carrying the credentials of one of two servers, and a bearer API key
    seen: dict[str, str | None] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen[request.url.host] = request.headers.get("authorization")
        return httpx.Response(200)

    urls = [f"http://user:{SECRET}@gpu-1:30000", "http://gpu-2:30000"]
    client = httpx.Client(transport=httpx.MockTransport(answer), headers={"Authorization": "Bearer sk-key"},
                          auth=ServerCredentials(urls))

    # When each server is called by its redacted URL, as a binding knows it
    for binding in ServerPool(urls, 4).bindings:
        client.get(f"{binding.url}/health")

    # Then the first gets its own credentials, the second the API key
    assert seen["gpu-1"] == "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert seen["gpu-2"] == "Bearer sk-key"
