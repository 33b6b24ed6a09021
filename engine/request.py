"""A request's life inside the engine, the thread-safe handle its submitter holds, and the ids in flight."""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from array import array
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Optional, Protocol

from .arguments import wait_timeout
from .sampling_params import SamplingParams

log = logging.getLogger("graphtop.engine")


class RequestOwner(Protocol):
    """What a handle needs from whoever serves its request (the engine's ``Serving`` part): a way to make progress when
    nobody else drives the loop, a way to cancel, and the refusal of a wait that would wait on itself."""

    @property
    def background_running(self) -> bool: ...

    def step(self) -> bool: ...

    def refuse_inside_step(self, what: str) -> None: ...

    def cancel_handle(self, handle: "RequestHandle") -> None: ...


class TokenLogprob(NamedTuple):
    """One token's log-probability and its most likely alternatives, most likely first (as many as its
    request's ``logprobs`` or ``prompt_logprobs`` asked for): the log-softmax of the model's raw logits."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class FinishReason(str, enum.Enum):
    """Why a request stopped; the value is what traces and output files say."""

    EOS = "eos"
    LENGTH = "length"  # max_new_tokens reached, or the context limit
    STOP = "stop"  # a stop string matched
    REJECTED = "rejected"  # never scheduled: see RequestHandle.error
    CANCELLED = "cancelled"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Engine-side state. ``num_computed`` counts tokens of ``fill_ids`` whose KV is in the pool."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    handle: "RequestHandle"
    output_ids: list[int] = field(default_factory=list)
    pages: array = field(default_factory=lambda: array("i"))  # KV page ids; an int32 array so page
    # tables are built with memcpy-speed extends, not one int conversion per page per step
    num_computed: int = 0
    #: how many of ``pages`` (the first ones) were freed as out of every layer's window and now read the dummy
    #: page (the scheduler's ``window``): never freed twice
    dropped_pages: int = 0
    status: RequestStatus = RequestStatus.WAITING
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: Optional[float] = None
    admitted: Optional[float] = None  # when it first left the waiting queue (perf_counter): its queue time ends
    preemptions: int = 0
    generator: Optional[object] = None  # torch.Generator, created lazily for seeded sampling
    detok: Optional[Any] = None  # its TextStream (engine/step/text_stream.py) when it is detokenized
    prompt_vocab: Optional[list[int]] = None  # the prompt's distinct ids, for a repetition penalty (made once)
    prompt_logprobs_next: int = 1  # the first prompt token whose log-probability is not scheduled yet

    @property
    def fill_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def prefill_target(self) -> int:
        """Tokens whose KV must exist before the next decode step.

        A fresh request needs its prompt; a preempted one recomputes prompt + outputs except the
        last output token, which the next decode step feeds in as usual.
        """
        if self.output_ids:
            return len(self.prompt_ids) + len(self.output_ids) - 1
        return len(self.prompt_ids)

    def ends_by_length(self, produced: int, max_context_len: int, capacity_tokens: int, spare: int = 0) -> bool:
        """Whether ``produced`` output tokens end this request by length: its ``max_new_tokens``, or its
        context (plus ``spare`` tokens) reaching the context limit or the whole KV pool (a request alone
        outgrowing the pool cannot be helped by preempting it).

        The one home of the length policy: the output path asks it of the tokens a request has, the
        overlap schedule of the token still in flight before it chains the next step."""
        limit = min(max_context_len, capacity_tokens)
        return produced >= self.params.max_new_tokens or len(self.prompt_ids) + produced + spare >= limit

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target


class RequestHandle:
    """What ``Engine.submit`` returns. Safe to read from any thread while the engine streams into it."""

    def __init__(self, request_id: str, owner: RequestOwner, prompt: str, prompt_ids: list[int]):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self._owner = owner
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._waiters = 0  # threads inside a wait on _cond: a push with none skips the notify
        self._token_ids: list[int] = []
        self._pieces: list[str] = []  # the text, one piece per push: joined when read, never per token
        self._read = 0  # pieces new_text has returned
        self._logprobs: list[TokenLogprob] = []  # per generated token, when its params ask for logprobs
        self._logprobs_read = 0
        self._prompt_logprobs: list[TokenLogprob] = []  # prompt tokens 1.. (the first has none)
        self._finished = False
        self.finish_reason: Optional[FinishReason] = None
        self.error: Optional[str] = None
        self.on_update: Optional[Callable[["RequestHandle"], None]] = None
        self.callback_error: Optional[str] = None  # why on_update was detached (it raised)

    # --- engine side -------------------------------------------------------------------------
    def _push(self, token_id: int, text: str) -> None:
        """One token and the text it adds, from the step loop: at a few hundred requests a step this runs
        per request per step, so it only notifies when a thread waits, and its work never grows with the
        text (it appends a piece)."""
        with self._lock:  # the condition's own lock, without its Python-level wrapper
            self._token_ids.append(token_id)
            if text:
                self._pieces.append(text)
            if self._waiters:
                self._cond.notify_all()
        if self.on_update is not None:
            self._notify()

    def _add_logprobs(self, entries: list[TokenLogprob], prompt: bool = False) -> None:
        """Log-probabilities of generated tokens (before their ``_push``) or of prompt tokens, from the step
        loop; only requests that asked for them get any, so the fast path never comes here."""
        with self._lock:
            (self._prompt_logprobs if prompt else self._logprobs).extend(entries)

    def _set_text(self, text: str) -> None:
        """The final text (it may differ from the streamed one): ``new_text`` goes on from as many
        characters as it had returned."""
        with self._cond:
            done = sum(len(piece) for piece in self._pieces[: self._read])
            self._pieces, self._read = [text[:done], text[done:]], 1

    def _joined(self) -> str:
        """The whole text (the caller holds the lock). The pieces are joined into at most two, the part
        ``new_text`` has returned and the part it has not, so reading it again costs nothing more."""
        pieces, read = self._pieces, self._read
        if read == len(pieces) and read > 1:
            self._pieces, self._read = ["".join(pieces)], 1
        elif read < len(pieces):
            self._pieces = ["".join(pieces[:read]), "".join(pieces[read:])]
            self._read = 1
        return "".join(self._pieces)

    def _finish(self, reason: FinishReason, error: Optional[str] = None) -> None:
        with self._cond:
            self._finished = True
            self.finish_reason = reason
            self.error = error
            self._cond.notify_all()
        if self.on_update is not None:
            self._notify()

    def _notify(self) -> None:
        """Call ``on_update`` on the step loop's thread. A callback that raises is the caller's bug, not
        the engine's: like an asyncio callback it is logged, and it is detached (a callback that fails on
        every token would flood the log) with the reason in ``callback_error``; the request and every
        other request carry on. KeyboardInterrupt and SystemExit go through (the step fails safely)."""
        callback = self.on_update
        try:
            callback(self)
        except Exception as e:
            self.on_update = None
            self.callback_error = f"{type(e).__name__}: {e}"
            log.exception("the on_update callback of request %r raised; it is detached", self.request_id)

    # --- caller side -------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def token_ids(self) -> list[int]:
        with self._cond:
            return list(self._token_ids)

    @property
    def num_tokens(self) -> int:
        """How many tokens it has generated so far (``len(token_ids)`` without the copy)."""
        return len(self._token_ids)

    @property
    def text(self) -> str:
        with self._cond:
            return self._joined()

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """Each generated token's log-probability and alternatives (``SamplingParams.logprobs``)."""
        with self._cond:
            return list(self._logprobs)

    @property
    def prompt_logprobs(self) -> list[TokenLogprob]:
        """The prompt's tokens after the first, each with its log-probability given the tokens before it
        (``SamplingParams.prompt_logprobs``); complete once the first token is out."""
        with self._cond:
            return list(self._prompt_logprobs)

    def new_logprobs(self) -> list[TokenLogprob]:
        """Generated tokens' log-probabilities since the previous call (for streams, like ``new_text``)."""
        with self._cond:
            out = self._logprobs[self._logprobs_read :]
            self._logprobs_read = len(self._logprobs)
            return out

    def new_text(self) -> str:
        """Text produced since the previous call (thread-safe; for streaming UIs): the pieces pushed
        since, so reading a long stream as it grows costs what it adds, not its length."""
        with self._cond:
            delta = "".join(self._pieces[self._read :])
            self._read = len(self._pieces)
            return delta

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        """Counts a thread waiting on ``_cond`` (the caller holds the lock), so ``_push`` notifies."""
        self._waiters += 1
        try:
            yield
        finally:
            self._waiters -= 1

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until finished. Only useful when the engine runs in its background thread. ``timeout``
        None or ``inf`` waits forever; NaN is a ValueError (``engine/arguments.py``).

        From an ``on_update`` callback it is an EngineError, even for a finished handle: the callback
        runs inside a step, and only that step's thread could finish the request (a deadlock, or the
        whole timeout lost, depending on timing otherwise)."""
        timeout = wait_timeout(timeout, "RequestHandle.wait")
        self._owner.refuse_inside_step("RequestHandle.wait()")
        with self._cond, self._waiting():
            return self._cond.wait_for(lambda: self._finished, timeout)

    def stream(self) -> Iterator[str]:
        """Yield text deltas until the request finishes, driving the engine if nobody else does.

        Leaving the loop early (``break``, an exception, the generator closed or collected) cancels the
        request, as an abandoned stream does in vLLM: nobody reads its tokens any more, and it would
        otherwise hold its KV pages and a running slot until it ran to its length. From an ``on_update``
        callback it is an EngineError, as ``wait`` is (the request is left running)."""
        try:
            while True:
                self._owner.refuse_inside_step("RequestHandle.stream()")
                if not self._owner.background_running:
                    if not self._finished:
                        self._owner.step()
                else:
                    with self._cond, self._waiting():
                        self._cond.wait(timeout=0.05)
                delta = self.new_text()
                if delta:
                    yield delta
                if self._finished:
                    rest = self.new_text()
                    if rest:
                        yield rest
                    return
        except GeneratorExit:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Cancel this request; a no-op once it has finished (its id may belong to a newer request by
        then, which this handle must not touch)."""
        if not self._finished:
            self._owner.cancel_handle(self)

    def result(self) -> dict:
        return {
            "id": self.request_id,
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason.value if self.finish_reason else None,
            **({"error": self.error} if self.error else {}),
        }


class RequestIds:
    """The ids of the requests in flight: the one home of the rule that two live requests cannot share one.

    Cancel goes by id, so a second request under a live id would make one of them uncancellable (or cancel
    the wrong one). The ids are claimed on the submitting thread, when ``Engine.submit`` returns, rather than
    when the step loop applies the submit: that way the answer is immediate, and an automatic id (``req-N``)
    skips one a caller chose, even one whose submit the loop has not reached yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._auto = itertools.count()

    def claim(self, wanted: Optional[str]) -> Optional[str]:
        """Claim ``wanted``, or with no id wanted (None or "") the next automatic one that is free;
        None when ``wanted`` belongs to a request in flight."""
        with self._lock:
            if wanted:
                if wanted in self._live:
                    return None
                rid = wanted
            else:
                rid = f"req-{next(self._auto)}"
                while rid in self._live:  # a caller named a live request like an automatic id
                    rid = f"req-{next(self._auto)}"
            self._live.add(rid)
            return rid

    def release(self, rid: str) -> None:
        """The request under ``rid`` has finished: the id is free again."""
        with self._lock:
            self._live.discard(rid)

    def __contains__(self, rid: object) -> bool:
        with self._lock:
            return rid in self._live
