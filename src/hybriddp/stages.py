"""Named, timed stages of a long computation, with a callback for progress displays."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Stages:
    """Records the wall time of each named stage; calls ``on_stage(name)`` when one starts."""

    on_stage: Callable[[str], None] | None = None
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
