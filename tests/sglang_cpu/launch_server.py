"""`python -m sglang.launch_server ARGS`, with the engine's processes forked instead of spawned.

Why: SGLang starts its scheduler and detokenizer with multiprocessing's "spawn", so each
imports SGLang, torch and transformers again (~10 CPU-seconds each on these machines). Forked,
they share what the launcher already imported: a load of the tiny test model takes ~34 CPU-seconds
instead of ~53, and the suite loads a server a dozen times on 2 cores. What the server then runs
is the same code, in the same processes (a launcher, a scheduler, a detokenizer, one process
group), and it answers the same ids. Only tests use it (`tests/real_sglang.py`).
"""
import multiprocessing
import runpy
import sys

_set_start_method = multiprocessing.set_start_method


def _forked(method, force=False):
    _set_start_method("fork" if method == "spawn" else method, force=force)


multiprocessing.set_start_method = _forked
sys.argv[0] = "sglang.launch_server"
runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
