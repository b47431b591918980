"""The figures of a run's stored samples, computed one record batch at a time.

`SampleTally.add(batch)` folds a batch into fixed-size tallies (see `tally.py`)
and `figures()` reads them out. The one thing kept per sample is 16 bytes (a
64-bit hash of its output ids and one of its prompt id) for the repeat check:
an output is *repeated* when the same ids were stored for different prompts,
which needs every output's hash, and a redelivered prompt stored twice (same
id) must not count. Lengths are token counts taken from the shard columns:
reasoning = `think_end_index - prompt_len` (output tokens before think-end),
answer = output tokens after think-end (the stop token included). Prefix-cache
hits (`cached_tokens`) are summed per server and over time only over the rows
that have the figure (`contract/fleet/cache_hits.py`); a shard older than the column
has none. In a run of several samples a prompt a row is named by its ledger key
(`row_key` of `id` and `sample`), so each sample counts once and two samples
of one prompt are never a redelivery.
"""
from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pyarrow as pa

from contract.fleet.cache_hits import Hits
from contract.run.samples import row_key
from contract.run.spec import RunSpec

from .tally import Counts, FoldingGrid, LogHistogram, Picks

CONSISTENCY = ("tokenizer_fingerprint", "template_fingerprint", "model", "max_new_tokens", "temperature",
               "top_p", "worker")
TIME_CELLS, GRID_CELLS, EXAMPLES = 128, 64, 3


class SampleTally:
    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.stop_ids = np.array(sorted(set(spec.stop_ids)), dtype=np.int64)
        self.rows = 0
        self.lengths = {name: Counts() for name in ("output", "reasoning", "answer", "prompt")}
        self.finish: Counter = Counter()
        self.closure: Counter = Counter()
        self.flags: Counter = Counter()
        self.values = {name: Counter() for name in CONSISTENCY}
        self.attempts: Counter = Counter()
        self.timeline = FoldingGrid(1, (1.0,), TIME_CELLS)        # samples, by seconds since the run began
        self.tokens_timeline = FoldingGrid(1, (1.0,), TIME_CELLS)  # output tokens, likewise
        self.cached_timeline = FoldingGrid(1, (1.0,), TIME_CELLS)  # cached prompt tokens, where known
        self.known_timeline = FoldingGrid(1, (1.0,), TIME_CELLS)   # prompt tokens of the rows that say
        self.cache_rows_known = 0
        self.grid = FoldingGrid(2, (1.0, 1.0), GRID_CELLS)        # prompt tokens x output tokens
        self.servers: dict[str, ServerTally] = {}
        self.hashes: list[np.ndarray] = []
        self.picks = {"shortest": Picks(EXAMPLES), "longest": Picks(EXAMPLES, largest=True),
                      **{flag: Picks(EXAMPLES) for flag in ("truncated", "unclosed", "no_stop_token",
                                                            "empty_answer")}}

    def add(self, batch: pa.RecordBatch) -> None:
        c = _Columns(batch, self.spec.samples)
        self.rows += batch.num_rows
        self._lengths(c)
        self._outcomes(c)
        self._time(c)
        self._servers(c)
        self._provenance(batch)
        self.hashes.append(output_hashes(batch, self.spec.samples))

    def _lengths(self, c: "_Columns") -> None:
        self.lengths["output"].add(c.output_len)
        self.lengths["prompt"].add(c.prompt_len)
        self.lengths["reasoning"].add(c.reasoning[c.closed])
        self.lengths["answer"].add(c.answer[c.closed])
        self.grid.add((c.prompt_len, c.output_len))
        self.picks["shortest"].offer_many(c.output_len, c.ids)
        self.picks["longest"].offer_many(c.output_len, c.ids)

    def _outcomes(self, c: "_Columns") -> None:
        self.finish.update(c.finish.tolist())
        self.closure.update({"one": int(c.closed.sum()), "none": int((~c.closed).sum())})
        ends_stop = c.ends_with_stop(self.stop_ids)
        flags = {"truncated": c.finish == "length", "unclosed": ~c.closed, "no_stop_token": ~ends_stop,
                 "empty_answer": c.closed & (c.answer - ends_stop == 0)}
        for flag, mask in flags.items():
            self.flags[flag] += int(mask.sum())
            for i in np.flatnonzero(mask):
                self.picks[flag].offer(0, c.ids[i])

    def _time(self, c: "_Columns") -> None:
        since = (c.finished_ms / 1000.0) - self.spec.created_at
        self.timeline.add((since,))
        self.tokens_timeline.add((since,), c.output_len)
        self.cached_timeline.add((since[c.cache_known],), c.cached[c.cache_known])
        self.known_timeline.add((since[c.cache_known],), c.prompt_len[c.cache_known])
        self.cache_rows_known += int(c.cache_known.sum())

    def _servers(self, c: "_Columns") -> None:
        names, inverse = np.unique(c.server, return_inverse=True)
        for k, name in enumerate(names):
            mask = inverse == k
            self.servers.setdefault(str(name), ServerTally()).add(c, mask)

    def _provenance(self, batch: pa.RecordBatch) -> None:
        for name in CONSISTENCY:
            for entry in batch.column(name).value_counts().to_pylist():
                value = entry["values"]
                self.values[name][round(value, 6) if isinstance(value, float) else value] += entry["counts"]
        self.attempts.update(batch.column("attempts").to_pylist())


