"""What a run asks for: its spec, samples and seeds, a line's own sampling and fields, log-probabilities, verifiers.

Imports chat and the top modules (`keys`, `names`) only.
"""
