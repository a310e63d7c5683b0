"""An OpenAI-compatible server's HTTP API as the remote target uses it (httpx): the models it
serves, its tokenizer's ids for a text, and a completion streamed from token ids.

Every failure becomes a ServerError whose message says what is wrong in the user's words: a
server that is down, a wrong URL, a refused key, a model it does not serve, a connection that
drops mid-answer.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from ..errors import ModelError, in_one_line

CONNECT_SECONDS = 10.0
# A long prompt on a busy server can take minutes before its first token: reads wait, and Stop
# (which closes the connection) is what ends a wait early.
READ_SECONDS = 600.0


class ServerError(ModelError):
    """The server cannot be used or failed mid-request; the message is for the user."""


@dataclass(frozen=True)
class ServedModel:
    id: str
    max_model_len: int | None  # the context it serves (vLLM and SpecChat say; None: the server does not)


def api_root(url: str) -> str:
    """The server's root from what a user types: 'localhost:8000', 'http://host:8000/v1/'."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/v1")


class ServerClient:
    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.root = api_root(url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def models(self) -> list[ServedModel]:
        body = self._request("GET", "/v1/models")
        try:
            return [ServedModel(str(entry["id"]), entry.get("max_model_len")) for entry in body["data"]]
        except (KeyError, TypeError):
            raise ServerError(f"{self.root} does not answer /v1/models as an OpenAI-compatible server does") from None

    def tokenize(self, model: str, text: str) -> list[int]:
        """The server's token ids for `text` (vLLM's and SpecChat's /tokenize), without special tokens."""
        body = self._request("POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list):
            raise ServerError(f"{self.root}/tokenize gave no token ids")
        return tokens

    def complete(self, body: dict) -> dict:
        """A whole (not streamed) completion."""
        return self._request("POST", "/v1/completions", {**body, "stream": False}, timeout=READ_SECONDS)

    async def stream(self, body: dict) -> AsyncIterator[dict]:
        """The chunks of a streamed completion, as they come. Leaving the iteration closes the
        connection, which aborts the request on the server (vLLM and SpecChat both do)."""
        timeout = httpx.Timeout(READ_SECONDS, connect=CONNECT_SECONDS)
        try:
            async with httpx.AsyncClient(timeout=timeout, headers=self.headers) as client:
                async with client.stream("POST", self.root + "/v1/completions", json={**body, "stream": True}) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise self._refusal(response, body.get("model"))
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        chunk = _json(data, self.root)
                        if "error" in chunk:
                            raise ServerError(f"the server failed mid-answer: {_message(chunk)}")
                        yield chunk
            raise ServerError(f"the server at {self.root} ended the answer without finishing it")
        except httpx.TransportError as error:
            raise self._unreachable(error, midway=True) from None

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = CONNECT_SECONDS) -> dict:
        try:
            response = httpx.request(method, self.root + path, json=body, headers=self.headers, timeout=timeout)
        except httpx.TransportError as error:
            raise self._unreachable(error) from None
        if response.status_code != 200:
            raise self._refusal(response, (body or {}).get("model"))
        return _json(response.text, self.root)

    def _unreachable(self, error: httpx.TransportError, midway: bool = False) -> ServerError:
        if isinstance(error, httpx.ConnectError):
            return ServerError(f"cannot reach a server at {self.root}: {in_one_line(error) or 'connection refused'} "
                               "(is it running, and is the address right?)")
        if isinstance(error, httpx.TimeoutException):
            return ServerError(f"the server at {self.root} did not answer in time")
        what = "closed the connection mid-answer" if midway else "dropped the connection"
        return ServerError(f"the server at {self.root} {what} ({type(error).__name__})")

    def _refusal(self, response: httpx.Response, model: str | None) -> ServerError:
        status, said = response.status_code, _message(_json_or_none(response.text)) or response.reason_phrase
        if status == 401:
            return ServerError(f"the server at {self.root} refused the API key (set SPECCHAT_SERVER_KEY): {said}")
        if status == 404 and model and "model" in said.lower():
            return ServerError(f"the server at {self.root} serves no model named '{model}': {said}")
        if status == 404:
            return ServerError(f"{response.request.url} is not there (HTTP 404): is {self.root} an OpenAI-compatible "
                               "server such as vLLM?")
        return ServerError(f"the server at {self.root} answered HTTP {status}: {said}")


def _json(text: str, root: str) -> dict:
    parsed = _json_or_none(text)
    if not isinstance(parsed, dict):
        raise ServerError(f"{root} answered with something other than JSON: {in_one_line(text, 120)}")
    return parsed


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _message(body) -> str:
    """The error message in an OpenAI-shaped error body ({"error": {"message"}}; vLLM also {"message"})."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error", body)
    message = error.get("message") if isinstance(error, dict) else error
    return in_one_line(str(message)) if message else ""
