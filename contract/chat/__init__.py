"""The chat template, token ids and the think-start check; the bundled tokenizer (`bundled_tokenizer/`), the tokenizer probe, and which history each turn of a conversation renders.

Imports only the top modules (`keys`, `names`).
"""
