"""One HTTP request's engine requests, streamed from the engine's thread into the server's event loop.

The engine steps on its own thread and never waits for the HTTP layer: a handle's ``on_update`` (called
on the engine thread after each token and at the finish) only schedules a wake-up on the event loop
(``wakeups.LoopWaker``: one loop call for all the streams a step feeds), at most one pending per request
group; the loop then reads each handle's new text and finish itself. A client that goes away cancels its
requests (``cancel``), which frees their KV pages at the next step boundary.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional, Sequence

from graphtop.engine.errors import EngineError
from graphtop.engine.request import FinishReason, RequestHandle, TokenLogprob
from graphtop.engine.sampling_params import SamplingParams

from .errors import ApiError, error_body, one_line
from .wakeups import waker_for

FINISH = {FinishReason.EOS: "stop", FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}
"""The engine's finish reasons as OpenAI names them (an end-of-sequence token is a natural stop)."""


class EngineFailed(Exception):
    """A request the engine ended without finishing it (a failed step, a closed engine); one line. Once a
    stream has begun it is the stream's last chunk (``error_body``), before it the response
    (``api_error``)."""

    status, code, prefix = 500, "engine_error", "the engine failed this request: "

    def api_error(self) -> ApiError:
        return ApiError(self.status, f"{self.prefix}{self}", code=self.code)

    def error_body(self) -> dict:
        return error_body(self.status, f"{self.prefix}{self}", code=self.code)


class ServerStopping(EngineFailed):
    """The server stopped (SIGTERM) before the request finished: its stream is ended, not cut."""

    status, code, prefix = 503, "server_shutting_down", ""


@dataclass
class Echo:
    """A choice's prompt, for ``echo``: its text, its token ids and their log-probabilities (the second
    token's first; empty unless asked for)."""

    text: str
    ids: list[int]
    logprobs: list[TokenLogprob]


@dataclass
class ChoiceUpdate:
    """New text of one choice, the log-probabilities of its new tokens (when asked for), its prompt in its
    first update (``echo``); ``finish_reason`` once it has finished."""

    index: int
    text: str
    finish_reason: Optional[str] = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    echo: Optional[Echo] = None


class Admission:
    """The bound on requests in flight: the engine's running slots plus ``max_queued`` waiting ones.
    Past it a request is refused with 429 and ``Retry-After`` instead of queueing without limit. Used
    on the event loop's thread only."""

    def __init__(self, max_running: int, max_queued: Optional[int]) -> None:
        self.limit = None if max_queued is None else max_running + max_queued
        self.in_flight = 0

    def admit(self, count: int) -> None:
        if self.limit is not None and self.in_flight + count > self.limit:
            raise ApiError(
                429,
                f"the server is at its limit of {self.limit} requests in flight ({self.in_flight} now); retry later",
                code="too_many_requests",
                headers={"Retry-After": "1"},
            )
        self.in_flight += count

    def release(self, count: int) -> None:
        self.in_flight -= count


@dataclass(frozen=True)
class Output:
    """What a response shows of each choice besides its text: its tokens' log-probabilities, its prompt
    (``echo``), and whether its generated tokens are hidden (``max_tokens: 0`` with ``echo``: the engine
    generates one token, which the response leaves out, so only the prompt is scored)."""

    logprobs: bool = False
    echo: bool = False
    hidden: bool = False


