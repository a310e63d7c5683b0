"""The OpenAI-compatible HTTP API over one engine (FastAPI): GET /v1/models, POST
/v1/chat/completions and /v1/completions, whole or streamed as server-sent events with one chunk
per engine step.

Our extension, which a plain OpenAI client ignores: each choice carries `provenance` (output.py),
and the last chunk (or the whole response) `metrics.speculative_decoding` in vLLM's names.
Requests take turns at the engine, first come first served; a full queue answers 429, models not
loaded yet 503. A client that leaves stops its answer at the next step.
"""
from __future__ import annotations

import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..chat.prompt import chat_prompt_ids
from ..engine.api import (GenerationOptions, PromptTooLongError, QueueFull, SpeculativeEngine, Turns, in_one_line,
                          in_thread, steps_of)
from .output import RequestOutput
from .requests import ApiError, CompletionRequest, parse

MAX_BODY_BYTES = 4 * 2**20  # a long document pasted into a prompt fits; a runaway upload does not


@dataclass
class ServerState:
    """What the API serves: the engine once loaded (None before), its model's name, the
    generation settings requests start from (speculation, k), and the key clients must send.
    turns: shared with whoever else uses the engine (the window's chat); make_room: awaited before
    a request's turn starts (the window stops reading ahead)."""

    engine: Callable[[], SpeculativeEngine | None]
    model_name: str
    defaults: GenerationOptions | Callable[[], GenerationOptions]  # a callable: the window's controls as they are
    api_key: str | None = None
    turns: Turns = field(default_factory=Turns)
    make_room: Callable[[], Awaitable[None]] | None = None
    requests_served: int = 0


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="SpecChat", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.turns = state.turns

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.middleware("http")
    async def authorise(request: Request, call_next):
        if state.api_key is not None:
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), state.api_key.encode()):
                return ApiError(401, "a missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                                "authentication_error", code="invalid_api_key").response()
        return await call_next(request)

    @app.get("/v1/models")
    async def models() -> dict:
        engine = state.engine()
        context = {"max_model_len": engine.target.context_length} if engine is not None else {}
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "specchat"} | context]}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        """vLLM's: a text's token ids under the model's tokenizer (a client checks that its own agrees)."""
        body = await _json_body(request)
        engine = _loaded_engine()
        text = body.get("prompt")
        if not isinstance(text, str):
            raise ApiError(400, "prompt: a text is required", param="prompt")
        tokens = await in_thread("tokenize", lambda: engine.target.tokenizer(
            text, add_special_tokens=bool(body.get("add_special_tokens", True))).input_ids)
        return {"count": len(tokens), "max_model_len": engine.target.context_length, "tokens": tokens}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(request, chat=False)

    async def _complete(request: Request, chat: bool):
        body = await _json_body(request)
        engine = _loaded_engine()
        asked = parse(body, chat, state.defaults() if callable(state.defaults) else state.defaults)
        tokenizer = engine.target.tokenizer

        def prompt() -> list[int]:
            if chat:
                return chat_prompt_ids(tokenizer, asked.messages)
            return asked.prompt_ids if asked.prompt_ids is not None else \
                tokenizer(asked.prompt, add_special_tokens=False).input_ids

        try:  # off the loop: a long document takes a moment to tokenize, and the window shares this loop
            prompt_ids = await in_thread("tokenize", prompt)
        except Exception as error:  # the model's chat template refuses these messages (its own rules)
            raise ApiError(400, f"the model's chat template refused the messages: {in_one_line(error)}",
                           param="messages") from None
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        vocabulary = engine.target.model.config.vocab_size
        if not all(0 <= token < vocabulary for token in prompt_ids):
            raise ApiError(400, f"a token id outside the model's vocabulary (0 to {vocabulary - 1})", param="prompt")
        context = engine.target.context_length
        if len(prompt_ids) >= context:
            raise ApiError(400, f"the prompt is {len(prompt_ids):,} tokens; the model's context holds {context:,}",
                           param="messages" if chat else "prompt", code="context_length_exceeded")
        options = replace(asked.options, max_new_tokens=min(asked.options.max_new_tokens, context - len(prompt_ids)))
        answer = Answer(engine, state, asked, prompt_ids, options, chat)
        if asked.stream:
            return StreamingResponse(answer.events(request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return JSONResponse(await answer.whole(request))

    def _loaded_engine() -> SpeculativeEngine:
        engine = state.engine()
        if engine is None:
            raise ApiError(503, "the models are still loading; try again shortly", "server_error",
                           code="model_not_ready")
        return engine

    return app


async def _json_body(request: Request) -> dict:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB", code="body_too_large")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB", code="body_too_large")
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise ApiError(400, f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


class Answer:
    """One request's turn at the engine, its steps turned into the API's chunks."""

    def __init__(self, engine: SpeculativeEngine, state: ServerState, asked: CompletionRequest, prompt_ids: list[int],
                 options: GenerationOptions, chat: bool) -> None:
        self.engine, self.state, self.asked, self.prompt_ids, self.options = engine, state, asked, prompt_ids, options
        self.turns, self.chat, self.model = state.turns, chat, state.model_name
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.output = RequestOutput(engine.target.tokenizer, asked.stop)
        self._reserved = False
        try:
            self.turns.reserve()  # 429 now, before a stream starts
        except QueueFull as full:
            raise ApiError(429, f"{full}; try again shortly", "rate_limit_error", code="queue_full") from None
        self._reserved = True

    def __del__(self) -> None:
        if self._reserved:  # a stream its client left before it began: its place goes back
            self.turns.give_back()

    async def _steps(self, request: Request) -> AsyncIterator:
        """What each step that emitted tokens lets out, until the answer ends. The turn passes on
        when the engine's thread ends, also when the client left and this coroutine was cancelled."""
        self._reserved = False
        self.state.requests_served += 1
        await self.turns.take()
        cancel = threading.Event()
        try:
            if self.state.make_room is not None:
                await self.state.make_room()
            steps = steps_of("serve", lambda: self.engine.generate(self.prompt_ids, self.options, cancel), cancel,
                             on_end=self.turns.release)
        except BaseException:
            self.turns.release()
            raise
        try:
            async for step in steps:
                if not step.tokens and step.finish is None:
                    continue  # a long prompt's reading
                yield self.output.add(step)
                if self.output.done or await request.is_disconnected():
                    break
        finally:
            cancel.set()  # a no-op after the end; else the engine stops at its next step

    async def whole(self, request: Request) -> dict:
        text, provenance = "", []
        try:
            async for released in self._steps(request):
                text += released.text
                provenance += released.provenance
        except PromptTooLongError as error:  # the caches would outgrow the memory left
            raise ApiError(400, str(error), code="context_length_exceeded") from None
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat else
                  {"index": 0, "text": text, "logprobs": None})
        choice |= {"finish_reason": self.output.finish or "stop", "provenance": provenance}
        if self.asked.return_token_ids:
            choice |= {"token_ids": [token["id"] for token in provenance], "prompt_token_ids": self.prompt_ids}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": self.output.usage(len(self.prompt_ids)), "metrics": self.output.metrics()}

    async def events(self, request: Request) -> AsyncIterator[str]:
        if self.chat:
            yield self._event({"delta": {"role": "assistant", "content": ""}, "finish_reason": None, "provenance": []})
        try:
            async for released in self._steps(request):
                yield self._event(self._piece(released.text) | {"finish_reason": None,
                                                                "provenance": released.provenance}
                                  | self._token_ids(released.provenance))
        except PromptTooLongError as error:
            yield f"data: {json.dumps({'error': ApiError(400, str(error)).body()['error']})}\n\n"
            return
        yield self._event(self._piece("") | {"finish_reason": self.output.finish or "stop", "provenance": []}
                          | self._token_ids([]), metrics=self.output.metrics())
        if self.asked.include_usage:  # the metrics again, where vLLM sends them
            yield f"data: {json.dumps(self._chunk([]) | {'usage': self.output.usage(len(self.prompt_ids)), 'metrics': self.output.metrics()})}\n\n"
        yield "data: [DONE]\n\n"

    def _token_ids(self, provenance: list[dict]) -> dict:
        """vLLM's return_token_ids: the chunk's token ids."""
        return {"token_ids": [token["id"] for token in provenance]} if self.asked.return_token_ids else {}

    def _piece(self, text: str) -> dict:
        return {"delta": {"content": text}} if self.chat else {"text": text, "logprobs": None}

    def _chunk(self, choices: list[dict]) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}

    def _event(self, choice: dict, metrics: dict | None = None) -> str:
        chunk = self._chunk([{"index": 0} | choice])
        if metrics is not None:
            chunk["metrics"] = metrics
        return f"data: {json.dumps(chunk)}\n\n"
