"""Continuous-batching time model: when does each request finish?

Like SGLang's scheduler: at most `max_running_requests` run together, the
rest wait in FIFO order; every decode step yields one token for each running
request and costs `step_base + step_per_request * batch` seconds, plus
`prefill_per_token` for each uncached prompt token of the requests admitted
since the last step. One asyncio task drives the steps. The server's prefix
cache (`prefix_cache`) is consulted at admission and fed where SGLang feeds
it: the prompt after its prefill step, prompt and output when it finishes.

Cost per step is O(admissions + completions), not O(batch): a request's
progress is `step - start_step`, and completions come off a heap keyed by
the step they finish at. That keeps hundreds of concurrent requests cheap on
a small machine. With all three costs zero ("instant" mode) there is no loop:
requests finish as soon as they are submitted.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from sglang_standin.config import StandinConfig
from sglang_standin.prefix_cache import PrefixCache
from sglang_standin.stats import Stats

log = logging.getLogger("sglang_standin")
_seq = itertools.count()
_MAX_LAG = 0.05  # seconds the step clock may run behind before it resets


@dataclass(frozen=True)
class Outcome:
    """How a job ended: tokens produced and, if aborted, where it was."""

    produced: int
    aborted: str | None = None  # None, "running" or "waiting"
    cached: int = 0  # prompt tokens found in the prefix cache (meta_info.cached_tokens)


class Job:
    """One sub-request as the scheduler sees it: its prompt and the output it will produce."""

    __slots__ = ("rid", "prompt_ids", "output_ids", "prompt_len", "target", "cached", "delay",
                 "state", "start_step", "outcome", "timer", "seq")

    def __init__(self, rid: str, prompt_ids: Sequence[int], output_ids: Sequence[int],
                 delay: float = 0.0) -> None:
        self.rid = rid
        self.prompt_ids = prompt_ids
        self.output_ids = output_ids
        self.prompt_len = len(prompt_ids)
        self.target = len(output_ids)  # tokens to produce before finishing
        self.cached = 0  # set on admission from the prefix cache
        self.delay = delay  # seconds before it even reaches the scheduler (slow fault)
        self.state = "new"  # new -> delayed -> waiting -> running -> done
        self.start_step = 0
        self.outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.timer: asyncio.TimerHandle | None = None
        self.seq = next(_seq)


class Engine:
    """The scheduler: queues, running batch, step loop, aborts."""

    def __init__(self, cfg: StandinConfig, stats: Stats) -> None:
        self._cfg = cfg
        self._stats = stats
        self.cache = PrefixCache(cfg.prefix_cache_tokens)
        self.step = 0
        self._running: set[Job] = set()
        self._waiting: deque[Job] = deque()
        self._delayed: set[Job] = set()
        self._heap: list[tuple[int, int, Job]] = []
        self._by_rid: dict[str, set[Job]] = {}
        self._prefill_tokens = 0
        self._prefill_jobs: list[Job] = []  # admitted, prefill not yet stepped
        self._in_step = False
        self._wake = asyncio.Event()
        self._progress: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------- public API
    @property
    def running_count(self) -> int:
        return len(self._running) + len(self._delayed)

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def pending_prefill_tokens(self) -> int:
        """Uncached prompt tokens of admitted requests that the next step's cost charges for."""
        return self._prefill_tokens

    def token_counts(self) -> tuple[int, int]:
        """(tokens held by running requests, prompt tokens still waiting), for load reports."""
        used = sum(j.prompt_len + self.produced(j) for j in self._running)
        used += sum(j.prompt_len for j in self._delayed)
        return used, sum(j.prompt_len for j in self._waiting)

    def submit(self, jobs: list[Job]) -> bool:
        """Hand jobs to the scheduler; False (nothing taken) if the queue is full."""
        if not self._has_room(sum(1 for j in jobs if j.delay <= 0)):
            return False
        loop = asyncio.get_running_loop()
        for job in jobs:
            self._by_rid.setdefault(job.rid, set()).add(job)
            if job.delay > 0:
                job.state = "delayed"
                self._delayed.add(job)
                job.timer = loop.call_later(job.delay, self._enter, job)
            else:
                self._enter(job)
        return True

    def abort(self, rid: str | None) -> int:
        """Abort jobs with this rid (all jobs when None); returns how many."""
        if rid is None:
            victims: Iterable[Job] = [*self._running, *self._waiting, *self._delayed]
        else:
            victims = list(self._by_rid.get(rid, ()))
        return sum(1 for job in victims if self.cancel(job))

    def cancel(self, job: Job) -> bool:
        """Abort one job (client gone, or /abort_request); False if already done."""
        if job.state == "waiting":
            self._waiting.remove(job)
            self._finish(job, 0, "waiting")
        elif job.state in ("running", "delayed"):
            self._finish(job, self.produced(job), "running")
        else:
            return False
        return True

    def produced(self, job: Job) -> int:
        """Tokens this job has produced so far."""
        if job.state == "running":
            return min(job.target, max(0, self.step - job.start_step))
        if job.outcome.done():
            return job.outcome.result().produced
        return 0

    def progress_signal(self) -> asyncio.Future[None]:
        """A future resolved after the next decode step (for streaming)."""
        if self._progress is None or self._progress.done():
            self._progress = asyncio.get_running_loop().create_future()
        return self._progress

    async def close(self) -> None:
        """Stop the step loop and pending timers (server shutdown)."""
        for job in self._delayed:
            if job.timer is not None:
                job.timer.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ------------------------------------------------------------ internals
    def _has_room(self, immediate: int) -> bool:
        limit = self._cfg.max_queued_requests
        if limit is None or self._cfg.instant or immediate == 0:
            return True
        free = 0 if self._waiting else self._cfg.max_running - len(self._running)
        return len(self._waiting) + max(0, immediate - free) <= limit

    def _enter(self, job: Job) -> None:
        """The job reaches the scheduler (after any slow-fault delay)."""
        self._delayed.discard(job)
        job.timer = None
        if self._cfg.instant:
            job.state = "running"
            job.cached = self.cache.cached_prompt_tokens(job.prompt_ids)
            self._stats.note_started()
            self._finish(job, job.target, None)
        elif len(self._running) < self._cfg.max_running and not self._waiting:
            self._admit(job)
            self._kick()
        else:
            job.state = "waiting"
            self._waiting.append(job)
            self._kick()

    def _admit(self, job: Job) -> None:
        job.state = "running"
        job.cached = self.cache.cached_prompt_tokens(job.prompt_ids)
        # Admitted during a step in flight: it starts with the next step.
        job.start_step = self.step + (1 if self._in_step else 0)
        self._running.add(job)
        self._stats.note_started()
        self._stats.set_busy(True)
        if job.target <= 0:
            self._finish(job, 0, None)
            return
        self._prefill_tokens += job.prompt_len - job.cached
        self._prefill_jobs.append(job)
        heapq.heappush(self._heap, (job.start_step + job.target, job.seq, job))

    def _finish(self, job: Job, produced: int, aborted: str | None) -> None:
        was_running = job.state == "running"
        job.state = "done"
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        self._delayed.discard(job)
        peers = self._by_rid.get(job.rid)
        if peers is not None:
            peers.discard(job)
            if not peers:
                del self._by_rid[job.rid]
        if was_running:
            self._running.discard(job)
            if produced > 0:  # SGLang caches the committed KV: all but the last token
                self.cache.insert([*job.prompt_ids, *job.output_ids[:produced - 1]])
            self._stats.note_finished(produced)
            self._stats.note_prompt(job.prompt_len, job.cached)
            if not self._running:
                self._stats.set_busy(False)
        if not job.outcome.done():
            job.outcome.set_result(Outcome(produced, aborted, job.cached))

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(_log_crash)
        self._wake.set()

    async def _run(self) -> None:
        """The step loop: admit, sleep for the step's cost, hand out tokens."""
        cfg = self._cfg
        loop = asyncio.get_running_loop()
        clock = loop.time()  # when the modelled GPU finishes its current step
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                clock = loop.time()
                continue
            while self._waiting and len(self._running) < cfg.max_running:
                self._admit(self._waiting.popleft())
            if not self._running:
                continue
            cost = (cfg.step_base + cfg.step_per_request * len(self._running)
                    + cfg.prefill_per_token * self._prefill_tokens)
            self._prefill_tokens = 0
            prefilled, self._prefill_jobs = self._prefill_jobs, []
            # Sleep to an absolute deadline so timer slack does not add up
            # over thousands of millisecond steps; never bank more than
            # _MAX_LAG of debt (after a stall, continue from now).
            clock = max(clock, loop.time() - _MAX_LAG) + cost
            self._in_step = True
            try:
                await asyncio.sleep(max(0.0, clock - loop.time()))
            finally:
                self._in_step = False
            self.step += 1
            for job in prefilled:  # SGLang's cache_unfinished_req after the prefill step
                if job.state == "running":
                    self.cache.insert(job.prompt_ids)
            self._complete_due()
            if self._progress is not None and not self._progress.done():
                self._progress.set_result(None)

    def _complete_due(self) -> None:
        heap = self._heap
        while heap and heap[0][0] <= self.step:
            _, _, job = heapq.heappop(heap)
            if job.state == "running":  # aborted jobs stay in the heap; skip them
                self._finish(job, job.target, None)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("step loop crashed", exc_info=task.exception())
