"""How one step's prefill token budget is shared among the requests that want prefill.

Why not first come, first served alone: chunked prefill with the whole budget going to the oldest request
makes every request behind a long prompt wait for all of its chunks (on CPU, an 8k-token prompt held a
5-token request for two minutes). Why not an equal split: for prompts of similar length it delays every
one of them to the end (processor sharing: first come, first served gives the least mean time to first
token there), and a step of many thin slices admits many requests at once, each holding pages.

The rule, over the candidates in arrival order (the first is the oldest):

1. The oldest takes what it needs, up to half the budget (rounded up). It always advances, so no request
   waits forever: each becomes the oldest in turn.
2. The others with less prefill left than the oldest, shortest first (ties in arrival order), take what
   they need from what is left. A short prompt behind a long one is prefilled in the next step, whole.
3. Whatever is still left goes in arrival order (the oldest first), so a step stays as full as before: a
   long prompt next to a short one takes the rest of the budget, and prompts of one length are served
   first come, first served, exactly as without the share.
"""

from __future__ import annotations

from collections.abc import Sequence


def share_prefill_budget(wants: Sequence[int], budget: int) -> list[int]:
    """Tokens for each candidate this step (same order as ``wants``; each at most its want, their sum
    at most ``budget``). ``wants``: each candidate's remaining prefill tokens, oldest first."""
    if budget < 0 or any(w < 0 for w in wants):
        raise ValueError(f"budget and wants must be >= 0, got {budget} and {list(wants)}")
    give = [0] * len(wants)
    if not wants:
        return give
    left = budget
    give[0] = min(wants[0], -(-budget // 2) if len(wants) > 1 else budget)
    left -= give[0]
    for i in sorted((j for j in range(1, len(wants)) if wants[j] < wants[0]), key=lambda j: wants[j]):
        if left == 0:
            break
        give[i] = min(wants[i], left)
        left -= give[i]
    for i, want in enumerate(wants):
        if left == 0:
            break
        more = min(want - give[i], left)
        give[i] += more
        left -= more
    return give
