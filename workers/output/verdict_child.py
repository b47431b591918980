"""The process a worker's verifier checks run in (`python -m workers.output.verdict_child NAME`).

A check is code the fleet does not control (a user's `module:function`, or
`math-verify` on an answer it chokes on): it may raise, print, hang, or kill
its process. Here it can do all of that without touching the worker: the
worker (`verdicts.py`) sends one JSON line per answer on stdin and reads one
JSON line back on a descriptor of its own, kills this process when an answer
outlasts the time limit, and starts another.

At start the verifier NAME is resolved and what it needs imported (math-verify
and SymPy for `math`, the user's module for `module:function`), and one line
says so (`{"ready": true}`, or the import's failure, then kept as every
answer's `error` verdict), so the import's seconds never count against the
first answer's limit. The protocol has stdout to itself: a check's prints go
to stderr, the worker's log. It ends with its worker: at the end of its stdin, or,
in a check that never returns, within a second of the worker's exit.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from contract.run.verifiers import BadVerifier, CheckError, error_verdict, judge, load_function, parse_name


def _warm(verifier) -> None:
    if verifier.kind == "math":
        import math_verify  # noqa: F401  (SymPy with it: seconds, once)
    elif verifier.kind == "function":
        load_function(verifier.target)


def _orphaned_exit(parent: int) -> None:
    """End this process once its worker is gone, even in the middle of a check that never returns
    (the worker's end closes stdin, which a hung check never reads)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main(name: str) -> None:
    threading.Thread(target=_orphaned_exit, args=(os.getppid(),), name="verdict-orphan", daemon=True).start()
    reply = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a check's print() goes to the worker's log, never into the replies
    sys.stdout = sys.stderr
    broken = None
    try:
        verifier = parse_name(name)
        _warm(verifier)
    except BadVerifier as exc:
        broken = error_verdict(str(exc))
    except BaseException as exc:  # the user's module failed on import: every answer says so
        broken = error_verdict(f"cannot load {name}: {exc.__class__.__name__}: {exc}")
    reply.write(json.dumps({"ready": broken is None, "verdict": broken}).encode() + b"\n")
    for line in sys.stdin.buffer:
        ask = json.loads(line)
        if broken is not None:
            passed, verdict = False, broken
        else:
            try:
                passed, verdict = judge(verifier, ask["fields"], ask["answer"])
            except CheckError as exc:
                passed, verdict = False, error_verdict(str(exc))
            except BaseException as exc:  # SystemExit and KeyboardInterrupt of a check too: its verdict
                passed, verdict = False, error_verdict(f"{exc.__class__.__name__}: {exc}")
        reply.write(json.dumps({"verified": bool(passed), "verdict": str(verdict)}).encode() + b"\n")


if __name__ == "__main__":
    main(sys.argv[1])
