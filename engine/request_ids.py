"""The ids of the requests in flight: the one home of the rule that two live requests cannot share one.

Cancel goes by id, so a second request under a live id would make one of them uncancellable (or cancel
the wrong one). The ids are claimed on the submitting thread, when ``Engine.submit`` returns, rather than
when the step loop applies the submit: that way the answer is immediate, and an automatic id (``req-N``)
skips one a caller chose, even one whose submit the loop has not reached yet.
"""
from __future__ import annotations

import itertools
import threading
from typing import Optional


class RequestIds:
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
