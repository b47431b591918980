"""Whether a server's tokenizer is a run's, asked once per server start and run.

Invariant: no prompt of a run goes to a server before that server's own
tokenizer gave the run's ids for the run's probe (`contract/chat/tokenizer_probe.py`),
or said it cannot tokenize (no `/tokenize`, or no tokenizer: said once, then
the server is bound by `--served-model` alone). Why it holds: the request loop picks a
server only among those `taking` names (`workers/intake/request_loop.py`), and
every usable server without a verdict is asked there and then, one thread per
server and probe asking while the others wait for its verdict. A server's
verdicts are kept for its preflight's epoch: a restarted server (perhaps with
another model) is asked again.

A refused run is the run's, not its prompts', fault: its prompts go to a
server that gives the same ids, or wait in the queue; none is dead-lettered.
The worker's log says it once (server, run, the first id that differs), and
`status` shows it beside the server (`ServerBinding.refused_runs`). A server
that cannot answer now (down, a 5xx) gets no prompt of the run until it
answers, asked again after `RETRY_SECONDS`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import httpx

from contract.run.spec import RunSpec
from contract.chat.tokenizer_probe import Probe, first_difference

from .bindings import ServerBinding

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
# A server that cannot tokenize: an older SGLang without the route, a server without a tokenizer
# (`--skip-tokenizer-init`, a stand-in given none) that refuses the request
CANNOT_TOKENIZE = (400, 404, 405, 422, 501)


@dataclass(frozen=True)
class Verdict:
    refusal: str | None           # why the server refuses the run; None: the server takes it
    until: float = float("inf")   # monotonic time it holds to (a failed ask is asked again)


class TokenizerChecks:
    def __init__(self, client: httpx.Client):
        self._client = client
        self._verdicts: dict[tuple, Verdict] = {}
        self._asking: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()
        self._said_unchecked: set[str] = set()
        self._probes: dict[tuple[str, float], Probe | None] = {}

    def taking(self, spec: RunSpec, bindings: list[ServerBinding]) -> frozenset[str] | None:
        """The URLs of `bindings` that take the run's prompts now (asking those not asked yet); None: any
        server (a run enqueued before the probe is bound by --served-model alone)."""
        probe = self._probe(spec)
        if probe is None:
            return None
        return frozenset(b.url for b in bindings if self.verdict(b, spec.name, probe).refusal is None)

    def _probe(self, spec: RunSpec) -> Probe | None:
        """The run's probe, read from its spec once (it is on every request's path)."""
        key = (spec.name, spec.created_at)
        if key not in self._probes:
            self._probes[key] = Probe.from_dict(spec.probe)
        return self._probes[key]

    def verdict(self, binding: ServerBinding, run: str, probe: Probe) -> Verdict:
        key = (binding.url, binding.preflights, probe.digest)
        found = self._verdicts.get(key)
        if found is not None and found.until > time.monotonic():
            return found
        with self._lock:
            asking = self._asking.setdefault(key, threading.Lock())
        with asking:  # one thread asks; the others wait for its verdict
            found = self._verdicts.get(key)
            if found is None or found.until <= time.monotonic():
                found = self._verdicts[key] = self._judge(binding, run, probe)
                self._record(binding, run, found)
        return found

    def _judge(self, binding: ServerBinding, run: str, probe: Probe) -> Verdict:
        """Each server behind the binding (a gateway's, read directly) must give the run's ids."""
        for server in binding.gateway_workers or [binding.url]:
            try:
                response = self._client.post(f"{server}/tokenize",
                                             json={"prompt": probe.texts, "add_special_tokens": False})
            except httpx.HTTPError as exc:
                return Verdict(f"could not ask {server}/tokenize ({exc!r})", time.monotonic() + RETRY_SECONDS)
            if response.status_code in CANNOT_TOKENIZE:
                self._unchecked(server, response)
                continue
            tokens = _tokens(response)
            if tokens is None:
                return Verdict(f"{server}/tokenize answered HTTP {response.status_code} {response.text[:200]!r}",
                               time.monotonic() + RETRY_SECONDS)
            difference = first_difference(probe, tokens)
            if difference is not None:
                return Verdict(f"the tokenizer of {server} is not the run's: {difference}; enqueue the run with "
                               f"--tokenizer naming the served model's tokenizer, or bind the worker to "
                               f"servers of that model")
        return Verdict(None)

    def _record(self, binding: ServerBinding, run: str, verdict: Verdict) -> None:
        if verdict.refusal is None:
            binding.refused_runs.pop(run, None)
            return
        if binding.refused_runs.get(run) != verdict.refusal:
            level = logging.ERROR if verdict.until == float("inf") else logging.WARNING
            log.log(level, "server %s REFUSES run %s: %s; no prompt of the run goes there (they go to other "
                    "servers or wait in the queue)", binding.url, run, verdict.refusal)
        binding.refused_runs[run] = verdict.refusal

    def _unchecked(self, server: str, response: httpx.Response) -> None:
        if server not in self._said_unchecked:
            self._said_unchecked.add(server)
            log.warning("server %s cannot tokenize (/tokenize answered HTTP %d %s): its tokenizer cannot be "
                        "compared with the runs'; it is bound by --served-model alone", server,
                        response.status_code, response.text[:120])


def _tokens(response: httpx.Response) -> list[list[int]] | None:
    """The server's ids for each probe text, from a 200 of /tokenize; None for any other answer."""
    if response.status_code != 200:
        return None
    try:
        tokens = response.json().get("tokens")
    except (ValueError, AttributeError):
        return None
    if not isinstance(tokens, list) or not all(isinstance(t, list) for t in tokens):
        return None
    return tokens
