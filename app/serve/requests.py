"""An API request's body checked and turned into generation options (pydantic), and the errors the
API answers with, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

A parameter this server does not implement is refused with a 400 naming it, not ignored: an agent
that asked for tools or a JSON format must not get a 200 and a plain answer. Such a parameter at
its no-op value (`"logprobs": false`, `"presence_penalty": 0`, as some clients always send) passes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine.choices import SEED_LIMIT, GenerationOptions, SamplingParams, draw_seed


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 429 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class ContentPart(BaseModel):
    type: str
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str = Field(pattern="^(system|developer|user|assistant|tool)$")
    content: str | list[ContentPart] | None = None

    def as_prompt(self) -> dict[str, str]:
        if isinstance(self.content, list):
            if any(part.type != "text" for part in self.content):
                raise ApiError(400, "only text content is understood", param="messages")
            text = "".join(part.text for part in self.content)
        else:
            text = self.content or ""
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    include_usage: bool = False


# Fields a client may send that change nothing in a local answer (bookkeeping, routing hints).
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                     "skip_special_tokens", "spaces_between_special_tokens"})
# OpenAI's and vLLM's parameters that are not implemented here, with the values that ask nothing.
UNSUPPORTED_UNLESS = {"tools": ([], None), "tool_choice": ("none", None), "functions": ([], None),
                      "function_call": ("none", None), "parallel_tool_calls": (None, False, True),
                      "response_format": (None, {"type": "text"}), "logprobs": (None, False, 0),
                      "top_logprobs": (None, 0), "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0),
                      "frequency_penalty": (None, 0, 0.0), "best_of": (None, 1), "echo": (None, False),
                      "suffix": (None, ""), "audio": (None,), "modalities": (None, ["text"]),
                      "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
                      "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
                      "guided_grammar": (None,), "structured_outputs": (None,), "min_tokens": (None, 0),
                      "ignore_eos": (None, False), "use_beam_search": (None, False)}
class Body(BaseModel):
    """What both endpoints read; other fields are checked by `unsupported` first."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] | None = None
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # -1: off, as vLLM takes it
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=SEED_LIMIT)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    repetition_penalty: float = Field(1.0, gt=0.0)
    return_token_ids: bool = False  # vLLM's: each choice also carries its tokens' ids
    add_special_tokens: bool | None = None  # vLLM's: a completion's text prompt gets the BOS (default: yes)


@dataclass(frozen=True)
class CompletionRequest:
    options: GenerationOptions
    stream: bool
    include_usage: bool
    stop: list[str]
    return_token_ids: bool = False
    messages: list[dict[str, str]] | None = None  # chat
    prompt: str | None = None  # completions, as text
    prompt_ids: list[int] | None = None  # completions, as token ids
    add_special_tokens: bool = True  # a text prompt gets its tokenizer's BOS token, as vLLM's completions do


def unsupported(body: dict) -> list[str]:
    """The body's fields that ask for something this server does not do."""
    known = set(Body.model_fields) | IGNORED
    return sorted(name for name, value in body.items()
                  if name not in known and not (name in UNSUPPORTED_UNLESS and value in UNSUPPORTED_UNLESS[name]))


def parse(body: dict, chat: bool, defaults: GenerationOptions) -> CompletionRequest:
    """Raises ApiError (400) naming the parameter that is wrong. Without a seed, a sampled
    request draws its own (defaults.seed, when set, is the fixed seed of whoever serves)."""
    refused = unsupported(body)
    if refused:
        raise ApiError(400, f"not supported by this server: {', '.join(refused)}", param=refused[0],
                       code="unsupported_parameter")
    try:
        asked = Body.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
    if asked.n != 1:
        raise ApiError(400, "n must be 1: one answer per request", param="n")
    stop = [asked.stop] if isinstance(asked.stop, str) else list(asked.stop or [])
    if len(stop) > 4:
        raise ApiError(400, "at most 4 stop sequences", param="stop")
    sampling = SamplingParams(temperature=asked.temperature, top_k=max(asked.top_k, 0), top_p=asked.top_p,
                              min_p=asked.min_p, repeat_penalty=asked.repetition_penalty)
    budget = asked.max_completion_tokens or asked.max_tokens or defaults.max_new_tokens
    seed = asked.seed if asked.seed is not None else defaults.seed if defaults.seed is not None else draw_seed()
    options = replace(defaults, sampling=sampling, max_new_tokens=budget, seed=seed)
    include_usage = bool(asked.stream_options and asked.stream_options.include_usage)
    common = dict(options=options, stream=asked.stream, include_usage=include_usage, stop=stop,
                  return_token_ids=asked.return_token_ids)
    if chat:
        if not asked.messages:
            raise ApiError(400, "messages: a list of at least one message is required", param="messages")
        return CompletionRequest(**common, messages=[message.as_prompt() for message in asked.messages])
    prompt = asked.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list
    if prompt is None or (isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)):
        raise ApiError(400, "prompt: one prompt is required, as text or token ids", param="prompt")
    if isinstance(prompt, str):
        return CompletionRequest(**common, prompt=prompt, add_special_tokens=asked.add_special_tokens is not False)
    return CompletionRequest(**common, prompt_ids=list(prompt))
