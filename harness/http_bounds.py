"""One HTTP call held to a deadline for the whole call and a cap on its answer's size.

httpx's ``timeout`` bounds each wait on the network (connect, one send, one read), not
a call: a peer that answers a byte at a time keeps a call going as long as it likes, and
one that streams without end fills memory with what it sends. :func:`bounded_call`
streams the answer and reads it against a deadline counted from the call's start and a
cap on its bytes (as sent and as decoded: a small compressed answer can unpack to a
large one), so an endless answer ends at the cap and a slow one at the deadline, give
or take the one network wait under way.

:func:`bounded_call_in_time` makes the deadline exact: the call runs in a worker
thread and the caller stops waiting at the deadline, whatever the call is doing then
(connecting, sending, waiting for the headers). The llama-server client uses the first:
a thread per request would sit inside the requests it times. The results-service
calls use the second.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

MIB = 1 << 20


class BoundExceeded(Exception):
    """An answer passed its deadline or its size cap.

    ``what`` says which, worded to follow the call's name ("did not finish within
    30s"); each caller raises its own error with it. ``received``: bytes of the answer
    read before the call stopped.
    """

    def __init__(self, what: str, received: int) -> None:
        super().__init__(what)
        self.what = what
        self.received = received


class DeadlinePassed(BoundExceeded):
    """The call did not finish within its time."""


class AnswerTooLarge(BoundExceeded):
    """The answer was longer than the call's cap."""


@dataclass
class _Progress:
    """What a call in a worker thread has read so far, for the caller who gave up on it."""

    received: int = 0
    outcome: list[Any] = field(default_factory=list)


def size_words(n_bytes: int) -> str:
    """``n_bytes`` as people read a cap: "4 MiB", "64 KiB", "300 bytes"."""
    for unit, size in (("MiB", MIB), ("KiB", 1 << 10)):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size} {unit}"
    return f"{n_bytes} bytes"


def bounded_call(http: httpx.Client, method: str, url: str, *, timeout_s: float,
                 max_bytes: int, **kwargs: Any) -> httpx.Response:
    """The whole answer to ``method url``, read within ``timeout_s`` and ``max_bytes``.

    ``kwargs`` go to httpx (``params``, ``json``, ``content``, ``headers``). Raises
    :class:`DeadlinePassed` or :class:`AnswerTooLarge`, and httpx's own errors (a
    network wait longer than ``timeout_s`` is an ``httpx.TimeoutException``). The
    answer comes back decoded, without its ``Content-Encoding``.
    """
    return _call(http, method, url, timeout_s=timeout_s, max_bytes=max_bytes,
                 progress=_Progress(), kwargs=kwargs)


def _call(http: httpx.Client, method: str, url: str, *, timeout_s: float, max_bytes: int,
          progress: _Progress, kwargs: dict[str, Any]) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    body = bytearray()
    with http.stream(method, url, timeout=timeout_s, **kwargs) as streamed:
        for chunk in streamed.iter_bytes():
            body += chunk
            progress.received = len(body)
            if max(len(body), streamed.num_bytes_downloaded) > max_bytes:
                raise AnswerTooLarge(f"sent more than {size_words(max_bytes)}, the most "
                                     "this call reads", len(body))
            if time.monotonic() > deadline:
                raise _late(timeout_s, len(body))
        if time.monotonic() > deadline:  # the headers came late and the body was empty
            raise _late(timeout_s, len(body))
    # Already decoded: the new answer must not decode it a second time.
    headers = [(k, v) for k, v in streamed.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length")]
    return httpx.Response(streamed.status_code, headers=headers, content=bytes(body),
                          request=streamed.request)


def bounded_call_in_time(http: httpx.Client, method: str, url: str, *, timeout_s: float,
                         max_bytes: int, **kwargs: Any) -> httpx.Response:
    """:func:`bounded_call`, with the caller waiting ``timeout_s`` at the most.

    A call still running then is left to its thread, which its own deadline ends within
    one network wait; what it reads meanwhile stays under ``max_bytes``, and its
    outcome is dropped. The caller may close ``http`` meanwhile: that only ends the
    leftover call sooner.
    """
    progress = _Progress()

    def call() -> None:
        try:
            progress.outcome.append(_call(http, method, url, timeout_s=timeout_s,
                                          max_bytes=max_bytes, progress=progress,
                                          kwargs=kwargs))
        except BaseException as exc:  # the caller's thread raises it
            progress.outcome.append(exc)

    worker = threading.Thread(target=call, name=f"http {method} {url}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not progress.outcome:
        raise _late(timeout_s, progress.received)
    outcome = progress.outcome[0]
    if isinstance(outcome, BaseException):
        raise outcome
    assert isinstance(outcome, httpx.Response)
    return outcome


def _late(timeout_s: float, received: int) -> DeadlinePassed:
    so_far = f" ({received} bytes of the answer so far)" if received else " (no answer yet)"
    return DeadlinePassed(f"did not finish within {timeout_s:g}s{so_far}", received)
