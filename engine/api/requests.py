"""What callers ask of an engine: serve a prompt (``submit``), a batch of prompts (``generate``), and
stop one (``cancel``).

A mixin of ``Engine`` (engine/engine.py): the engine holds the state these methods use, annotated
below. Every method is thread-safe because it only checks its arguments, claims a request id and
queues a command; the step loop applies the command between steps (engine/step/commands.py).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from ..arguments import is_unicode
from ..errors import EngineError
from ..kv_pool import KVPool
from ..prompts import Prompt, PromptByteLimit, admission_problem, encode_prompt
from ..request import FinishReason, Request, RequestHandle, RequestIds
from ..sampling_params import SamplingParams
from ..step.commands import Cancel, CommandQueue, Submit
from ..step.detokenizer import IncrementalDetokenizer
from ..step.text_stream import TextStream
from ..telemetry import events as ev
from ..telemetry.bus import EventBus


class RequestApi:
    # the engine's, set in Engine.__init__
    tokenizer: Any
    spec: Any
    bus: EventBus
    pool: KVPool
    commands: CommandQueue
    max_context_len: int
    prompt_limit: PromptByteLimit
    background_running: bool
    _ids: RequestIds
    _lifecycle: threading.Lock
    _check_open: Callable[[], None]
    refuse_inside_step: Callable[[str], None]
    run_until_done: Callable[[Iterable[RequestHandle]], None]

    def submit(
        self,
        prompt: Prompt,
        params: Optional[SamplingParams] = None,
        *,
        chat: bool = False,
        request_id: Optional[str] = None,
    ) -> RequestHandle:
        """Queue a prompt (text, token ids, or a conversation: ``[{"role": "user", "content": ...}, ...]``,
        which always goes through the chat template; ``chat`` sends text through it). Thread-safe; returns
        at once with a streaming handle.

        A prompt that can never be served (empty, past the context or the KV pool, ids outside the
        vocabulary, in the prompt or in the params' logit_bias and stop_token_ids, a conversation for a
        model without a chat template) comes back as a finished
        ``rejected`` handle; text too long for the context by its bytes alone is rejected without being
        tokenized. A wrong type is a TypeError, a malformed conversation a ValueError; a request id that a
        request in flight already uses finishes the new one as ``rejected`` (cancel goes by id).
        """
        self._check_open()
        params = self._check_params(params)
        if request_id is not None and not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id is not None and not is_unicode(request_id):  # every event of it would poison a trace
            raise ValueError(f"request_id is not valid Unicode (a lone surrogate): {request_id!r}")
        text, ids = encode_prompt(self.tokenizer, prompt, chat, self.prompt_limit)
        return self._submit_encoded(text, ids, params, request_id)

    @staticmethod
    def _check_params(params: Optional[SamplingParams]) -> SamplingParams:
        if params is not None and not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        return params or SamplingParams()

    def _submit_encoded(
        self, text: str, ids: list[int], params: SamplingParams, request_id: Optional[str]
    ) -> RequestHandle:
        rid = self._ids.claim(request_id)
        if rid is None:  # request_id is not None here: only a wanted id can be taken
            problem = f"request id {request_id!r} is already used by a request in flight"
            handle = RequestHandle(str(request_id), self, text, ids)
            handle._finish(FinishReason.REJECTED, problem)
            # an error, not a request_finished: under that id every reader of the stream (the endpoint's
            # snapshot, the dashboard, a trace's latencies) would finish the live request
            self.bus.publish(ev.ErrorEvent(message=f"a submit was rejected: {problem}", where="submit"))
            return handle
        handle = RequestHandle(rid, self, text, ids)
        problem = admission_problem(ids, self.max_context_len, self.pool.capacity_tokens, self.spec.vocab_size)
        if not problem and params.vocab_problem(self.spec.vocab_size):  # logit_bias, stop_token_ids
            problem = str(params.vocab_problem(self.spec.vocab_size))
        if problem:
            self._ids.release(rid)
            handle._finish(FinishReason.REJECTED, problem)
            self.bus.publish(
                ev.RequestFinished(request_id=rid, output_tokens=0, finish_reason="rejected", error=problem)
            )
            return handle
        req = Request(rid, list(ids), params, handle)
        if params.detokenize:
            req.detok = self._text_stream(params)
        with self._lifecycle:  # queued before a close or a failure drains the queue, or refused: never lost
            try:
                self._check_open()
            except EngineError:
                self._ids.release(rid)
                raise
            self.commands.put(Submit(req))
        return handle

    def _text_stream(self, p: SamplingParams) -> TextStream:
        """The request's text: special tokens skipped or not, the token that ends it hidden unless asked for."""
        ends = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(self.spec.eos_token_ids))
        return TextStream(
            IncrementalDetokenizer(self.tokenizer, p.skip_special_tokens),
            p.stop,
            hidden=frozenset() if p.include_stop_str_in_output else ends,
            min_tokens=p.min_tokens,
            include_stop=p.include_stop_str_in_output,
        )

    def generate(
        self, prompts: Iterable[Union[str, Sequence[int]]], params: Optional[SamplingParams] = None
    ) -> list[RequestHandle]:
        """Submit all prompts at once (one continuous batch) and serve them to completion. Every prompt
        is checked before any is submitted: a wrong type refuses the whole call, serving none."""
        if isinstance(prompts, str):
            raise TypeError("generate takes a list of prompts; for one prompt pass [prompt], or use submit")
        self._check_open()
        self.refuse_inside_step("generate()")
        params = self._check_params(params)
        encoded = [encode_prompt(self.tokenizer, p, False, self.prompt_limit) for p in prompts]
        handles = [self._submit_encoded(text, ids, params, None) for text, ids in encoded]
        if self.background_running:
            for h in handles:
                h.wait()
        else:
            self.run_until_done(handles)
        return handles

    def cancel(self, request_id: str) -> None:
        """Cancel the request in flight with this id (none: nothing happens). Thread-safe."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        self.commands.put(Cancel(request_id))

    def cancel_handle(self, handle: RequestHandle) -> None:
        """``RequestHandle.cancel``: cancels that handle's request only, never a newer one with its id."""
        self.commands.put(Cancel(handle.request_id, handle))
