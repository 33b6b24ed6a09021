"""Output processing: sampled tokens become streamed text, and requests end for a named reason.

Runs on the step loop's thread after each step's tokens are on the host. A request's streamed text,
stop strings included, is its ``TextStream``'s (engine/step/text_stream.py): work per token that does
not grow with the text.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..batch import ForwardBatch
from ..request import FinishReason, Request, RequestStatus
from ..sampler import Sampled
from ..telemetry import events as ev
from .in_flight import RequestsInFlight

PublishFn = Callable[[ev.Event], None]


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Any,
        eos_ids: frozenset[int],
        max_context_len: int,
        kv_capacity_tokens: int,
        in_flight: RequestsInFlight,
        publish: PublishFn,
    ):
        """``in_flight`` gives a finished request's scheduler slot, KV pages and id back."""
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_context_len = max_context_len
        self.kv_capacity_tokens = kv_capacity_tokens
        self.in_flight = in_flight
        self.publish = publish

    def deliver(self, batch: ForwardBatch, tokens: list[int], placeholders: bool = False) -> None:
        """``placeholders``: each request's output_ids already ends with a stand-in for its token."""
        now = time.perf_counter()
        finish_reason, finished = self.finish_reason, RequestStatus.FINISHED  # once, not per request
        for req, tok in zip(batch.sample_requests, tokens):
            if req.status is finished:
                continue
            if placeholders:
                req.output_ids[-1] = tok
            else:
                req.output_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
                queue_ms = None if req.admitted is None else (req.admitted - req.arrival) * 1e3
                self.publish(
                    ev.RequestFirstToken(
                        request_id=req.request_id, ttft_ms=(now - req.arrival) * 1e3, queue_ms=queue_ms
                    )
                )
            text, stopped = ("", False) if req.detok is None else req.detok.push(tok)
            reason = finish_reason(req, tok, stopped)
            req.handle._push(tok, text)
            if reason is not None:
                self.finish(req, reason)

    def deliver_logprobs(self, batch: ForwardBatch, sampled: Sampled) -> None:
        """Hand each request the log-probabilities it asked for, before its token (so a reader woken by the
        token finds them): its prompt's first (they come from its prefill), then its new token's."""
        if sampled.prompt_logprobs:
            at = 0
            for req, n in batch.prompt_requests:
                req.handle._add_logprobs(sampled.prompt_logprobs[at : at + n], prompt=True)
                at += n
        if sampled.logprobs:
            for req, entry in zip(batch.sample_requests, sampled.logprobs):
                if entry is not None and req.status is not RequestStatus.FINISHED:
                    req.handle._add_logprobs([entry])

    def finish_reason(self, req: Request, tok: int, stopped: bool) -> Optional[FinishReason]:
        """``stopped``: a stop string completed with ``tok`` (the request's ``TextStream`` says; it holds
        stop strings back until ``min_tokens``, and the sampler holds back the tokens that would end it)."""
        p = req.params
        if not p.ignore_eos and tok in self.eos_ids:
            return FinishReason.EOS
        if stopped or (p.stop_token_ids and tok in p.stop_token_ids):
            return FinishReason.STOP
        if req.ends_by_length(len(req.output_ids), self.max_context_len, self.kv_capacity_tokens):
            return FinishReason.LENGTH
        return None

    def finish(self, req: Request, reason: FinishReason, error: Optional[str] = None) -> None:
        self.in_flight.release(req)
        if req.detok is not None and not req.detok.stopped:
            # The streamed text is provisional; the final text is one full decode of the output, less the
            # token that ended it (an end-of-sequence or stop token: vLLM's rule) unless it is asked for.
            p, ids = req.params, req.output_ids
            hidden = reason in (FinishReason.EOS, FinishReason.STOP) and not p.include_stop_str_in_output
            text = self.tokenizer.decode(ids[:-1] if hidden else ids, skip_special_tokens=p.skip_special_tokens)
            req.handle._set_text(text)
        try:
            req.handle._finish(reason, error)  # its on_update may raise KeyboardInterrupt (engine/step/cleanup.py)
        finally:  # the request has finished either way: every reader of the events must hear it
            self.publish(
                ev.RequestFinished(
                    request_id=req.request_id,
                    output_tokens=len(req.output_ids),
                    finish_reason=reason.value,
                    latency_ms=(time.perf_counter() - req.arrival) * 1e3,
                    error=error,
                )
            )
