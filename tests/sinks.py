"""Log sinks for tests: streams that misbehave the way real ones do."""

from __future__ import annotations

import io
import threading


class StalledSink(io.StringIO):
    """A text stream whose writes wait until ``go`` is set (a full pipe, a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.writer_threads: set[str] = set()

    def write(self, s: str) -> int:
        self.writer_threads.add(threading.current_thread().name)
        self.go.wait(30)  # bounded: a broken test fails instead of hanging
        return super().write(s)
