"""Specifications of `workers.reporting`: what the worker shows of itself."""
