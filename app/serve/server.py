"""The OpenAI-compatible HTTP API over one engine (FastAPI): GET /v1/models and /health, POST
/v1/chat/completions, /v1/completions and /tokenize; answers whole or streamed as server-sent
events with one chunk per engine step.

Our extension, which a plain OpenAI client ignores: each choice carries `provenance` (output.py),
and the last chunk (or the whole response) `metrics.speculative_decoding` in vLLM's names.
Requests take turns at the engine, first come first served; a full queue answers 429, models not
loaded yet 503. Each request runs on the engine loaded when its turn comes (a switch of models
meanwhile is waited for). A client that leaves, streamed or not, waiting or answered, gives its
place back and stops its answer at the next step. Who may call is guard.py's business; every
failure is an OpenAI error object, and a stream that fails ends with one and then [DONE].
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..chat.prompt import chat_prompt_ids
from ..engine.api import (Engine, EngineBusyError, GenerationOptions, PromptTooLongError, QueueFull, Turns,
                          in_one_line, steps_of)
from .guard import Access, Guard
from .output import RequestOutput
from .requests import ApiError, Body, CompletionRequest, parse

MAX_BODY_BYTES = 4 * 2**20  # a long document pasted into a prompt fits; a runaway upload does not
# One thread tokenizes every request's prompt, off the loop the window shares: a burst of requests
# queues here instead of starting a thread each.
_TOKENIZING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-tokenize")


@dataclass
class ServerState:
    """What the API serves: the engine once loaded (None before and while models load), its
    model's name, the generation settings requests start from (speculation, k), and who may call.
    turns: shared with whoever else uses the engine (the window's chat, a load); make_room:
    awaited before a request's turn starts (the window stops reading ahead)."""

    engine: Callable[[], Engine | None]
    model_name: str
    defaults: GenerationOptions | Callable[[], GenerationOptions]  # a callable: the window's controls as they are
    access: Access = field(default_factory=Access)
    turns: Turns = field(default_factory=Turns)
    make_room: Callable[[], Awaitable[None]] | None = None
    requests_served: int = 0
    answers: set[Answer] = field(default_factory=set)  # those running or waiting: closing cancels them

    def cancel_all(self) -> None:
        """Every answer stops at its next step (the window closes)."""
        for answer in list(self.answers):
            answer.cancel.set()
            answer.left.set()


def create_app(state: ServerState) -> Guard:
    """The API behind its access checks (`state.access` is read at each request)."""
    app = FastAPI(title="SpecChat", docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return ApiError(error.status_code, str(error.detail), code="not_found" if error.status_code == 404 else None
                        ).response()

    @app.exception_handler(Exception)
    async def any_error(request: Request, error: Exception) -> JSONResponse:
        return error_of(error).response()

    @app.get("/health")
    async def health() -> Response:
        """200 when a request would be answered now, 503 while the models load (llama-server's, vLLM's)."""
        if state.engine() is None:
            return ApiError(503, "the models are loading", "server_error", code="model_not_ready").response()
        return JSONResponse({"status": "ok"})

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
        special = body.get("add_special_tokens", True) is not False
        tokens = await _tokenizing(lambda: engine.target.tokenizer(text, add_special_tokens=special).input_ids)
        return {"count": len(tokens), "max_model_len": engine.target.context_length, "tokens": tokens}

    # the bodies are read by hand (JSON only, size-limited) and checked by requests.Body: the
    # schema says so in /openapi.json, for clients and for the fuzz test
    body_schema = {"requestBody": {"required": True,
                                   "content": {"application/json": {"schema": Body.model_json_schema()}}}}

    @app.post("/v1/chat/completions", openapi_extra=body_schema)
    async def chat_completions(request: Request):
        return await _complete(request, chat=True)

    @app.post("/v1/completions", openapi_extra=body_schema)
    async def completions(request: Request):
        return await _complete(request, chat=False)

    async def _complete(request: Request, chat: bool):
        body = await _json_body(request)
        asked = parse(body, chat, state.defaults() if callable(state.defaults) else state.defaults)
        engine = _loaded_engine()
        answer = Answer(state, asked, chat)  # its place in the queue, or 429
        try:
            await answer.prepare(engine)
        except BaseException:
            answer.close()
            raise
        if asked.stream:
            return AnswerStream(answer)  # it gives the place back, however the stream ends
        try:
            return JSONResponse(await answer.whole(request.receive))
        except ClientLeft:
            return Response(status_code=499)  # nobody reads it
        finally:
            answer.close()

    def _loaded_engine() -> Engine:
        engine = state.engine()
        if engine is None:
            raise ApiError(503, "the models are still loading; try again shortly", "server_error",
                           code="model_not_ready")
        return engine

    return Guard(app, lambda: state.access)


def error_of(error: BaseException) -> ApiError:
    """Any failure as the OpenAI error a client reads."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, PromptTooLongError):  # the caches would outgrow the memory left
        return ApiError(400, str(error), code="context_length_exceeded")
    if isinstance(error, EngineBusyError):
        return ApiError(503, f"{error}; try again shortly", "server_error", code="engine_busy")
    if isinstance(error, MemoryError) or "out of memory" in str(error).lower():
        return ApiError(507, f"out of memory: {in_one_line(error)}", "server_error", code="out_of_memory")
    return ApiError(500, f"{type(error).__name__}: {in_one_line(error)}", "server_error", code="internal_error")


async def _tokenizing(work: Callable[[], list[int]]) -> list[int]:
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZING, work)


async def _json_body(request: Request) -> dict:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":  # a web page's text/plain POST needs no CORS preflight
        raise ApiError(415, f"the body must be sent as 'Content-Type: application/json', not "
                       f"'{media_type or 'none'}'", code="unsupported_media_type")
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


class ClientLeft(Exception):
    """The client closed its connection before its answer was whole."""


class Answer:
    """One request's turn at the engine, its steps turned into the API's chunks. It holds a place
    in the queue from its arrival (429 before anything is sent) until its turn or close()."""

    def __init__(self, state: ServerState, asked: CompletionRequest, chat: bool) -> None:
        self.state, self.asked, self.chat = state, asked, chat
        self.turns, self.model = state.turns, state.model_name
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.cancel = threading.Event()  # the engine stops at its next step
        self.left = asyncio.Event()  # the client has gone (or the server is closing)
        try:
            self.turns.reserve()
        except QueueFull as full:
            raise ApiError(429, f"{full}; try again shortly", "rate_limit_error", code="queue_full") from None
        self._reserved = True
        state.answers.add(self)

    async def prepare(self, engine: Engine) -> None:
        """The prompt's token ids under `engine`'s tokenizer, checked; ApiError (400) if refused."""
        asked, tokenizer = self.asked, engine.target.tokenizer

        def prompt() -> list[int]:
            if self.chat:
                return chat_prompt_ids(tokenizer, asked.messages)
            if asked.prompt_ids is not None:
                return asked.prompt_ids
            return tokenizer(asked.prompt, add_special_tokens=asked.add_special_tokens).input_ids

        try:
            prompt_ids = await _tokenizing(prompt)
        except Exception as error:
            said = in_one_line(error)
            raise ApiError(400, f"the model's chat template refused the messages: {said}" if self.chat else
                           f"the prompt could not be tokenized: {said}", param="messages" if self.chat else "prompt",
                           ) from None
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        vocabulary = engine.vocabulary_size
        if not all(0 <= token < vocabulary for token in prompt_ids):
            raise ApiError(400, f"a token id outside the model's vocabulary (0 to {vocabulary - 1})", param="prompt")
        context = engine.target.context_length
        if context and len(prompt_ids) >= context:
            raise ApiError(400, f"the prompt is {len(prompt_ids):,} tokens; the model's context holds {context:,}",
                           param="messages" if self.chat else "prompt", code="context_length_exceeded")
        budget = min(asked.options.max_new_tokens, context - len(prompt_ids)) if context else \
            asked.options.max_new_tokens
        # not the engine itself: a request waiting through a model switch must not keep the old pair in memory
        self.prepared_for, self.prompt_ids = weakref.ref(engine), prompt_ids
        self.options = replace(asked.options, max_new_tokens=budget)
        spec_tokens = 0 if not self.options.speculative else engine.spec_tokens(self.options)
        self.output = RequestOutput(tokenizer, asked.stop, spec_tokens)

    def close(self) -> None:
        """The request is over: a place never taken goes back, a running answer stops."""
        if self._reserved:
            self._reserved = False
            self.turns.give_back()
        self.cancel.set()
        self.state.answers.discard(self)

    async def watch(self, receive) -> None:
        """Waits for the client's disconnect (the body has been read: nothing else comes)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left.set()
        self.cancel.set()

    async def _turn(self) -> bool:
        """Waits for the engine; False when the client left first (its place then goes back)."""
        self._reserved = False  # take_unless gives the place back, whether it gets the turn or not
        return await self.turns.take_unless(self.left)

    async def _steps(self) -> AsyncIterator:
        """What each step that emitted tokens lets out, until the answer ends. The turn passes on
        when the engine's thread ends, also when the client left and this coroutine was cancelled."""
        if not await self._turn():
            return
        self.state.requests_served += 1
        try:
            engine = self.state.engine()
            if engine is None:
                raise ApiError(503, "the models are loading; try again shortly", "server_error",
                               code="model_not_ready")
            if engine is not self.prepared_for():  # the models changed while this request waited
                await self.prepare(engine)
            if self.state.make_room is not None:
                await self.state.make_room()
            steps = steps_of("serve", lambda: engine.generate(self.prompt_ids, self.options, self.cancel), self.cancel,
                             on_end=self.turns.release)
        except BaseException:
            self.turns.release()
            raise
        try:
            async for step in steps:
                if not step.tokens and step.finish is None:
                    continue  # a long prompt's reading
                yield self.output.add(step)
                if self.output.done or self.left.is_set():
                    break
        finally:
            self.cancel.set()  # a no-op after the end; else the engine stops at its next step

    async def whole(self, receive) -> dict:
        """The whole answer; ClientLeft when the client went first (its answer then stopped)."""
        watching = asyncio.ensure_future(self.watch(receive))
        text, provenance = "", []
        try:
            async for released in self._steps():
                text += released.text
                provenance += released.provenance
        finally:
            watching.cancel()
        if self.left.is_set():
            raise ClientLeft()
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat else
                  {"index": 0, "text": text, "logprobs": None})
        choice |= {"finish_reason": self.output.finish or "stop", "provenance": provenance}
        if self.asked.return_token_ids:
            choice |= {"token_ids": [token["id"] for token in provenance], "prompt_token_ids": self.prompt_ids}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": self.output.usage(len(self.prompt_ids)), "metrics": self.output.metrics()}

    async def events(self) -> AsyncIterator[str]:
        if self.chat:
            yield self._event({"delta": {"role": "assistant", "content": ""}, "finish_reason": None, "provenance": []})
        try:
            async for released in self._steps():
                yield self._event(self._piece(released.text) | {"finish_reason": None,
                                                                "provenance": released.provenance}
                                  | self._token_ids(released.provenance))
        except Exception as error:  # said in the stream, which then ends as every stream does
            yield f"data: {json.dumps(error_of(error).body())}\n\n"
            yield "data: [DONE]\n\n"
            return
        if self.left.is_set():
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


class AnswerStream(StreamingResponse):
    """An answer's event stream that watches for its client's disconnect from the start (also
    while it waits for its turn) and gives the answer's place back however it ends."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.answer = answer

    async def __call__(self, scope, receive, send) -> None:
        watching = asyncio.ensure_future(self.answer.watch(receive))
        try:
            await super().__call__(scope, receive, send)
        finally:
            watching.cancel()
            self.answer.close()