class ServerTally:
    """One server's share of the run: samples, output tokens, busy span, latency, prefix-cache hits."""

    def __init__(self) -> None:
        self.samples = self.output_tokens = 0
        self.hits = Hits()
        self.first_started: float | None = None
        self.last_finished: float | None = None
        self.latency = LogHistogram()

    def add(self, c: "_Columns", mask: np.ndarray) -> None:
        self.samples += int(mask.sum())
        self.output_tokens += int(c.output_len[mask].sum())
        first, last = float(c.started_ms[mask].min()) / 1000, float(c.finished_ms[mask].max()) / 1000
        self.first_started = first if self.first_started is None else min(self.first_started, first)
        self.last_finished = last if self.last_finished is None else max(self.last_finished, last)
        self.latency.add(c.latency[mask])
        known = mask & c.cache_known
        self.hits.merge(Hits(int(c.prompt_len[mask].sum()), int(c.prompt_len[known].sum()), int(c.cached[known].sum())))


class _Columns:
    """A batch's columns as numpy arrays, and the per-sample quantities derived from them."""

    def __init__(self, batch: pa.RecordBatch, samples: int = 1):
        col = batch.column
        self.ids = np.array(row_keys(batch, samples), dtype=object)
        self.prompt_len = col("prompt_len").to_numpy(zero_copy_only=False).astype(np.int64)
        self.output_len = col("output_len").to_numpy(zero_copy_only=False).astype(np.int64)
        think_end = col("think_end_index")
        self.closed = think_end.is_valid().to_numpy(zero_copy_only=False)
        think_end = think_end.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        self.reasoning = think_end - self.prompt_len
        self.answer = self.output_len - self.reasoning - 1
        self.finish = col("finish_reason").fill_null("none").to_numpy(zero_copy_only=False).astype(str)
        self.stop_token = col("stop_token").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        self.server = col("server").fill_null("").to_numpy(zero_copy_only=False).astype(str)
        self.latency = col("e2e_latency").to_numpy(zero_copy_only=False).astype(np.float64)
        self.started_ms = col("started_at").cast(pa.int64()).to_numpy(zero_copy_only=False)
        self.finished_ms = col("finished_at").cast(pa.int64()).to_numpy(zero_copy_only=False)
        self.input_ids = col("input_ids")
        cached = col("cached_tokens") if "cached_tokens" in batch.schema.names else pa.nulls(batch.num_rows, pa.int32())
        self.cache_known = cached.is_valid().to_numpy(zero_copy_only=False)
        self.cached = cached.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)

    def ends_with_stop(self, stop_ids: np.ndarray) -> np.ndarray:
        """Whether the last output id is the recorded stop token or one of the run's stop ids."""
        values, offsets = flat_ids(self.input_ids)
        ends = offsets[1:]
        has_output = self.output_len > 0
        last = np.full(ends.size, -2, dtype=np.int64)
        last[has_output] = values[ends[has_output] - 1]
        return has_output & ((last == self.stop_token) | np.isin(last, stop_ids))


def row_keys(batch: pa.RecordBatch, samples: int = 1) -> list[str]:
    """Each row's ledger key: its id, or in a run of several samples a prompt `<id>~<sample>`."""
    ids = batch.column("id").to_pylist()
    if samples == 1:
        return ids
    indices = batch.column("sample").to_pylist() if "sample" in batch.schema.names else [None] * len(ids)
    return [row_key(i, n, samples) for i, n in zip(ids, indices)]


def output_hashes(batch: pa.RecordBatch, samples: int = 1) -> np.ndarray:
    """(hash of the output ids, hash of the row's ledger key) per row, as two uint64 columns."""
    values, offsets = flat_ids(batch.column("input_ids"))
    raw = memoryview(values.astype("<i4").tobytes())
    prompt_len = batch.column("prompt_len").to_numpy(zero_copy_only=False)
    pairs = np.empty((batch.num_rows, 2), dtype=np.uint64)
    for row, (start, end, prompt_id) in enumerate(zip(offsets[:-1], offsets[1:], row_keys(batch, samples))):
        begin = int(start) + int(prompt_len[row])
        pairs[row, 0] = _hash64(raw[begin * 4: int(end) * 4])
        pairs[row, 1] = _hash64(prompt_id.encode())
    return pairs


def flat_ids(ids: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """A batch's token ids end to end, and row offsets into them (a sliced batch holds only its own)."""
    offsets = ids.offsets.to_numpy()
    return ids.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0]


def _hash64(data) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
