"""Serving a headless workload: each prompt line (or synthetic request) submitted, the engine stepped
until all have finished, and each result handed on (to --output) the moment its request finishes.

The step loop only notes which requests finished (their ``on_update``); the results are handed on between
steps, so a slow disk never runs inside a step, and a run killed between two steps has written every
result that had finished.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .prompts_file import PromptLine


@dataclass
class Served:
    """What a headless run served, in input order, and why it stopped early if it did."""

    results: list[dict]
    failure: Optional[str] = None  # the engine cannot go on (e.g. a tensor-parallel rank died)
    interrupted: Optional[KeyboardInterrupt] = None  # results then holds only what had finished


def sampling(args: Any, line: Optional[PromptLine]) -> Any:
    from graphtop.engine.sampling_params import SamplingParams

    base = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if line is not None:
        base.update(line.sampling)  # checked by read_prompts: merging valid values cannot fail
    return SamplingParams(**base)


def _result(slot: Any) -> dict:
    return slot if isinstance(slot, dict) else slot.result()


class _Finished:
    """Hands each result to ``sink`` (--output) once its request has finished, between steps: the step
    loop only notes which ones finished (``on_update``), the writing happens outside it."""

    def __init__(self, slots: list[Any], sink: Optional[Callable[[dict], None]]):
        self.slots, self.sink = slots, sink
        self.ready: deque[int] = deque()
        self.pending = 0  # watched, not finished yet

    def watch(self, slot: Any) -> None:
        index = len(self.slots)
        self.slots.append(slot)
        if isinstance(slot, dict) or slot.finished:
            self.ready.append(index)
            return
        self.pending += 1

        def on_update(handle: Any, index: int = index) -> None:
            if handle.finished:
                self.pending -= 1
                self.ready.append(index)

        slot.on_update = on_update

    def flush(self, keep: Callable[[Any], bool] = lambda slot: True) -> None:
        while self.ready:
            slot = self.slots[self.ready.popleft()]
            if self.sink is not None and keep(slot):
                self.sink(_result(slot))


def serve(
    engine: Any, args: Any, lines: list[PromptLine], synthetic: Any, sink: Optional[Callable[[dict], None]] = None
) -> Served:
    """Results in input order, each also handed to ``sink`` as it finishes, and what stopped the engine
    early, if anything did."""
    from graphtop.engine.engine import TensorParallelError

    done = _Finished([], sink)  # its slots: dict (already-failed line) or RequestHandle, in input order
    try:
        _submit_and_run(engine, args, lines, synthetic, done)
    except TensorParallelError as e:
        engine.close(str(e))  # every request still in flight finishes with the reason
        done.flush()
        return Served([_result(s) for s in done.slots], failure=str(e))
    except KeyboardInterrupt as e:  # before the engine closes, which finishes the rest as cancelled
        done.flush(_had_finished)
        return Served([_result(s) for s in done.slots if _had_finished(s)], interrupted=e)
    done.flush()
    return Served([_result(s) for s in done.slots])


def _had_finished(slot: Any) -> bool:
    """Done before the interrupt: a rejected line, or a request that ended on its own. A step the
    interrupt cut short has already finished its requests as cancelled (Engine.step's clean-up), and no
    headless request is cancelled otherwise."""
    from graphtop.engine.request import FinishReason

    return isinstance(slot, dict) or (slot.finished and slot.finish_reason is not FinishReason.CANCELLED)


def has_chat_template(engine: Any) -> bool:
    from graphtop.engine.prompts import has_chat_template as tokenizer_has_one

    return tokenizer_has_one(engine.tokenizer)


def _rejected(pl: PromptLine, error: str) -> dict:
    return {
        "id": pl.request_id,
        "prompt": pl.prompt if pl.error is None else None,
        "text": "",
        "token_ids": [],
        "finish_reason": "rejected",
        "error": error,
    }


def _submit_line(engine: Any, args: Any, pl: PromptLine) -> Any:
    """A RequestHandle for the line, or the result of a line that cannot be submitted."""
    if pl.error:
        return _rejected(pl, pl.error)
    prompt, chat = pl.submitted(bool(getattr(args, "chat", False)))
    if chat and isinstance(prompt, str) and not has_chat_template(engine):
        return _rejected(pl, f'line {pl.line}: "chat": true, but the model has no chat template')
    return engine.submit(prompt, sampling(args, pl), chat=chat, request_id=pl.request_id)


def _submit_and_run(engine: Any, args: Any, lines: list[PromptLine], synthetic: Any, done: _Finished) -> None:
    from .workload import sampling_params

    if synthetic is None:
        for pl in lines:
            done.watch(_submit_line(engine, args, pl))
        done.flush()
        while done.pending and engine.step():
            done.flush()
    else:
        pending = list(synthetic)
        start = time.perf_counter()
        while pending or engine.scheduler.has_work():
            now = time.perf_counter() - start
            while pending and pending[0].arrival_s <= now:
                r = pending.pop(0)
                params = sampling_params(r, args.seed, args.temperature, args.top_p, args.top_k)
                done.watch(engine.submit(r.prompt_token_ids, params, request_id=f"syn-{r.index}"))
            stepped = engine.step()
            done.flush()
            if not stepped and pending:
                time.sleep(min(0.01, max(0.0, pending[0].arrival_s - (time.perf_counter() - start))))
