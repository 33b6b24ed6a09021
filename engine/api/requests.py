"""What callers ask of an engine: serve a prompt (``submit``), a batch of prompts (``generate``), and
stop one (``cancel``).

A part the ``Engine`` (engine/engine.py) owns and delegates to. Every method is thread-safe because it
only checks its arguments, claims a request id and queues a command; the step loop applies the command
between steps (engine/step/apply.py). Handles drive and wait on the engine through its ``Serving`` part.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Union

from ..arguments import is_unicode
from ..errors import EngineError
from ..kv_pool import KVPool
from ..prompts import Prompt, PromptByteLimit, admission_problem, encode_prompt
from ..request import FinishReason, Request, RequestHandle
from ..sampling_params import SamplingParams
from ..step.commands import Cancel, CommandQueue, Submit
from ..step.detokenizer import IncrementalDetokenizer
from ..step.in_flight import RequestsInFlight
from ..step.serving import Serving
from ..step.text_stream import TextStream
from ..telemetry import events as ev
from ..telemetry.bus import EventBus


class Requests:
    def __init__(
        self,
        tokenizer: Any,
        spec: Any,
        bus: EventBus,
        pool: KVPool,
        commands: CommandQueue,
        max_context_len: int,
        prompt_limit: PromptByteLimit,
        in_flight: RequestsInFlight,
        serving: Serving,
    ) -> None:
        self.tokenizer = tokenizer
        self.spec = spec
        self.bus = bus
        self.pool = pool
        self.commands = commands
        self.max_context_len = max_context_len
        self.prompt_limit = prompt_limit
        self.in_flight = in_flight
        self.serving = serving

    def submit(
        self,
        prompt: Prompt,
        params: Optional[SamplingParams] = None,
        *,
        chat: bool = False,
        request_id: Optional[str] = None,
    ) -> RequestHandle:
        """See ``Engine.submit``."""
        self.serving.check_open()
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
        ids_in_flight = self.in_flight.ids
        rid = ids_in_flight.claim(request_id)
        if rid is None:  # request_id is not None here: only a wanted id can be taken
            problem = f"request id {request_id!r} is already used by a request in flight"
            handle = RequestHandle(str(request_id), self.serving, text, ids)
            handle._finish(FinishReason.REJECTED, problem)
            # an error, not a request_finished: under that id every reader of the stream (the endpoint's
            # snapshot, the dashboard, a trace's latencies) would finish the live request
            self.bus.publish(ev.ErrorEvent(message=f"a submit was rejected: {problem}", where="submit"))
            return handle
        handle = RequestHandle(rid, self.serving, text, ids)
        problem = admission_problem(ids, self.max_context_len, self.pool.capacity_tokens, self.spec.vocab_size)
        if not problem and params.vocab_problem(self.spec.vocab_size):  # logit_bias, stop_token_ids
            problem = str(params.vocab_problem(self.spec.vocab_size))
        if problem:
            ids_in_flight.release(rid)
            handle._finish(FinishReason.REJECTED, problem)
            self.bus.publish(
                ev.RequestFinished(request_id=rid, output_tokens=0, finish_reason="rejected", error=problem)
            )
            return handle
        req = Request(rid, list(ids), params, handle)
        if params.detokenize:
            req.detok = self._text_stream(params)
        with self.serving.lifecycle:  # queued before a close or a failure drains the queue, or refused: never lost
            try:
                self.serving.check_open()
            except EngineError:
                ids_in_flight.release(rid)
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
        """See ``Engine.generate``."""
        if isinstance(prompts, str):
            raise TypeError("generate takes a list of prompts; for one prompt pass [prompt], or use submit")
        self.serving.check_open()
        self.serving.refuse_inside_step("generate()")
        params = self._check_params(params)
        encoded = [encode_prompt(self.tokenizer, p, False, self.prompt_limit) for p in prompts]
        handles = [self._submit_encoded(text, ids, params, None) for text, ids in encoded]
        if self.serving.background_running:
            for h in handles:
                h.wait()
        else:
            self.serving.run_until_done(handles)
        return handles

    def cancel(self, request_id: str) -> None:
        """See ``Engine.cancel``."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        self.commands.put(Cancel(request_id))
