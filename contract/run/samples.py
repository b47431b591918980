"""Several samples of one prompt: each sample's key in the ledger, and its seed.

`enqueue --samples N` makes N samples of each prompt (a line's `id`), each its
own `/generate` request, its own entry in the ledger and its own row in a shard.
A sample's *key* (what the ledger, the queue message and the dead-letter hash
name) is the prompt's id when the run takes one sample of each prompt, so a run
of one sample is keyed exactly as before; with N > 1 every key is
`<prompt id>~<index>`, so a key always splits back into one prompt and one
index (`rpartition`), whatever characters the prompt's own id holds. A shard's
row keeps the prompt's own id in `id`, the index in `sample` and the seed it was
asked with in `seed`: (`id`, `sample`) names a row, and the key is derived from
them (`row_key`) wherever rows are matched against the ledger.

**A re-run asks the same seeds.** A sample's `sampling_seed` is derived from the
run's name, the prompt's id and the sample's index (sha256, 31 bits), or, where
the prompt's line gives its own `sampling.seed` S, it is S + index (mod 2^31):
the same three things give the same seed on any machine, in any order, after
any retry. Seeds differ between a prompt's samples, so under SGLang's
deterministic inference (where a request without a seed of its own gets the
same default seed) the samples of a prompt still differ.

**A resample asks another seed.** A sample that fails its think checks is sent
once more under `FLEET_RESAMPLE_ON_VERIFY_FAILURE`; where its request carried a
seed, the resample carries `resample_seed(seed)` (sha256 of the seed, 31 bits),
so a deterministic server (or a seeded stand-in) draws another answer instead of
repeating the one that failed, a re-run resamples alike, and the row's `seed` is
the one its answer was drawn with. A request without a seed resamples without one
(the server's own randomness; an SGLang older than the key still serves it).
"""
from __future__ import annotations

import hashlib

SEPARATOR = "~"
SEED_MODULUS = 2**31  # SGLang's sampling_seed is an int; keep it a positive int32


def sample_key(prompt_id: str, index: int, samples: int) -> str:
    """The ledger key of sample `index` of `prompt_id` in a run of `samples` samples a prompt."""
    return key_of(prompt_id, None if samples == 1 else index)


def key_of(prompt_id: str, sample: int | None) -> str:
    """The ledger key of a prompt (`sample` None: a run of one sample a prompt, where nothing names
    a sample, as a dead letter's `sample`) or of its sample `sample`."""
    return prompt_id if sample is None else f"{prompt_id}{SEPARATOR}{sample}"


def split_sample_key(key: str, samples: int) -> tuple[str, int]:
    """(prompt id, sample index) of a ledger key in a run of `samples` samples a prompt."""
    if samples == 1:
        return key, 0
    prompt_id, _, index = key.rpartition(SEPARATOR)
    if not prompt_id or not index.isdigit():
        raise ValueError(f"{key!r} is not a sample key (<prompt id>{SEPARATOR}<index>)")
    return prompt_id, int(index)


def row_key(prompt_id: str, sample: int | None, samples: int) -> str:
    """The ledger key of a shard row (a row written before samples had no `sample`: sample 0)."""
    return sample_key(prompt_id, sample or 0, samples)


def sample_seed(run: str, prompt_id: str, index: int, line_seed: int | None = None) -> int:
    """The `sampling_seed` of sample `index` of a prompt (module docstring)."""
    if line_seed is not None:
        return (line_seed + index) % SEED_MODULUS
    digest = hashlib.sha256(f"{run}\0{prompt_id}\0{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_MODULUS


def resample_seed(seed: int) -> int:
    """The seed a resample of a sample asked with `seed` is sent with (module docstring): not
    `seed` + k, which may be another sample's of the same prompt (a line's own seed counts up)."""
    digest = hashlib.sha256(f"resample\0{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_MODULUS


# -- `enqueue --until-verified K` --------------------------------------------------------------
# A prompt is sampled until K of its samples pass the verifier, at most N (`--samples`) in all.
# Its samples form K chains: chain j is samples j, j + K, j + 2K, ... (< N). The producer queues
# each chain's first sample; a sample that does not pass (stored with another verdict, or
# dead-lettered) queues the next sample of its chain, and one that passes ends it. So each chain
# yields at most one pass, K passes end every chain, only what failed is sampled again, and a
# successor is a function of its predecessor alone: queueing it twice (a worker that died
# between queueing it and settling its predecessor, then the redelivery) queues it once, as the
# ledger's enqueue is set-if-absent.


def first_indices(samples: int, until_verified: int | None) -> range:
    """The sample indices the producer queues for each prompt."""
    return range(samples if until_verified is None else min(until_verified, samples))


def successor(index: int, samples: int, until_verified: int | None) -> int | None:
    """The sample queued when sample `index` does not pass; None where its chain ends."""
    if until_verified is None:
        return None
    following = index + until_verified
    return following if following < samples else None


def per_prompt(samples: int, until_verified: int | None) -> str:
    """How many samples a prompt gets, in words (enqueue's, status's and export's summaries)."""
    if until_verified is None:
        return f"{samples} samples a prompt"
    return f"up to {samples} samples a prompt, until {until_verified} pass"
