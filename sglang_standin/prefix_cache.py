"""SGLang's radix prefix cache, modelled per server: which prompt tokens need no prefill.

What SGLang does, and so what this models (sgl-project/sglang, `python/sglang/srt/`):

- At scheduling, `Req.init_next_round_input` matches the prompt against the
  tree, capped at `input_len - 1` (`_compute_max_prefix_len` in
  `managers/schedule_batch.py`: one token is always computed, for logits).
  The match length is the request's `meta_info.cached_tokens`
  (`managers/tokenizer_manager.py`) and those tokens skip prefill.
- After the prefill step, `process_batch_result_prefill` calls
  `tree_cache.cache_unfinished_req(req)` ("This updates radix so others can
  match"): the prompt is in the tree from then on.
- When the request finishes, `cache_finished_req` (`mem_cache/radix_cache.py`)
  inserts `(origin_input_ids + output_ids)[:kv_committed_len]`: the prompt and
  every generated token but the last, whose KV was never computed.
- When KV memory runs short, least recently used leaves are evicted.

The model's simplifications: the bound is its own token budget (`--prefix-cache-tokens`)
rather than the KV pool left over by running requests, so nothing is locked
against eviction; pages are one token (SGLang's default `--page-size 1`).

Invariants: `size` (tokens on all edges) never exceeds `capacity` after an
insert returns; a node's `last_used` is at least its children's, because every
touch stamps the whole path from the root, so the least recently used leaf is
always the right thing to drop and its parent, once childless, is next in line.
A lookup or insert walks one path: O(prompt length). Stale heap entries are
skipped on pop and the heap is rebuilt once it holds twice the nodes, so memory
stays O(capacity).
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from typing import Sequence

_TYPECODE = "q"  # token ids as 8-byte ints: a tenth of a Python list's memory per token


class _Node:
    """One edge of the tree: its token run, children by first token, last use."""

    __slots__ = ("tokens", "children", "parent", "last_used")

    def __init__(self, tokens: array, parent: _Node | None, last_used: int) -> None:
        self.tokens = tokens
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_used = last_used


class PrefixCache:
    """A token trie of bounded size; `capacity` 0 disables it (every match is 0)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._clock = itertools.count(1)
        self.clear()

    def clear(self) -> None:
        """Drop everything (SGLang's /flush_cache resets the tree the same way)."""
        self._root = _Node(array(_TYPECODE), None, 0)
        self.size = 0
        self._nodes = 0
        self._heap: list[tuple[int, int, _Node]] = []

    def match(self, ids: Sequence[int], limit: int | None = None) -> int:
        """Length of the longest cached prefix of `ids[:limit]`; marks that path used."""
        n = len(ids) if limit is None else max(0, min(limit, len(ids)))
        if self.capacity == 0 or n == 0:
            return 0
        key = array(_TYPECODE, ids[:n])
        now = next(self._clock)
        node, i = self._root, 0
        while i < n:
            child = node.children.get(key[i])
            if child is None:
                break
            k = _common(child.tokens, key, i)
            child.last_used = now
            node, i = child, i + k
            if k < len(child.tokens):
                break
        self._note_use(node)
        return i

    def cached_prompt_tokens(self, prompt: Sequence[int]) -> int:
        """`cached_tokens` of a prompt scheduled now: the match, at most len - 1."""
        return self.match(prompt, len(prompt) - 1)

    def insert(self, ids: Sequence[int]) -> None:
        """Cache `ids` (its first `capacity` tokens), then evict LRU leaves to the bound."""
        n = min(len(ids), self.capacity)
        if n == 0:
            return
        key = array(_TYPECODE, ids[:n])
        now = next(self._clock)
        node, i = self._root, 0
        while i < n:
            child = node.children.get(key[i])
            if child is None:
                child = _Node(key[i:], node, now)
                node.children[key[i]] = child
                self.size += n - i
                self._nodes += 1
                node = child
                break
            k = _common(child.tokens, key, i)
            if k < len(child.tokens):
                child = self._split(child, k)
            child.last_used = now
            node, i = child, i + k
        self._note_use(node)
        self._evict()

    # ------------------------------------------------------------ internals
    def _split(self, child: _Node, k: int) -> _Node:
        """Cut `child`'s edge after k tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.tokens[:k], parent, child.last_used)
        parent.children[child.tokens[0]] = upper
        child.tokens = child.tokens[k:]
        child.parent = upper
        upper.children[child.tokens[0]] = child
        self._nodes += 1
        return upper

    def _note_use(self, node: _Node) -> None:
        """A leaf's last use changed: queue it for eviction in that order."""
        if node is not self._root and not node.children:
            heapq.heappush(self._heap, (node.last_used, id(node), node))
            if len(self._heap) > 2 * self._nodes + 64:
                self._rebuild_heap()

    def _evict(self) -> None:
        while self.size > self.capacity and self._heap:
            stamp, _, leaf = heapq.heappop(self._heap)
            parent = leaf.parent
            if parent is None or leaf.children or leaf.last_used != stamp:
                continue  # stale: evicted already, grew children, or used since
            del parent.children[leaf.tokens[0]]
            leaf.parent = None
            self.size -= len(leaf.tokens)
            self._nodes -= 1
            if parent is not self._root and not parent.children:
                heapq.heappush(self._heap, (parent.last_used, id(parent), parent))

    def _rebuild_heap(self) -> None:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append((node.last_used, id(node), node))
        heapq.heapify(leaves)
        self._heap = leaves


def _common(edge: array, key: array, start: int) -> int:
    """How many leading tokens of `edge` equal `key[start:]` (a C compare when all do)."""
    n = min(len(edge), len(key) - start)
    if edge[:n] == key[start:start + n]:
        return n
    for j in range(n):
        if edge[j] != key[start + j]:
            return j
    return n
