"""Named, timed stages of a long computation, and the callback types of progress displays."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

ProgressFn = Callable[[int, int], None]
"""``progress(done, total)``: how much of a known amount of work is done (bytes read, records written,
runs finished, …); the callee only displays it."""

StatusFn = Callable[[str], None]
"""``status(line)``: a short line saying what a computation starts doing (a stage's name, a step)."""


@dataclass
class Stages:
    """Records the wall time of each named stage; calls ``on_stage(name)`` when one starts."""

    on_stage: StatusFn | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.on_stage:
            self.on_stage(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
