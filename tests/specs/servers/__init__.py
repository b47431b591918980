"""Specifications of `workers.servers`: a server is chosen and called: the SGLang servers (or gateways) a worker is bound to."""
