"""Specifications of `workers.output`: a generation's answer is checked and stored."""
