"""`python -m producer report`: a run's report as one self-contained HTML page.

A team about to train on 10^5 traces should see them first: how long the
outputs, reasonings and answers are against the `max_new_tokens` budget, how
generations finished and whether they closed their reasoning, what was
dead-lettered and when, how fast the run went on each server, which answers
look wrong (empty, repeated across prompts, without a stop token), and which
tokenizer, template and sampling made them, with a few decoded samples from
each bucket.

One idea per module: `read` streams the shards and dead letters in bounded
memory, `tally` keeps fixed-size summaries, `samples` and `letters` fold the
stream into them, `figures` reads them out as one JSON-able dict, `charts`
draws it (matplotlib to inline SVG: `charts`' docstring says why), `page`
lays it out, `build` runs the steps. Memory is one record batch plus the
tallies plus 16 bytes per stored sample (hashes for the repeat check).
"""
from .build import build_report

__all__ = ["build_report"]
