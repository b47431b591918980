"""The error shapes real SGLang answers, one builder each.

SGLang has several unrelated error bodies on the native API and clients must
cope with all of them; the stand-in reproduces each exactly (see
research/sglang_api.md section 4):

- ValueError during validation: 400 `{"error": {"message": ...}}`
- request-body schema error (a wrong type, a Content-Type other than
  application/json): 400
  `{"object": "error", "message": ..., "type": "Bad Request", "param": null, "code": 400}`
- the JSON contract gate (an unknown or mistyped sampling key, see
  `contract_gate`): 400 `{"error": "<text>"}`, a string
- scheduler abort (queue full): 503
  `{"object": "error", "message": ..., "type": "503", "param": null, "code": 503}`
- unhandled exception: 500 text/plain `Internal Server Error`
- an input id outside the vocabulary: no answer at all, the server exits
  (`generate.crash_on_oov`), unless `--oov-ids reject`
- bad API key: 401 `{"error": "Unauthorized"}`
"""

from __future__ import annotations

from starlette.responses import JSONResponse, PlainTextResponse, Response

QUEUE_FULL_MESSAGE = "The request queue is full."


class RequestError(Exception):
    """A SGLang `ValueError`: answered 400 `{"error": {"message": ...}}`."""


class SchemaError(Exception):
    """The body does not fit `GenerateReqInput` (FastAPI validation error)."""


class ContractError(Exception):
    """The body breaks SGLang's JSON contract (`contract_gate`): 400 `{"error": "<text>"}`."""


class InternalError(Exception):
    """What makes real SGLang crash the handler: a bare 500."""


def value_error(message: str) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=400)


def contract_error(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=400)


def schema_error(message: str) -> Response:
    return JSONResponse(_openai_error(message, "Bad Request", 400), status_code=400)


def service_error(message: str, status: int = 503) -> Response:
    return JSONResponse(_openai_error(message, str(status), status), status_code=status)


def queue_full() -> Response:
    return service_error(QUEUE_FULL_MESSAGE, 503)


def internal_error() -> Response:
    return PlainTextResponse("Internal Server Error", status_code=500)


def unauthorized() -> Response:
    return JSONResponse({"error": "Unauthorized"}, status_code=401)


def _openai_error(message: str, err_type: str, code: int) -> dict:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}
