"""The one TLS context of every request this worker makes to a server.

`/generate` (`sglang_client.py`) and the health, preflight, tokenizer-probe,
load and crash reads (`reads.py`) go through one HTTP stack (`http1.py`,
whose pools are per origin and shared by both) and verify a server against
the same trust: the system's certificate store, as OpenSSL finds it
(`ssl.create_default_context()`), so `SSL_CERT_FILE` (a bundle that
replaces the default one) and `SSL_CERT_DIR` (a hashed folder, as
`c_rehash`/`update-ca-certificates` write) are honoured. A server signed by a
private CA is trusted by adding that CA to the system store, or by pointing
`SSL_CERT_FILE` at a bundle that holds it (docs/operate/troubleshooting.md,
"Servers over HTTPS").

Invariants: one context per process, built on first use (after the
environment is read, never at import, so a worker forked from a zygote reads
its own `SSL_CERT_FILE`), the host name always checked; `why_untrusted`
turns a failed verification into a sentence that says what to do.
"""
from __future__ import annotations

import ssl
import threading

_lock = threading.Lock()
_context: ssl.SSLContext | None = None


def context() -> ssl.SSLContext:
    """The process's TLS context for its servers (the system store; host names checked)."""
    global _context
    if _context is None:
        with _lock:
            if _context is None:
                _context = ssl.create_default_context()
    return _context


def why_untrusted(exc: BaseException) -> str | None:
    """The reason a server is refused, if `exc` (or one it was raised from) is a failed certificate
    check; None for any other failure."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return (f"its TLS certificate is not trusted ({exc.verify_message or exc}): add its CA to the "
                    "system's certificate store, or point SSL_CERT_FILE at a bundle that holds it")
        exc = exc.__cause__ or exc.__context__
    return None
