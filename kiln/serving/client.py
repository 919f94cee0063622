"""A small client for a kiln endpoint (any OpenAI-compatible /v1/completions server works).

client = KilnClient("http://127.0.0.1:8000", api_key="s3cret")
client.health()                                   # True when /v2/health/ready says so
client.complete("Once upon a time", max_tokens=32, temperature=0)
for delta in client.stream("Once upon a time"): print(delta, end="")
client.chat([{"role": "user", "content": "Hi"}], max_tokens=32)   # the model's chat template

Retry policy (completions and chat are idempotent: nothing on the server changes): a request that
fails to connect, or is answered 502/503/504 (a replica restarting, a proxy without a healthy
replica, a Triton server being restarted: 503 with Retry-After 1 s while it is down) or a 500
that is not the endpoint's own JSON error (Ray Serve's proxy answers a plain 500 when the replica
died mid-request: the request never completed), is retried for up to `retry_for` seconds
(default 30 s: a restarted replica or tritonserver is back well within it) and at most `retries`
times when given, waiting `Retry-After` when the server sends one (at most 5 s) or 0.2 s
doubling. A streamed request is retried the same way until its stream starts (a Triton server
down before the first token is a 503), not after. `client.retried` counts retries.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any, Self

import httpx

from kiln.platform.errors import KilnError


class EndpointError(KilnError):
    """The endpoint answered with an error (the message is the server's)."""


RETRY_STATUSES = frozenset({502, 503, 504})


class KilnClient:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 120.0,
        retries: int | None = None,
        retry_for: float = 30.0,
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.model = model
        self.retries = retries
        self.retry_for = retry_for
        self.retried = 0
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _post(self, path: str, body: dict[str, Any], stream: bool = False) -> httpx.Response:
        """POST under the retry policy (module docstring). With `stream`, the response's body
        is not read unless it is an error (the caller closes the response)."""
        deadline = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            out_of_tries = self.retries is not None and attempt >= self.retries
            last = out_of_tries or time.monotonic() >= deadline
            try:
                r = self._http.send(
                    self._http.build_request("POST", path, json=body), stream=stream
                )
                if r.status_code >= 400:
                    r.read()
            except httpx.TransportError as e:
                if last:
                    raise EndpointError(f"{self.url}: {e}") from None
                retry_after = None
            except httpx.HTTPError as e:
                raise EndpointError(f"{self.url}: {e}") from None
            else:
                if not _transient(r) or last:
                    return r
                r.close()
                retry_after = r.headers.get("retry-after")
            # never sleep past the deadline: the last try happens at it
            time.sleep(min(_backoff(attempt, retry_after), max(deadline - time.monotonic(), 0)))
            self.retried += 1
            attempt += 1

    def _body(self, prompt: str, fields: dict[str, Any]) -> dict[str, Any]:
        body = {"prompt": prompt, **{k: v for k, v in fields.items() if v is not None}}
        if self.model:
            body["model"] = self.model
        return body

    @staticmethod
    def _raise_for(r: httpx.Response) -> None:
        if r.status_code < 400:
            return
        try:
            err = r.json()["error"]
            message = err["message"] if isinstance(err, dict) else str(err)
        except (ValueError, KeyError, TypeError):
            message = r.text[:200]
        raise EndpointError(f"{r.request.url}: HTTP {r.status_code}: {message}")

    def complete(self, prompt: str, **fields: Any) -> str:
        """The completion text. Fields as OpenAI's (max_tokens, temperature, top_p, stop, seed,
        top_k, presence_penalty, ...)."""
        r = self._post("/v1/completions", self._body(prompt, fields))
        self._raise_for(r)
        return r.json()["choices"][0]["text"]

    def chat(self, messages: list[dict[str, str]], **fields: Any) -> str:
        """The assistant's reply to `messages` ([{role, content}]) via /v1/chat/completions."""
        body = {"messages": messages, **{k: v for k, v in fields.items() if v is not None}}
        if self.model:
            body["model"] = self.model
        r = self._post("/v1/chat/completions", body)
        self._raise_for(r)
        return r.json()["choices"][0]["message"]["content"]

    def stream(self, prompt: str, **fields: Any) -> Iterator[str]:
        """Text deltas as the server sends them (server-sent events). Retried under the policy
        until the stream starts; a failure after that raises EndpointError."""
        body = self._body(prompt, {**fields, "stream": True})
        for event in self._events("/v1/completions", body):
            if text := event["choices"][0]["text"]:
                yield text

    def stream_chat(self, messages: list[dict[str, str]], **fields: Any) -> Iterator[str]:
        """The assistant's reply to `messages` as deltas, as `stream` gives a completion's."""
        body = {"messages": messages, "stream": True}
        body |= {k: v for k, v in fields.items() if v is not None}
        if self.model:
            body["model"] = self.model
        for event in self._events("/v1/chat/completions", body):
            choices = event.get("choices") or [{}]
            if text := (choices[0].get("delta") or {}).get("content"):
                yield text

    def _events(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The JSON events of a server-sent-events response, up to `[DONE]`."""
        try:
            r = self._post(path, body, stream=True)
            with contextlib.closing(r):
                self._raise_for(r)
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:  # the server failed mid-stream and said so
                        raise EndpointError(f"{self.url}: {event['error']['message']}")
                    yield event
        except httpx.HTTPError as e:
            raise EndpointError(f"{self.url}: {e}") from None

    def model_card(self) -> dict[str, Any]:
        """The served model's /v1/models entry (id, max_model_len, has_chat_template)."""
        try:
            r = self._http.get("/v1/models")
        except httpx.HTTPError as e:
            raise EndpointError(f"{self.url}: {e}") from None
        self._raise_for(r)
        cards = r.json()["data"]
        return next((c for c in cards if c["id"] == self.model), cards[0])

    def models(self) -> list[str]:
        r = self._http.get("/v1/models")
        self._raise_for(r)
        return [m["id"] for m in r.json()["data"]]

    def health(self) -> bool:
        try:
            return self._http.get("/v2/health/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _transient(r: httpx.Response) -> bool:
    """An answer from the infrastructure, not the endpoint's verdict on the request."""
    if r.status_code in RETRY_STATUSES:
        return True
    if r.status_code != 500:
        return False
    try:
        return "error" not in r.json()  # kiln's own 500s are JSON errors: not retried
    except ValueError:
        return True


def _backoff(attempt: int, retry_after: str | None) -> float:
    """Seconds before retry `attempt + 1`: the server's Retry-After (capped), else 0.2 s x 2^n."""
    if retry_after is not None:
        try:
            return min(max(float(retry_after), 0.0), 5.0)
        except ValueError:
            pass
    return min(0.2 * 2**attempt, 5.0)
