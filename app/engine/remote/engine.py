"""The target served by an OpenAI-compatible server (vLLM, or another SpecChat), behind the same
interface as SpeculativeEngine: generate() yields Steps whose tokens say where they came from.

The prompt is built and tokenised here, with the local tokenizer the user chose, and sent as
token ids, so the server's model reads exactly what a local one would; connect() refuses a
server whose tokenizer gives other ids for a probe text. Sampling and the seed go to the server;
speculation is the server's own (its draft, its k), reported back per step. The stats' clock is
the client's: time to first token, tokens per second, as the user sees them.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace

from ..choices import GenerationOptions
from ..errors import PromptTooLongError
from ..steps import EmittedToken, FinishReason, Source, Stats, Step
from .client import ServedModel, ServerClient, ServerError
from .provenance import LiveLabels, Reading, exact_sources

log = logging.getLogger("specchat")

# Words, accents, CJK, an emoji, code and a newline: where two tokenizers most often part ways.
PROBE_TEXT = "SpecChat checks the tokenizer: café, naïve, 中文, 🙂, `x += 1`\n\tdone."
POLL_SECONDS = 0.05  # how soon Stop closes a request whose next chunk has not come


@dataclass(frozen=True)
class Speculation:
    """How the server reports its own speculation, as its answer to a probe showed."""

    spec_tokens: int | None  # its draft length k; None: it reports nothing per step
    summary: bool  # it reports acceptance per answer (counts, no steps)

    @property
    def note(self) -> str:
        """What the acceptance view says about the colours."""
        if self.spec_tokens is not None:
            return f"Colours come from the server's own speculation (k = {self.spec_tokens}), step by step."
        if self.summary:
            return ("The server reports acceptance per answer only, not which tokens were drafted: "
                    "tokens are shown plain.")
        return "The server reports no speculation (none, or not per request): tokens are shown plain."

    @classmethod
    def of(cls, response: dict) -> Speculation:
        metrics = _speculation_metrics(response)
        if metrics is None:
            return cls(None, False)
        if not metrics.get("num_draft_tokens") and not metrics.get("num_spec_tokens"):
            return cls(None, False)  # speculation off
        detailed = "per_step_accepted" in metrics and metrics.get("num_spec_tokens")
        return cls(int(metrics["num_spec_tokens"]) if detailed else None, True)


@dataclass(frozen=True)
class ServedTarget:
    """What the chat reads of a target (as of a LoadedModel): its name, tokenizer and context."""

    name: str
    tokenizer: object
    context_length: int  # 0: the server does not say
    label: str  # where it runs, in words
    memory_bytes: int = 0  # none in this process


class RemoteEngine:
    draft = None  # the server drafts, if it does
    draft_refused = None
    kv_cache = None
    rounding_note = None  # Compare does not run on a served target: its plain run would be another server's

    def __init__(self, client: ServerClient, target: ServedTarget, speculation: Speculation,
                 served_models: tuple[str, ...] = ()) -> None:
        self.client, self.target, self.speculation = client, target, speculation
        self.served_by = client.root
        self.served_models = served_models or (target.name,)  # all the server serves

    @classmethod
    def connect(cls, url: str, model: str | None, tokenizer, api_key: str | None = None,
                tokenizer_name: str = "the local tokenizer") -> RemoteEngine:
        """Checks the server as the chat will use it; raises ServerError saying what is wrong.
        model: the served model's name (None: the server's only one)."""
        client = ServerClient(url, api_key)
        models = client.models()
        served = _pick(models, model, client.root)
        probe = _probe_text(tokenizer)
        local = tokenizer(probe, add_special_tokens=False).input_ids
        remote = client.tokenize(served.id, probe)
        if local != remote:
            at = next((i for i, (a, b) in enumerate(zip(local, remote)) if a != b), min(len(local), len(remote)))
            server_has = f"id {remote[at]}" if at < len(remote) else "no more tokens"
            here = f"id {local[at]} ({tokenizer.decode([local[at]])!r})" if at < len(local) else "no more tokens"
            raise ServerError(f"the server's tokenizer for '{served.id}' differs from {tokenizer_name}'s: at token "
                              f"{at} of a probe text the server has {server_has}, {tokenizer_name} {here}. "
                              "Pick the same model as the target here, for its tokenizer.")
        answer = client.complete({"model": served.id, "prompt": local, "max_tokens": 8, "temperature": 0,
                                  "return_token_ids": True})
        choices = answer.get("choices") or [{}]
        if "token_ids" not in choices[0]:
            raise ServerError(f"the server at {client.root} does not return token ids (vLLM's return_token_ids): "
                              "SpecChat needs them to show each token")
        target = ServedTarget(served.id, tokenizer, served.max_model_len or 0, f"served at {client.root}")
        return cls(client, target, Speculation.of(answer), tuple(served.id for served in models))

    @property
    def vocabulary_size(self) -> int:
        return len(self.target.tokenizer)

    def spec_tokens(self, options: GenerationOptions) -> int:
        return self.speculation.spec_tokens or 0  # the server's own k, whatever the options say

    # ---- answering ----------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], options: GenerationOptions,
                 cancel: threading.Event | None = None) -> Iterator[Step]:
        """The steps of one answer as the server streams them. Stop (`cancel`) closes the
        connection, which ends the request on the server."""
        context = self.target.context_length
        if context and len(prompt_ids) >= context:
            raise PromptTooLongError(f"the prompt is {len(prompt_ids):,} tokens; the served model's context holds "
                                     f"{context:,}")
        budget = min(options.max_new_tokens, context - len(prompt_ids)) if context else options.max_new_tokens
        answer = ServedAnswer(self.speculation.spec_tokens, budget < options.max_new_tokens)
        loop = asyncio.new_event_loop()
        chunks = self.client.stream(_body(self.target.name, prompt_ids, options, budget))
        try:
            while True:
                chunk = loop.run_until_complete(_next(chunks, cancel))
                if chunk is _CANCELLED:
                    yield answer.stopped()
                    return
                if chunk is _END:
                    yield answer.end()
                    return
                step = answer.add(chunk)
                if step is not None:
                    yield step
        except ServerError:
            if answer.token_ids:  # what came is kept, marked as cut short by the server
                yield answer.stopped(FinishReason.FAILED)
            raise
        finally:
            loop.run_until_complete(chunks.aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())  # httpx's own, closed on this loop
            loop.close()

    # ---- what a local engine does and a served one needs not ----------------------------------
    def read_ahead(self, prompt_ids: list[int], cancel: threading.Event) -> int:
        return 0  # the server keeps its own prefix cache

    def save_caches(self, wait_seconds: float = 5.0) -> bool:
        return True

    def forget_conversation(self, token_ids: list[int], wait_seconds: float = 5.0) -> bool:
        return True

    def cache_bytes(self) -> int:
        return 0


class ServedAnswer:
    """An answer's streamed chunks -> Steps, each chunk one server step. The chunk that ends the
    answer waits for the server's final account (the next chunk), which labels it exactly."""

    def __init__(self, spec_tokens: int | None, context_limited: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.live = LiveLabels(spec_tokens)
        self.context_limited = context_limited  # the budget is the context's room, not max_new_tokens
        self.clock, self.started = clock, clock()
        self.token_ids: list[int] = []
        self.sources: list[Source] = []  # as labelled live
        self.stats = Stats()
        self.last_at = self.started
        self.finish: FinishReason | None = None
        self.held: list[int] = []  # the last chunk's tokens, until the final account
        self.held_sources: list[Source] = []  # as labelled live
        self.metrics: dict | None = None
        self.chunks: list[int] = []  # the token count of each chunk that brought tokens
        self.told = True  # the server named every token's source (SpecChat's provenance)

    def add(self, chunk: dict) -> Step | None:
        metrics = _speculation_metrics(chunk)
        if metrics is not None:
            self.metrics = metrics
        for choice in chunk.get("choices") or []:
            ids = choice.get("token_ids")
            if ids is None:
                ids = choice.get("tokens") if isinstance(choice.get("tokens"), list) else []
            sources = self.live.label(len(ids))
            given = _given_sources(choice, len(ids))  # SpecChat's servers say each token's source
            if given is not None:
                sources = given
            elif ids:
                self.told = False
            if ids:
                self.chunks.append(len(ids))
            if choice.get("finish_reason"):
                self.finish = self._finish(choice["finish_reason"])
                self.held, self.held_sources = list(ids), sources
                return None
            if ids:
                return self._step(list(ids), sources)
        return None

    def end(self) -> Step:
        """The last step, its tokens labelled by the server's final account; where that account
        tells otherwise of tokens labelled live, the step relabels the whole answer."""
        held, self.held = self.held, []
        shown = list(self.sources)
        reading = None if self.told else self._exact()
        exact = reading.sources if reading is not None else None
        step = self._step(held, exact[len(shown):] if exact else self.held_sources, self.finish or FinishReason.STOP)
        if exact is not None and exact[: len(shown)] != shown:
            at = next(i for i, (a, b) in enumerate(zip(exact, shown)) if a != b)
            if reading.unique:
                log.error("served answer: the live labels differ from the server's per-step account from token %d "
                          "on (a chunk held more than one step); the server's account is shown", at)
            step = replace(step, relabelled=tuple(exact))
        estimated = self._labelled and not self.told and (reading is None or not reading.unique)
        return replace(self._with_server_counts(step), estimated=estimated)

    def stopped(self, finish: FinishReason = FinishReason.CANCELLED) -> Step:
        """The step that ends an answer cut short here (Stop) or by the server's failure: no
        account comes, so colours other than plain are the live guesses."""
        held, self.held = self.held, []
        step = self._step(held, self.held_sources[: len(held)], finish)
        return replace(step, estimated=self._labelled and not self.told)

    @property
    def _labelled(self) -> bool:
        """Tokens were labelled by the server's speculation (not all plain)."""
        return self.live.spec_tokens is not None and bool(self.token_ids)

    def _step(self, ids: list[int], sources: list[Source], finish: FinishReason | None = None) -> Step:
        now = self.clock()
        if ids:
            first = not self.token_ids  # its time is the prompt's reading
            blocks = sum(source in (Source.CORRECTED, Source.BONUS) for source in sources)
            self.stats = self.stats.after_step(
                blocks * (self.live.spec_tokens or 0), sources.count(Source.ACCEPTED), len(ids), 0.0,
                0.0 if first else now - self.last_at, prefill_seconds=now - self.last_at if first else 0.0,
                seconds=now - self.started)
        else:
            self.stats = replace(self.stats, seconds=now - self.started)
        self.last_at = now
        self.token_ids += ids
        self.sources += sources
        tokens = [EmittedToken(token, source, 1.0) for token, source in zip(ids, sources)]
        return Step(tokens, [], self.stats, finish)

    def _exact(self) -> Reading | None:
        if self.metrics is None or "per_step_accepted" not in self.metrics:
            return None
        reading = exact_sources(self.metrics["per_step_accepted"], self.metrics["per_step_drafted"], self.chunks)
        if reading is None:
            log.error("served answer: the server's per-step account (%d steps) does not add up to its %d tokens; "
                      "the live labels are shown", len(self.metrics["per_step_accepted"]), sum(self.chunks))
        return reading

    def _with_server_counts(self, step: Step) -> Step:
        """The server's own totals in place of what the chunks suggested."""
        metrics = self.metrics
        if metrics is None:
            return step
        accepted_lengths = tuple(metrics.get("per_step_accepted") or ())
        drafted_lengths = tuple(metrics.get("per_step_drafted") or ())
        stats = replace(step.stats, drafted=int(metrics.get("num_draft_tokens", 0)),
                        accepted=int(metrics.get("num_accepted_draft_tokens", 0)),
                        accepted_lengths=tuple(a for a, d in zip(accepted_lengths, drafted_lengths) if d),
                        drafted_lengths=tuple(d for d in drafted_lengths if d),
                        target_passes=self._passes(int(metrics["num_spec_steps"]), int(
                            metrics.get("num_accepted_draft_tokens", 0))) if "num_spec_steps" in metrics
                        else step.stats.target_passes)
        return replace(step, stats=stats)

    def _passes(self, spec_steps: int, accepted: int) -> int:
        """The server's steps: the prompt's, those that verified a draft, and one per token made
        between them with nothing drafted (steps vLLM's arrays leave out)."""
        made_plainly = len(self.token_ids) - 1 - accepted - spec_steps
        return 1 + spec_steps + max(made_plainly, 0)

    def _finish(self, reason: str) -> FinishReason:
        if reason == "length":
            return FinishReason.CONTEXT if self.context_limited else FinishReason.LENGTH
        return FinishReason.CANCELLED if reason == "abort" else FinishReason.STOP


def _probe_text(tokenizer) -> str:
    """PROBE_TEXT and the text of 32 tokens spread over the local vocabulary: two tokenizers that
    share the common words may still differ in the rest."""
    size = len(tokenizer)
    spread = [tokenizer.decode([token]) for token in range(size // 64, size, max(size // 32, 1))]
    return PROBE_TEXT + " " + " ".join(spread)


def _pick(models: list[ServedModel], name: str | None, root: str) -> ServedModel:
    if not models:
        raise ServerError(f"the server at {root} serves no model")
    if name is None:
        return models[0]
    for served in models:
        if served.id == name:
            return served
    raise ServerError(f"the server at {root} serves no model named '{name}'; it serves: "
                      + ", ".join(served.id for served in models))


def _body(model: str, prompt_ids: list[int], options: GenerationOptions, budget: int) -> dict:
    """The completion request: token ids in, token ids out, the chat's sampling, the server's
    final account of its speculation (which vLLM sends with the usage)."""
    sampling = options.sampling
    body = {"model": model, "prompt": prompt_ids, "max_tokens": budget, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "seed": options.seed, "return_token_ids": True,
            "stream_options": {"include_usage": True}, "skip_special_tokens": False}
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    if sampling.min_p:
        body["min_p"] = sampling.min_p
    if sampling.repeat_penalty != 1.0:
        body["repetition_penalty"] = sampling.repeat_penalty
    return body


def _given_sources(choice: dict, tokens: int) -> list[Source] | None:
    """The chunk's per-token sources where the server sends them (SpecChat's `provenance`)."""
    given = choice.get("provenance")
    if not isinstance(given, list) or len(given) != tokens or not tokens:
        return None
    try:
        return [Source(entry["source"]) for entry in given]
    except (KeyError, TypeError, ValueError):
        return None


def _speculation_metrics(body: dict) -> dict | None:
    """vLLM's metrics.speculative_decoding; llama-server's per-answer draft counts in its names."""
    metrics = body.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        return metrics["speculative_decoding"]
    timings = body.get("timings")
    if isinstance(timings, dict) and "draft_n" in timings:
        return {"num_draft_tokens": timings["draft_n"], "num_accepted_draft_tokens": timings.get("draft_n_accepted", 0)}
    return None


_END, _CANCELLED = object(), object()


async def _next(chunks: AsyncIterator[dict], cancel: threading.Event | None):
    """The next chunk, _END after the last, or _CANCELLED once `cancel` is set (the wait for the
    chunk is abandoned, which closes the connection)."""
    if cancel is not None and cancel.is_set():
        return _CANCELLED
    waiting = asyncio.ensure_future(anext(chunks, _END))
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=POLL_SECONDS)
        if done:
            return waiting.result()
        if cancel is not None and cancel.is_set():
            waiting.cancel()
            try:
                await waiting
            except asyncio.CancelledError:
                pass
            return _CANCELLED
