"""A typed httpx client for the llama-server HTTP API.

Every call has a deadline of its own, ``timeout_s`` from its start, and a cap on its
answer, :data:`MAX_ANSWER_BYTES` (``harness/http_bounds.py``): httpx's timeout bounds
each wait on the network (connect, send, each read), and the body is read in chunks
against the deadline and the cap, so a server that answers a byte at a time or without
end cannot stretch a call or fill memory. Every failure is a :class:`ServerApiError`
that names the endpoint, the server's address and what went wrong.
"""

from __future__ import annotations

import base64
import functools
import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from harness.errors import ServerApiError
from harness.http_bounds import MIB, AnswerTooLarge, BoundExceeded, bounded_call

DEFAULT_TIMEOUT_S = 30.0
#: The longest answer read: /props carries the chat template, a completion with
#: ``n_probs`` its candidates; none comes near this, an endless stream passes it.
MAX_ANSWER_BYTES = 64 * MIB


@dataclass(frozen=True)
class Health:
    status_code: int
    status: str

    @property
    def ok(self) -> bool:
        return self.status_code == 200


@dataclass(frozen=True)
class Props:
    model_path: str
    total_slots: int
    n_ctx: int | None
    build_info: str
    raw: dict[str, Any]


@dataclass(frozen=True)
class Timings:
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float | None
    #: Present only when a drafter proposed tokens (server_slot_stats::to_json).
    draft_n: int | None
    draft_n_accepted: int | None


@dataclass(frozen=True)
class Completion:
    content: str
    tokens_predicted: int
    stop_type: str | None
    timings: Timings
    raw: dict[str, Any]


class ServerClient:
    """Talks to one running server. Use as a context manager or call :meth:`close`."""

    def __init__(self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 http: httpx.Client | None = None) -> None:
        """``http``: a connection pool to borrow (not closed here); default: a new one."""
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._owns_http = http is None
        self._http = http or httpx.Client(verify=_shared_ssl_context())

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def health(self) -> Health:
        response = self._request("GET", "/health", accept_status=(200, 503))
        body = _json_or_empty(response)
        error = body.get("error")
        status = body.get("status") or (error.get("message") if isinstance(error, dict) else "")
        return Health(status_code=response.status_code, status=str(status or ""))

    def props(self) -> Props:
        body = self._json("GET", "/props")
        settings = body.get("default_generation_settings") or {}
        n_ctx = settings.get("n_ctx")
        return Props(
            model_path=str(body.get("model_path", "")),
            total_slots=int(body.get("total_slots", 0)),
            n_ctx=int(n_ctx) if n_ctx is not None else None,
            build_info=str(body.get("build_info", "")),
            raw=body,
        )

    def slots(self) -> list[dict[str, Any]]:
        response = self._request("GET", "/slots")
        data = _decode(response, "/slots")
        if not isinstance(data, list):
            raise ServerApiError(f"/slots at {self.base_url} returned {type(data).__name__}, "
                                 "expected a list")
        return data

    def completion(self, prompt: str | list[int], n_predict: int = 16, temperature: float = 0.0,
                   **options: Any) -> Completion:
        payload = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature,
                   "cache_prompt": False, **options}
        body = self._json("POST", "/completion", json=payload)
        return _parse_completion(body, self.base_url)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """The server's own token ids for ``text`` (BOS included with ``add_special``)."""
        body = self._json("POST", "/tokenize", json={"content": text,
                                                     "add_special": add_special})
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            raise ServerApiError(f"/tokenize at {self.base_url} returned no list of token "
                                 f"ids: {str(body)[:300]}")
        return tokens

    def apply_template(self, messages: list[dict[str, str]]) -> str:
        """The prompt text the model's own chat template makes of ``messages``."""
        body = self._json("POST", "/apply-template", json={"messages": messages})
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ServerApiError(f"/apply-template at {self.base_url} returned no prompt: "
                                 f"{str(body)[:300]}")
        return prompt

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        """The raw answer of ``/v1/chat/completions`` (greedy unless ``options`` say); a
        message's content may be OpenAI's list of parts (``image_message``)."""
        payload = {"messages": messages, "temperature": 0.0, **options}
        return self._json("POST", "/v1/chat/completions", json=payload)

    def metrics(self) -> str:
        """Prometheus text from ``/metrics``; the server must run with ``--metrics``."""
        response = self._request("GET", "/metrics", accept_status=(200, 501))
        if response.status_code == 501:
            raise ServerApiError(f"/metrics is disabled on {self.base_url}: start the server "
                                 "with metrics enabled (LaunchSpec(metrics=True))")
        return response.text

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data = _decode(self._request(method, path, **kwargs), path)
        if not isinstance(data, dict):
            raise ServerApiError(f"{path} at {self.base_url} returned {type(data).__name__}, "
                                 "expected an object")
        return data

    def _request(self, method: str, path: str, accept_status: tuple[int, ...] = (200,),
                 **kwargs: Any) -> httpx.Response:
        where = f"{method} {self.base_url}{path}"
        try:
            response = bounded_call(self._http, method, f"{self.base_url}{path}",
                                    timeout_s=self.timeout_s, max_bytes=MAX_ANSWER_BYTES,
                                    **kwargs)
        except AnswerTooLarge as exc:
            raise ServerApiError(f"{where} {exc.what}; is this a llama-server?") from exc
        except BoundExceeded as exc:
            raise ServerApiError(f"{where} {exc.what}: the server answers, but too "
                                 "slowly") from exc
        except httpx.TimeoutException as exc:
            raise ServerApiError(f"{where} timed out after {self.timeout_s:g}s; the "
                                 "server is alive but busy or hung") from exc
        except httpx.TransportError as exc:
            raise ServerApiError(f"{where} failed: {exc!r}; is the server still running?") from exc
        if response.status_code not in accept_status:
            raise ServerApiError(f"{where} answered HTTP {response.status_code}: "
                                 f"{response.text[:500]}", response.status_code)
        return response


