"""What the workers tell Redis about themselves and their servers: heartbeats, prefix-cache hits, provenance.

Imports the run, the Redis link and the top modules (`keys`, `names`); never the broker or the ledger.
"""