class Generation:
    """``n`` choices for each prompt, as engine requests ``{request_id}-{i}`` (choice ``i`` of the whole
    request: prompt ``p``'s choice ``j`` is ``p * n + j``, OpenAI's numbering)."""

    def __init__(
        self,
        engine: Any,
        loop: asyncio.AbstractEventLoop,
        output: Output = Output(),
        *,
        default_seed: Optional[int] = None,
    ) -> None:
        self.engine = engine
        self.output = output
        self.default_seed = default_seed
        self.prompt_count = self.n = 0
        self._stopped: Optional[str] = None
        self.handles: list[RequestHandle] = []
        self._waker = waker_for(loop)
        self._event = asyncio.Event()
        self._wake_pending = False
        self._done: list[bool] = []
        self._started: list[bool] = []

    def submit(self, prompts: Sequence[Any], params: SamplingParams, n: int, request_id: str, param: str) -> None:
        """Queue every choice; a prompt the engine refuses cancels those already queued (ApiError 400),
        a closed engine is a 503. ``param``: the request field the prompts came from."""
        from .access import note_generation

        if params.seed is None and self.default_seed is not None:
            params = params.replace(seed=self.default_seed)  # before the choices: choice j takes seed + j
        self.prompt_count, self.n = len(prompts), n
        note_generation(self)
        try:
            for p, prompt in enumerate(prompts):
                for j in range(n):
                    seeded = params if params.seed is None or j == 0 else params.replace(seed=params.seed + j)
                    handle = self.engine.submit(prompt, seeded, request_id=f"{request_id}-{len(self.handles)}")
                    self.handles.append(handle)
                    if handle.finish_reason is FinishReason.REJECTED:
                        code = "context_length_exceeded" if "limit" in (handle.error or "") else "invalid_prompt"
                        where = f"{param}[{p}]" if len(prompts) > 1 else param
                        raise ApiError(400, f"{where}: {handle.error}", param=param, code=code)
        except EngineError as e:
            self.cancel()
            raise ApiError(503, f"the engine is not serving: {one_line(str(e))}", code="engine_unavailable") from None
        except (TypeError, ValueError) as e:
            self.cancel()
            raise ApiError(400, f"{param}: {one_line(str(e))}", param=param) from None
        except ApiError:
            self.cancel()
            raise
        self._done = [False] * len(self.handles)
        self._started = [False] * len(self.handles)
        for handle in self.handles:
            handle.on_update = self._on_update
        self._event.set()  # whatever happened before the callbacks were attached is read at once

    def _on_update(self, handle: RequestHandle) -> None:
        """On the engine's thread: wake the loop, at most once until it has looked."""
        if self._wake_pending:
            return
        self._wake_pending = True
        self._waker.wake(self._wake)

    def _wake(self) -> None:
        self._wake_pending = False  # cleared before the reader runs: a token after this wakes it again
        self._event.set()

    @property
    def finished(self) -> bool:
        return bool(self._done) and all(self._done)

    async def updates(self) -> AsyncIterator[list[ChoiceUpdate]]:
        """New text of every choice as it comes, a list per wake-up, until each has finished.
        EngineFailed when the engine ended one without finishing it."""
        while not self.finished:
            await self._event.wait()
            self._event.clear()
            if self._stopped is not None:
                raise ServerStopping(self._stopped)
            batch = self._collect()
            if batch:
                yield batch

    def _collect(self) -> list[ChoiceUpdate]:
        out = []
        shown = self.output
        for i, handle in enumerate(self.handles):
            if self._done[i]:
                continue
            finished = handle.finished  # first: a finished handle's text is final
            text = handle.new_text()
            logprobs = handle.new_logprobs() if shown.logprobs else []
            if shown.hidden:
                text, logprobs = "", []
            if finished:
                self._done[i] = True
                reason = FINISH.get(handle.finish_reason)  # type: ignore[arg-type]
                if reason is None:
                    raise EngineFailed(one_line(handle.error or f"the request was {handle.finish_reason.value}"))
            elif not text and not logprobs:
                continue
            else:
                reason = None
            update = ChoiceUpdate(i, text, reason, logprobs)
            if shown.echo and not self._started[i]:
                update.echo = Echo(handle.prompt, handle.prompt_ids, handle.prompt_logprobs if shown.logprobs else [])
            self._started[i] = True
            out.append(update)
        return out

    def stop(self, reason: str) -> None:
        """End the request now, its reader raising ServerStopping(reason) (a shutdown whose wait ran out).
        On the event loop's thread."""
        if self.finished:
            return
        self._stopped = reason
        self.cancel()
        self._event.set()

    def token_counts(self) -> tuple[int, int]:
        """(prompt, completion) tokens so far, for the access log."""
        if not self.handles:
            return 0, 0
        usage = self.usage(min(self.prompt_count, len(self.handles) // max(1, self.n)), self.n)
        return usage["prompt_tokens"], usage["completion_tokens"]

    def cancel(self) -> None:
        """Cancel every choice still running (a client that left, or a sibling refused)."""
        for handle in self.handles:
            handle.on_update = None
            handle.cancel()

    def usage(self, prompt_count: int, n: int) -> dict[str, int]:
        """OpenAI's usage: each prompt's tokens once, every choice's generated tokens (so far, in a stream)."""
        prompt = sum(len(self.handles[p * n].prompt_ids) for p in range(prompt_count))
        completion = 0 if self.output.hidden else sum(h.num_tokens for h in self.handles)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
