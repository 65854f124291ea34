"""Dropping clients that stop sending: uvicorn's HTTP/1.1 protocol with an idle timer.

uvicorn times out idle keep-alive connections, but not a request whose headers never
finish nor a body that stops arriving: each such connection holds a socket, and an
upload's a file handle and a temp file, for as long as the client likes. Forty of
them are a cheap way to take the service's file handles.

The timer restarts on every chunk received. When it fires while the client still owes
us bytes (the request's headers, or its body) the client gets a 408 and the
connection is closed; the handler waiting on the body then sees a disconnect and
cleans up as for any client that went away. A request already received whole is
never timed out here: that is the service working, not the client stalling. Nor is a
body we stopped reading ourselves (flow control pauses reading while the handler
catches up).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

def _timeout_response(waiting_for: str, idle_s: float) -> bytes:
    body = json.dumps({"error": f"no data arrived for {idle_s:g} s while the service "
                                f"waited for {waiting_for}; the connection is closed "
                                "(send the whole request without pausing)"}).encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


class IdleTimeoutProtocol(H11Protocol):
    """H11Protocol that closes a connection whose client stops sending mid-request."""

    #: Seconds without a byte before a client that owes data is dropped; set per
    #: server by :func:`idle_timeout_protocol`.
    idle_timeout_s: ClassVar[float] = 30.0

    _idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._idle_timer = self.loop.call_later(self.idle_timeout_s, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_timer = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self.flow.read_paused:
                self._arm()  # we stopped reading, not the client
                return
            waiting_for = "the rest of the request body"
        elif state is h11.IDLE:
            # Before a request, or between two on a kept-alive connection: nothing or
            # part of a request line and headers has arrived.
            waiting_for = "the request line and headers"
        else:
            return
        log.warning("dropping the connection from %s: no data for %g s while waiting "
                    "for %s", _peer(self.client), self.idle_timeout_s, waiting_for)
        # Written raw: h11 cannot frame a response to a request it has not seen whole.
        self.transport.write(_timeout_response(waiting_for, self.idle_timeout_s))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


def idle_timeout_protocol(idle_timeout_s: float) -> type[IdleTimeoutProtocol]:
    """The protocol class for uvicorn's ``http=`` with this timeout."""
    return type("IdleTimeoutProtocol", (IdleTimeoutProtocol,),
                {"idle_timeout_s": float(idle_timeout_s)})