@functools.cache
def shared_pool() -> httpx.Client:
    """One keep-alive pool for short-lived clients (readiness polls one per check)."""
    return httpx.Client(verify=_shared_ssl_context())


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    # Building a context loads the CA bundle (~40 ms measured); readiness makes a client
    # per poll, so every client shares one context instead of paying that each time.
    return ssl.create_default_context()


def _decode(response: httpx.Response, path: str) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise ServerApiError(f"{path} returned a body that is not JSON: "
                             f"{response.text[:200]!r}") from exc


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _parse_completion(body: dict[str, Any], base_url: str) -> Completion:
    raw_timings = body.get("timings")
    if not isinstance(raw_timings, dict):
        raise ServerApiError(f"/completion at {base_url} returned no timings: {str(body)[:300]}")
    timings: dict[str, Any] = raw_timings

    def optional_int(key: str) -> int | None:
        value = timings.get(key)
        return int(value) if value is not None else None

    tokens_predicted = body.get("tokens_predicted", timings.get("predicted_n", 0))

    per_second = timings.get("predicted_per_second")
    return Completion(
        content=str(body.get("content", "")),
        tokens_predicted=int(tokens_predicted),
        stop_type=body.get("stop_type"),
        timings=Timings(
            prompt_n=int(timings.get("prompt_n", 0)),
            prompt_ms=float(timings.get("prompt_ms", 0.0)),
            predicted_n=int(timings.get("predicted_n", 0)),
            predicted_ms=float(timings.get("predicted_ms", 0.0)),
            predicted_per_second=float(per_second) if per_second is not None else None,
            draft_n=optional_int("draft_n"),
            draft_n_accepted=optional_int("draft_n_accepted"),
        ),
        raw=body,
    )


def image_message(text: str, png: bytes) -> dict[str, Any]:
    """A user message of ``text`` and a PNG image, as OpenAI's chat API (and llama-server's
    ``/v1/chat/completions`` with a ``--mmproj``) takes one: a data URL in an image part."""
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": url}}]}
