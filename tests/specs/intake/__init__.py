"""Specifications of `workers.intake`: a prompt arrives and is held safely until it is stored or handed back."""
