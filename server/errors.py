"""Every failure of the HTTP API as an OpenAI-style error object, never a traceback.

``{"error": {"message", "type", "param", "code"}}`` is what the official clients parse (``openai`` raises
``BadRequestError`` and friends from it). FastAPI's own handlers answer a validation error with 422 and a
list of pydantic details, and an unexpected exception with a bare 500: both are replaced here, so a
malformed body is a 400 naming the field, and a bug is a 500 with one line.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",  # OpenAI's type for an unknown model or route
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An answer other than 200, raised anywhere in a handler; ``message`` is one line."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = one_line(message)
        self.param = param
        self.code = code
        self.headers = headers


def model_not_found(name: str, served: Sequence[str]) -> ApiError:
    """OpenAI's answer for a model it does not have: 404, ``model_not_found``, whether a request names it
    or ``GET /v1/models/{id}`` asks for it. ``served``: the names this server answers to."""
    names = ", ".join(repr(s) for s in served)
    return ApiError(
        404, f"model {name!r} is not served here; this server serves {names}", param="model", code="model_not_found"
    )


def one_line(text: str, limit: int = 500) -> str:
    """The first line of ``text``, cut to ``limit`` characters (an error object carries no traceback)."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {
        "error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param, "code": code}
    }


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(err.status, err.message, err.param, err.code), status_code=err.status, headers=err.headers
    )


def _loc_name(loc: Sequence[Any]) -> Optional[str]:
    """``("body", "messages", 0, "content")`` -> ``messages[0].content``; None for the body itself."""
    parts = [p for p in loc if p != "body"]
    name = ""
    for p in parts:
        if isinstance(p, int):
            name += f"[{p}]"
        elif "[" not in str(p) and not str(p).startswith("function-"):  # not a union member's tag
            name += f".{p}" if name else str(p)
    return name or None


def validation_error(exc: RequestValidationError) -> ApiError:
    """The first problem pydantic found, as one line naming the field."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "the request body is not valid")
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        why = first.get("ctx", {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON{f' ({why})' if why else ''}", code="invalid_json")
    param = _loc_name(first.get("loc", ()))
    if kind == "extra_forbidden":
        return ApiError(400, f"unknown field {param!r}: graphtop does not take it", param=param, code="unknown_field")
    if kind == "missing" and param is None:
        return ApiError(400, "the request body is empty: send a JSON object", code="missing_body")
    if kind == "missing":
        return ApiError(400, f"{param} is required", param=param, code="missing_field")
    if param is None:
        return ApiError(400, "the request body must be a JSON object (Content-Type: application/json)")
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) else f", got {json.dumps(got)[:60]}" if _jsonable(got) else ""
    return ApiError(400, f"{param}: {first.get('msg', 'not valid')}{shown}", param=param, code="invalid_value")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def install_handlers(app: FastAPI) -> None:
    """Replace FastAPI's 422 and bare-500 answers with error objects."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            message = (
                f"no route {request.url.path} (graphtop serves /v1/completions, /v1/chat/completions, "
                "/v1/models, /health and /metrics)"
            )
        return error_response(ApiError(exc.status_code, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:  # a bug: uvicorn logs its traceback
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {one_line(str(exc))}"))
