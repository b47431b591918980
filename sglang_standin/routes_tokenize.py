"""`POST /tokenize` and `/v1/tokenize`: the server's own tokenizer, as SGLang 0.5.23 answers.

Why: a client can ask the server how it tokenizes (`{"prompt": "..."}` or a
list of prompts) instead of trusting its own copy of the tokenizer. The body
is `{"tokens", "count", "max_model_len"}`: ids and their count (lists of each
for a list of prompts), and the tokenizer's `model_max_length` (from
`tokenizer_config.json`, not the server's context; the context when the
tokenizer sets none). `add_special_tokens` defaults to true, as SGLang's.
The route wants Content-Type application/json (400 otherwise), and a stand-in
without a tokenizer (`sglang_standin.tokenizer`) answers 400 saying so;
`messages` (chat-template tokenization) is not modelled.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sglang_standin import errors
from sglang_standin.state import StandinState
from sglang_standin.tokenizer import NO_TOKENIZER, load_tokenizer

UNSUPPORTED_MEDIA = ("1 validation error:\n  {'loc': ['header', 'content-type'], 'msg': \"Unsupported Media "
                     "Type: Only 'application/json' is allowed\", 'type': 'value_error'}")


def _bad_request(message: str) -> Response:
    """SGLang's OpenAI-route ErrorResponse."""
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                         "code": 400}, status_code=400)


async def tokenize(request: Request) -> Response:
    state: StandinState = request.app.state.standin
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        return errors.schema_error(UNSUPPORTED_MEDIA)
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        return errors.schema_error(f"1 validation error: body: JSON decode error ({exc})")
    prompt = body.get("prompt") if isinstance(body, dict) else None
    if not isinstance(body, dict) or (prompt is None) == (body.get("messages") is None):
        return errors.schema_error("1 validation error: Value error, Exactly one of 'prompt' or 'messages' "
                                   "must be provided.")
    tokenizer = load_tokenizer(state.cfg.tokenizer_path)
    if tokenizer is None:
        return _bad_request(NO_TOKENIZER)
    if prompt is None:
        return _bad_request("Chat template tokenization (messages) is not modelled by the SGLang stand-in.")
    special = body.get("add_special_tokens", True) is not False
    max_model_len = tokenizer.model_max_length or state.cfg.context_len
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, special)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": max_model_len})
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        lists = [tokenizer.encode(p, special) for p in prompt]
        return JSONResponse({"tokens": lists, "count": [len(x) for x in lists], "max_model_len": max_model_len})
    return errors.schema_error("1 validation error: body.prompt: Input should be a valid string or list of strings")
