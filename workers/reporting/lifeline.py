"""A worker whose own threads fail says so: once per change, and by exiting when it can no longer work.

The worker depends on three threads of its own: the shard writer (no sample is
stored without it), the lease keeper (without it every prompt in flight goes to
a second worker one lease later) and the health monitor (without it no server
comes back, and a dead one is never noticed). A worker that lost one of them
would go on taking prompts it cannot finish, so a thread started through
`guarded` that ends by an exception calls `fatal`: the worker logs why, takes
no more prompts (the health gate closes), hands back what it holds and exits
with `EXIT_BROKEN`, so its supervisor (Kubernetes, systemd, compose) restarts
it (`workers/intake/shutdown.py` does the hand-back, without a grace period).

Errors that a thread survives (a heartbeat, a load read, a metrics scrape, a
task-event flush that Redis refused) are logged at WARNING by `Trouble`, once
when they start or change and once when they end, never once per attempt.

Test-only hook (`FLEET_TEST_THREAD_FAULT=<thread name>`, never set in
production): no fault from outside the process kills these threads (each
survives Redis, storage and server faults by design), so the real-process test
(`tests/reporting/test_worker_threads.py`) sends the worker SIGUSR2, and the handler
raises `ThreadKilled` inside the named thread, as a bug there would.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger(__name__)
EXIT_BROKEN = 70  # EX_SOFTWARE: the worker cannot work on; restart it
TEST_FAULT = "FLEET_TEST_THREAD_FAULT"

_broken: list[str] = []  # why, once a thread the worker depends on died
_lock = threading.Lock()
_on_fatal: list[Callable[[], None]] = []


def broken() -> str | None:
    """Why this worker can no longer work, or None."""
    return _broken[0] if _broken else None


def on_fatal(action: Callable[[], None]) -> None:
    """What `fatal` does after logging (the worker's shutdown); in-process users set none."""
    _on_fatal[:] = [action]


def fatal(why: str) -> None:
    """This worker can no longer work: say so once, then stop it (`on_fatal`)."""
    with _lock:
        if _broken:
            return
        _broken.append(why)
    log.critical("worker cannot work on: %s; it takes no more prompts, hands back the ones it holds and "
                 "exits %d so that its supervisor restarts it", why, EXIT_BROKEN)
    for action in _on_fatal:
        action()


def guarded(what: str, target: Callable[..., None]) -> Callable[..., None]:
    """`target`, as a thread the worker depends on: its ending by an exception is `fatal`."""
    def run(*args, **kwargs) -> None:
        try:
            target(*args, **kwargs)
        except BaseException as exc:
            fatal(f"its {what} thread ({threading.current_thread().name}) died: {exc!r}")
            raise
    return run


class Trouble:
    """A recurring error of a thread that survives it, logged at WARNING once per change."""

    def __init__(self, what: str):
        self.what = what
        self._last: str | None = None
        self._count = 0

    def failed(self, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self._count += 1
        if error != self._last:
            log.warning("%s failing: %s (logged again when it changes or ends)", self.what, error)
            self._last = error

    def ok(self) -> None:
        if self._last is not None:
            log.warning("%s working again after %d failures (last: %s)", self.what, self._count, self._last)
            self._last, self._count = None, 0


class ThreadKilled(BaseException):
    """Raised inside a named thread by the test-only hook; a BaseException, so that no handler
    the thread keeps for the faults it survives takes it for one of them."""


def install_test_fault() -> None:
    """With FLEET_TEST_THREAD_FAULT set, SIGUSR2 raises `ThreadKilled` inside the thread of that
    name (from the main thread's signal handler; the thread sees it at its next Python step)."""
    name = os.environ.get(TEST_FAULT)
    if not name:
        return

    def kill(*_) -> None:
        for thread in threading.enumerate():
            if thread.name == name and thread.ident is not None:
                log.warning("%s: raising ThreadKilled in thread %s", TEST_FAULT, name)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(ThreadKilled))

    signal.signal(signal.SIGUSR2, kill)
