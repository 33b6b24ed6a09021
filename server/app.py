"""The FastAPI application of ``graphtop serve``: the OpenAI-compatible routes, ``/health`` and
``/metrics``, around one engine serving on its background thread.

``create_app`` only builds the application; ``server.ApiServer`` runs it with uvicorn on a thread of its
own. Served requests are ordinary engine requests (ids ``cmpl-…-0``, ``chatcmpl-…-0``): the dashboard,
a trace and ``graphtop advise`` see them as they see any other.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from graphtop.engine.telemetry.metrics import CONTENT_TYPE, MetricsCollector

from .errors import ApiError, error_body, error_response, install_handlers, model_not_found
from .generation import Admission
from .handlers import ServeContext, chat_completions, completions
from .options import ServeOptions
from .protocol import ChatCompletionRequest, CompletionRequest


def engine_problem(engine: Any) -> Optional[str]:
    """Why the engine cannot serve a request now (closed, failed, its serving thread stopped), or None."""
    problem = engine.unavailable
    if problem is not None:
        return problem
    if not engine.background_running:
        return "the engine's serving thread has stopped"
    return None


class BearerAuth:
    """``/v1/*`` needs ``Authorization: Bearer KEY`` (401 otherwise). Plain ASGI, not an ``http``
    middleware: Starlette's ``BaseHTTPMiddleware`` gets between a stream and the client's disconnect."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and not self._allowed(scope):
            response = error_response(
                ApiError(
                    401,
                    "a valid API key is needed: Authorization: Bearer KEY",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: dict) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, key = given.partition(b" ")
        return scheme.lower() == b"bearer" and secrets.compare_digest(key.strip(), self.key)


LOADING = "the model is still loading; /health answers 200 once it serves"


class Serving:
    """What the routes answer for: nothing while the model loads (every route but ``/metrics`` then
    answers 503 at once, instead of a connection left waiting in the listen queue), then the engine."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.ctx: Optional[ServeContext] = None

    def attach(self, engine: Any) -> None:
        """The model has loaded and ``engine`` serves on its background thread: answer for it."""
        admission = Admission(engine.max_running, self.options.max_queued_requests)
        o = self.options
        self.ctx = ServeContext(engine, o.model_name, admission, default_seed=o.seed, model_aliases=o.model_aliases)

    def context(self) -> ServeContext:
        if self.ctx is None:
            raise ApiError(503, LOADING, code="model_loading", headers={"Retry-After": "1"})
        return self.ctx


def model_card(ctx: ServeContext, name: str, root: Optional[str], created: int) -> dict[str, Any]:
    """``name``'s card, with vLLM's fields: ``root`` the model as given (vLLM's benchmark loads its tokenizer
    from there when given none; the name where no path was given), ``parent`` null (no adapters)."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "graphtop",
        "root": root or name,
        "parent": None,
        "max_model_len": ctx.engine.max_context_len,
    }


def create_app(serving: Serving, metrics: MetricsCollector) -> FastAPI:
    """The application for ``serving``'s engine (once attached, already serving: ``engine.start_background()``)."""
    options = serving.options
    app = FastAPI(title="graphtop", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    if options.api_key is not None:
        app.add_middleware(BearerAuth, api_key=options.api_key)
    app.state.serving = serving
    created = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        if serving.ctx is None:
            body = error_body(503, LOADING, code="model_loading")
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        engine = serving.ctx.engine
        problem = engine_problem(engine)
        if problem is not None:
            return JSONResponse(error_body(503, f"unhealthy: {problem}", code="engine_unavailable"), status_code=503)
        body: dict[str, Any] = {"status": "ok"}
        if engine.last_error is not None:  # a step failed and the engine went on: still serving
            body["last_error"] = engine.last_error
        return JSONResponse(body)

    @app.get("/metrics")
    async def prometheus() -> Response:
        text = await asyncio.to_thread(metrics.exposition)  # waits for the collector to catch up
        return Response(text, media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> Any:
        ctx = serving.context()
        return {"object": "list", "data": [model_card(ctx, n, options.model_root, created) for n in ctx.served_names]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> Any:
        ctx = serving.context()
        if model not in ctx.served_names:
            raise model_not_found(model, ctx.served_names)
        return model_card(ctx, model, options.model_root, created)

    @app.post("/v1/completions")
    async def _completions(body: CompletionRequest, request: Request) -> Any:
        return await completions(serving.context(), body, request)

    @app.post("/v1/chat/completions")
    async def _chat(body: ChatCompletionRequest, request: Request) -> Any:
        return await chat_completions(serving.context(), body, request)

    return app
