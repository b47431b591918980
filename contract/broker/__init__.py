"""The broker: Celery/kombu settings both sides agree on, publishing, kombu's Redis transport as the fleet reads it, its batched take, the worker's lease, the library versions it is built for.

Imports the ledger, the run, the Redis link and the top modules (`keys`, `names`); nothing above it.
"""
