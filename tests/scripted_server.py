"""A scripted stand-in for a running server's outside, as the readiness wait reads it.

Only the harness's own control flow is driven with it (the order of conditions, crash
detection, timeouts); the real server is exercised in test_runner.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ScriptedServer:
    exit_after_polls: int | None = None
    polls: int = 0
    lines: list[str] = field(default_factory=lambda: [f"line {i}" for i in range(100)])
    url: str = "http://127.0.0.1:1"

    @property
    def argv(self) -> list[str]:
        return ["llama-server", "-m", "model.gguf"]

    @property
    def log_path(self) -> Path:
        return Path("/logs/server.log")

    @property
    def base_url(self) -> str:
        return self.url

    def exit_code(self) -> int | None:
        self.polls += 1
        if self.exit_after_polls is not None and self.polls > self.exit_after_polls:
            return 1
        return None

    def host_pid(self) -> int | None:
        return None

    def log_tail(self, lines: int = 40) -> list[str]:
        return self.lines[-lines:]

    def log_text(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> int | None:
        return None

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
