"""A stored sample's verdict: its answer checked by the run's verifier, in a process of its own.

`enqueue --verify NAME` names a check (`contract/run/verifiers.py`); a worker runs it
on every sample that passed the think-structure checks, just before the sample
goes to its shard, and stores the result in the sample's `verified` and
`verdict` columns. A sample that fails its check is **stored**, not
dead-lettered: rejection sampling wants the failures counted, and
`export --verified-only` leaves them out.

**A check never costs the worker.** It is code the fleet does not control, so
it runs in a child process (`verdict_child.py`, started with the worker's own
Python, environment and folder, so a `module:function` importable on the
worker is importable there), never in a task thread:
- a check that raises gives the sample the verdict `error: <exception>`;
- a check that outlasts `FLEET_VERIFY_TIMEOUT_SECONDS` gives `error: timeout
  after Ns`; its process is killed and another started for the next answer;
- a check that kills its process (a segfault, `os._exit`) gives `error: the
  verifier's process died (...)`, and another is started.
Either way the sample is stored with its verdict and the task goes on.

Each worker process keeps up to `FLEET_VERIFY_PROCESSES` children per
verifier NAME, started when first needed; a task waits for a free one (that
wait is not counted against the limit, nor is a child's start: `verdict_child`
imports what the check needs before it says it is ready). The answer is
decoded here with the run's tokenizer (`turns.chat_for`, loaded once per
process) and checked against the line's fields, read from the run's line records
(`contract/run/line_fields.py`) before the sample is generated.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time


from contract.chat.conversations import answer_message
from contract.names import Thinking
from contract.run.spec import RunSpec
from contract.run.verifiers import error_verdict

from . import turns

log = logging.getLogger(__name__)
START_SECONDS = 120.0  # the longest a child may take to import its check (SymPy, a user's module) and say ready


class _Child:
    """One check process; used by one thread at a time (its pool's queue hands it out)."""

    def __init__(self, name: str):
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.broken: str | None = None  # the child's own word that its check cannot load
        self._buffer = b""

    def ask(self, fields: dict, answer: str, timeout: float) -> tuple[bool, str]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        if self.broken is not None:
            return False, self.broken
        try:
            self.proc.stdin.write(json.dumps({"fields": fields, "answer": answer}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # it died since
            return False, self._died()
        try:
            reply = self._line(timeout)
        except TimeoutError:
            self.stop()
            return False, error_verdict(f"timeout after {timeout:g}s")
        if reply is None:
            return False, self._died()
        return bool(reply["verified"]), str(reply["verdict"])

    def _start(self) -> None:
        self.stop()
        self.broken = None
        self.proc = subprocess.Popen([sys.executable, "-m", "workers.output.verdict_child", self.name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=os.getcwd(),
                                     start_new_session=True)  # a worker's terminal signals are not its
        try:
            ready = self._line(max(START_SECONDS, 0.0))
        except TimeoutError:
            self.stop()
            self.broken = None
            raise _NotReady(error_verdict(f"the verifier's process did not start within {START_SECONDS:g}s"))
        if ready is None:
            raise _NotReady(self._died())
        if not ready.get("ready"):
            self.broken = str(ready.get("verdict") or error_verdict("the verifier cannot load"))
            log.error("verifier %s cannot run on this worker: %s", self.name, self.broken)

    def _line(self, timeout: float) -> dict | None:
        """The child's next reply line; None at its end (it died); TimeoutError past `timeout`."""
        deadline = time.monotonic() + timeout
        out = self.proc.stdout.fileno()
        poller = select.poll()  # not select(): a busy worker's descriptors go past its 1,024
        poller.register(out, select.POLLIN)
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not poller.poll(max(1, int(left * 1000))):
                continue
            chunk = os.read(out, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _died(self) -> str:
        code = self.proc.wait() if self.proc is not None else None
        self.proc, self._buffer = None, b""
        how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        log.warning("verifier %s: its process died (%s); another starts for the next answer", self.name, how)
        return error_verdict(f"the verifier's process died ({how})")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        self.proc, self._buffer = None, b""


class _NotReady(Exception):
    """A child that did not come up: this answer's verdict, and the next answer starts another."""

    def __init__(self, verdict: str):
        super().__init__(verdict)
        self.verdict = verdict


class Verdicts:
    """A worker process's check processes, per verifier NAME; thread-safe."""

    def __init__(self, timeout: float, processes: int = 1):
        self.timeout, self.processes = timeout, max(1, processes)
        self._pools: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._closed = False

    def judge(self, name: str, fields: dict, answer: str) -> tuple[bool, str]:
        """(verified, verdict) of one answer: never raises for anything the check does."""
        pool = self._pool(name)
        child = pool.get()
        try:
            return child.ask(fields, answer, self.timeout)
        except _NotReady as exc:
            return False, exc.verdict
        finally:
            pool.put(child)

    def _pool(self, name: str) -> queue.Queue:
        with self._lock:
            if self._closed:
                raise RuntimeError("the verifiers are closed")
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = queue.Queue()
                for _ in range(self.processes):
                    pool.put(_Child(name))
            return pool

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
        for pool in pools:
            while True:
                try:
                    pool.get_nowait().stop()
                except queue.Empty:
                    break


def answer_text(spec: RunSpec, output_ids: list[int]) -> str:
    """The answer a verifier reads: the output after think-end, final stop token dropped, decoded and
    stripped; the whole output in a run that does not think."""
    chat = turns.chat_for(spec)
    think_end = None if spec.thinking == Thinking.OFF else spec.think_end_id
    message = answer_message(output_ids, spec.think_start_id, think_end, spec.stop_ids,
                             lambda ids: chat.tok.decode(ids, skip_special_tokens=False))
    return message["content"]


def verdict_of(verdicts: Verdicts, spec: RunSpec, fields: dict, output_ids: list[int]) -> tuple[bool | None, str | None]:
    """The sample's (verified, verdict) against its line's `fields` (contract/run/line_fields.py); (None, None) in a
    run without a verifier. Never raises: an answer that cannot be decoded here (the run's tokenizer
    does not load on this worker) is the sample's `error` verdict, as is anything its check does."""
    if not spec.verify:
        return None, None
    try:
        answer = answer_text(spec, output_ids)
    except Exception as exc:  # TemplateMismatch, a tokenizer that does not load here
        return False, error_verdict(f"the answer cannot be decoded here: {exc.__class__.__name__}: {exc}")
    return verdicts.judge(spec.verify, fields, answer)
