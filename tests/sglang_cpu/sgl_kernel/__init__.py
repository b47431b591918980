"""The one kernel SGLang's CPU engine calls on a CPU without AMX, in plain torch.

SGLang's CPU engine imports `sgl_kernel`, whose CPU build is not on the package
index (only its source, `sgl-kernel/pyproject_cpu.toml` in SGLang's repository).
On a CPU without AMX the engine calls one function of it,
`assign_req_to_token_pool_cpu`, with the semantics of SGLang's Triton kernel
`assign_req_to_token_pool` (`sglang/srt/mem_cache/allocation.py`): for each
request row r with the range [start, end), in order, `req_to_token[r, start:end]`
takes the next `end - start` entries of `out_cache_loc`. SGLang imports
more names than it calls: any other name imports, and fails when called, so a new SGLang that needs more is seen, not guessed at.
Made for SGLang 0.5.23 (tests/real_sglang.py pins it); used by tests only.
"""
from __future__ import annotations

import torch


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        req_to_token[row, start:end] = out_cache_loc[taken:taken + end - start]
        taken += end - start


def __getattr__(name: str):
    """SGLang imports more names than it calls here: each other name imports, and fails when called."""
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_args, **_kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not provided by tests/sglang_cpu/sgl_kernel (only "
                                  "assign_req_to_token_pool_cpu): this SGLang calls more of its CPU kernels")
    missing.__name__ = name
    return missing
