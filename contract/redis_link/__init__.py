"""The link to Redis: clients and URLs safe to print, retries through an outage, writes confirmed on a replica, Redis's clock, its write refusals, Lua scripts whose arguments have names.

Imports only `keys` and `names`; every other part may import it.
"""
