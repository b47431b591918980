"""The run's ledger: where each prompt (and each conversation) stands, every change one Lua script, its deliveries, dead letters and packed token ids.

Imports the fleet, the run, chat, the Redis link and the top modules (`keys`, `names`); never the broker.
"""
