"""One chat's state and actions, without Qt: what to generate next, what each engine step does
to the answer, when the growing answer is saved, and what a finished or interrupted request
leaves in the conversation. The window only forwards events here and draws the result."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from ..engine.choices import GenerationOptions, ProposerKind, SamplingParams, draw_seed
from ..engine.steps import FinishReason, Step
from .answer import AnswerBuilder
from .attachments import message_title
from .conversation import Comparison, Conversation, Message
from .prompt import chat_prompt_ids
from .store import ChatStore, StoreError

if TYPE_CHECKING:
    from ..engine.engine import SpeculativeEngine

SAVE_EVERY_SECONDS = 1.0  # a kill -9 loses at most about this much of a streaming answer


class RequestKind(str, Enum):
    ANSWER = "answer"  # a new answer to the last user message
    REGENERATE = "regenerate"  # another version of the last answer; the earlier ones are kept
    COMPARE = "compare"  # the last answer's prompt again with speculation off; not added to the chat
    CONTINUE = "continue"  # the last answer goes on from where it stopped; it grows in place


class Overflow(str, Enum):
    """What happens when a chat outgrows the context."""
    STOP = "stop"  # the request is refused, saying so
    DROP_OLDEST = "drop"  # the oldest turns are left out of the prompt (the system prompt stays)


@dataclass(frozen=True)
class Request:
    kind: RequestKind
    prompt_ids: list[int]
    options: GenerationOptions
    rounding_note: str | None = None  # the engine's: why greedy output may part between its modes
    left_out: int = 0  # the oldest messages left out of the prompt, for the context (Overflow.DROP_OLDEST)


def describe(options: GenerationOptions, draft_model: bool = True) -> str:
    """draft_model: whether the engine has one (without, it speculates by prompt lookup)."""
    if not options.speculative:
        return "plain"
    how = "prompt lookup" if options.proposer is ProposerKind.PROMPT_LOOKUP or not draft_model else \
        "draft model" + (" + copying" if options.lookup else "")
    return f"speculative ({how}, {'adaptive k' if options.adaptive else f'k={options.k}'})"


def settings_of(options: GenerationOptions) -> str:
    """What an answer is made with, as saved in its stats (JSON text)."""
    sampling = options.sampling
    return json.dumps({"proposer": options.proposer.value, "k": options.k, "adaptive": options.adaptive,
                       "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                       "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty,
                       "repeat_last_n": sampling.repeat_last_n,
                       "seed": options.seed, "max_new_tokens": options.max_new_tokens})


def options_of(saved: str, fallback: GenerationOptions) -> GenerationOptions:
    """The options `settings_of` saved; `fallback` for an answer saved without them or with
    settings this version cannot read."""
    try:
        settings = json.loads(saved)
        return replace(fallback, proposer=ProposerKind(settings["proposer"]), k=int(settings["k"]),
                       adaptive=bool(settings["adaptive"]), seed=int(settings["seed"]),
                       max_new_tokens=int(settings["max_new_tokens"]),
                       sampling=SamplingParams(float(settings["temperature"]), int(settings["top_k"]),
                                               float(settings["top_p"]), float(settings.get("min_p", 0.0)),
                                               float(settings.get("repeat_penalty", 1.0)),
                                               int(settings.get("repeat_last_n", SamplingParams.repeat_last_n))))
    except (KeyError, TypeError, ValueError):  # json's decode error is a ValueError
        return fallback


class ChatSession:
    def __init__(self, store: ChatStore, clock=time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.conversation = Conversation()
        self.request: Request | None = None
        self.builder: AnswerBuilder | None = None
        self.errors: list[str] = []  # save failures for the window to show; the data stays in memory
        self.overflow = Overflow.STOP  # what happens when a chat outgrows the context
        self.thinking = True  # False: reasoning models whose template can switch thinking off answer directly
        self._saved_at = 0.0
        self._streaming_id: int | None = None  # the streaming answer's row in the store, once saved
        self._version_saved = False  # the regenerated answer's version is in the store

    # ---- chats ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.request is not None

    def new_chat(self, system_prompt: str = "") -> None:
        self._require_idle()
        self.conversation = Conversation(system_prompt=system_prompt)

    def open_chat(self, chat_id: int) -> None:
        self._require_idle()
        self.conversation = self.store.load_chat(chat_id)

    def last_answer(self) -> Message | None:
        answers = [m for m in self.conversation.messages if m.role == "assistant" and m.stats and m.stats.token_ids]
        return answers[-1] if answers else None

    def unanswered(self) -> bool:
        """The last message is a question without an answer (e.g. the app was killed first)."""
        return bool(self.conversation.messages) and self.conversation.messages[-1].role == "user"

    def can_regenerate(self) -> bool:
        return bool(self.conversation.messages) and self.conversation.messages[-1].role == "assistant"

    def can_continue(self) -> bool:
        return bool(self.conversation.messages) and self.conversation.messages[-1].stopped_early

    def set_system_prompt(self, text: str) -> None:
        self.conversation.system_prompt = text
        if self.conversation.id is not None:
            self._save(lambda: self.store.set_system_prompt(self.conversation.id, text))

    def set_preset(self, name: str, system_prompt: str) -> None:
        """The chat's preset, and the system prompt it brings (saved)."""
        self.set_system_prompt(system_prompt)
        self.conversation.preset = name
        if self.conversation.id is not None:
            self._save(lambda: self.store.set_preset(self.conversation.id, name))

    def show_version(self, index: int, version: int) -> None:
        """Flips the answer at messages[index] to another of its versions (saved)."""
        message = self.conversation.messages[index]
        if 0 <= version < len(message.versions) and not (self.busy and index == len(self.conversation.messages) - 1):
            message.show(version)
            self._save(lambda: self.store.update_message(message))

    # ---- requests -----------------------------------------------------------------------------
    def prompt_for(self, text: str, replacing: int | None = None, history: bool = True) -> list[dict]:
        """The messages that sending `text` would give the chat template (in place of the user
        message at `replacing`, as edit does); history False: the system prompt and `text` alone."""
        before = self.conversation.prompt_messages(upto=replacing if history else 0)
        return before + [Message(role="user", content=text).to_prompt()]

    def prompt_ids_for(self, text: str, engine: SpeculativeEngine, replacing: int | None = None,
                       history: bool = True) -> list[int]:
        """The prompt's token ids: what the window reads ahead while the message is typed."""
        return chat_prompt_ids(engine.target.tokenizer, self.prompt_for(text, replacing, history), self.thinking)

    def ask(self, text: str, engine: SpeculativeEngine, options: GenerationOptions) -> Request:
        """Adds the user's message (saved at once) and returns the request that answers it."""
        self._require_idle()
        if not self.conversation.messages:
            self.conversation.title = message_title(text)
        user = Message(role="user", content=text)
        self.conversation.messages.append(user)
        self._save(lambda: self.store.add_message(self.conversation, user))
        return self._begin(RequestKind.ANSWER, self.conversation.prompt_messages(), engine, options)

    def answer(self, engine: SpeculativeEngine, options: GenerationOptions) -> Request | None:
        """Answers a question left without an answer."""
        self._require_idle()
        if not self.unanswered():
            return None
        return self._begin(RequestKind.ANSWER, self.conversation.prompt_messages(), engine, options)

    def regenerate(self, engine: SpeculativeEngine, options: GenerationOptions) -> Request | None:
        """Another answer to the last question, with the current options."""
        self._require_idle()
        if not self.can_regenerate():
            return None
        prompt = self.conversation.prompt_messages(upto=len(self.conversation.messages) - 1)
        return self._begin(RequestKind.REGENERATE, prompt, engine, options)

    def continue_answer(self, engine: SpeculativeEngine, options: GenerationOptions) -> Request | None:
        """Goes on with the last answer where it stopped, with the current options and another
        max_new_tokens. Its own token ids follow the prompt, so the model sees what it saw when
        it stopped: under greedy decoding the answer grows into the very one a larger budget
        would have given at once."""
        self._require_idle()
        if not self.can_continue():
            return None
        prompt = self.conversation.prompt_messages(upto=len(self.conversation.messages) - 1)
        return self._begin(RequestKind.CONTINUE, prompt, engine, options, continues=self.conversation.messages[-1])

    def edit(self, index: int, text: str, engine: SpeculativeEngine, options: GenerationOptions) -> Request:
        """Replaces the user message at `index` and answers it; the chat continues from there
        (the messages after it are removed)."""
        self._require_idle()
        message = self.conversation.messages[index]
        if message.role != "user":
            raise ValueError("only your own messages can be edited")
        if message.id is not None:
            self._save(lambda: self.store.delete_messages_from(self.conversation.id, message.id))
        del self.conversation.messages[index:]
        return self.ask(text, engine, options)

    def compare(self, engine: SpeculativeEngine, options: GenerationOptions) -> Request | None:
        """The last answer's prompt again with speculation off, with the settings the shown
        version of that answer was made with (`options` for an answer saved without them)."""
        self._require_idle()
        answer = self.last_answer()
        if answer is None:
            return None
        index = self.conversation.messages.index(answer)
        prompt = self.conversation.prompt_messages(upto=index)
        made_with = options_of(answer.stats.made_with, options)
        return self._begin(RequestKind.COMPARE, prompt, engine, replace(made_with, speculative=False))

    def _begin(self, kind: RequestKind, prompt: list[dict], engine: SpeculativeEngine,
               options: GenerationOptions, continues: Message | None = None) -> Request:
        tokenizer = engine.target.tokenizer
        prompt_ids = chat_prompt_ids(tokenizer, prompt, self.thinking)
        left_out = 0
        if self.overflow is Overflow.DROP_OLDEST:
            prompt, prompt_ids, left_out = self._within_context(prompt, prompt_ids, engine, options, continues)
        if options.seed is None:  # a fresh one, saved with the answer: Compare reruns it with the same
            options = replace(options, seed=draw_seed())
        # Compare reruns a continued answer's prompt in one go: with the budget of both parts.
        made_with = options
        if continues is not None:
            made_with = replace(options, max_new_tokens=len(continues.stats.token_ids) + options.max_new_tokens)
        # a target on a server: its own speculation
        mode = f"served at {engine.served_by}" if engine.served_by else describe(options, engine.draft is not None)
        self.builder = AnswerBuilder(tokenizer, mode, len(prompt_ids),
                                     engine.target.context_length, settings_of(made_with), continues)
        if continues is not None:
            prompt_ids += continues.stats.token_ids
        self.request = Request(kind, prompt_ids, options, engine.rounding_note, left_out)
        self._saved_at, self._streaming_id, self._version_saved = self.clock(), None, False
        return self.request

    def _within_context(self, prompt: list[dict], prompt_ids: list[int], engine: SpeculativeEngine,
                        options: GenerationOptions, continues: Message | None) -> tuple[list[dict], list[int], int]:
        """The prompt with its oldest turns left out (a question with its answers at a time, the
        system prompt kept, the last question never) until it leaves the answer room in the
        context: its whole length, or a quarter of the context if less. -> (prompt, its ids, the
        number of messages left out)."""
        context = engine.target.context_length
        if not context:  # a server that does not say: its own refusal tells
            return prompt, prompt_ids, 0
        room = min(options.max_new_tokens, context // 4)
        grown = len(continues.stats.token_ids) if continues is not None else 0  # a continued answer's own tokens
        first = 1 if prompt and prompt[0]["role"] == "system" else 0
        left_out = 0
        while len(prompt_ids) + grown + room > context and len(prompt) - first > 1:
            dropped = 1
            while first + dropped < len(prompt) - 1 and prompt[first + dropped]["role"] != "user":
                dropped += 1  # a question goes with its answers
            prompt = prompt[:first] + prompt[first + dropped:]
            left_out += dropped
            prompt_ids = chat_prompt_ids(engine.target.tokenizer, prompt, self.thinking)
        return prompt, prompt_ids, left_out

    def streaming_message(self) -> Message | None:
        """The answer as it grows (None while comparing: that run is not part of the chat)."""
        if self.builder is None or self.request.kind is RequestKind.COMPARE:
            return None
        return self.builder.message()

    def visible_messages(self) -> list[Message]:
        """What the chat shows now: a regenerated answer streams in place of the one it replaces."""
        messages, streaming = self.conversation.messages, self.streaming_message()
        if streaming is None:
            return list(messages)
        if self.request.kind in (RequestKind.REGENERATE, RequestKind.CONTINUE):
            return messages[:-1] + [streaming]
        return messages + [streaming]

    def add_step(self, step: Step) -> None:
        if self.builder is None:
            return
        self.builder.add(step)
        if self.clock() - self._saved_at >= SAVE_EVERY_SECONDS:  # what a reopen shows if we die now
            if self.request.kind is RequestKind.ANSWER:
                self._save_streaming(self.builder, FinishReason.INTERRUPTED)
            elif self.request.kind is RequestKind.CONTINUE and self.builder.has_new_tokens:
                self._grow_last(self.builder.message(FinishReason.INTERRUPTED))
            elif self.request.kind is RequestKind.REGENERATE and self.builder.has_new_tokens:
                self._save_version(self.builder.message(FinishReason.INTERRUPTED))
            self._saved_at = self.clock()

    def finish(self) -> Message | None:
        """Ends the request: a new answer joins the chat, a comparison is stored with the answer
        it compared. Returns the message that changed (None when nothing was generated)."""
        builder, request = self.builder, self.request
        self.builder = self.request = None
        if builder is None or not builder.has_new_tokens:
            self._forget_streaming_row()
            return None
        if request.kind is RequestKind.COMPARE:
            answer = self.last_answer()
            if answer is None:
                return None
            answer.set_stats(replace(answer.stats, comparison=Comparison.of(answer, builder.message(),
                                                                                  request.rounding_note)))
            self._save(lambda: self.store.update_message(answer))
            return answer
        if request.kind is RequestKind.REGENERATE:
            return self._save_version(builder.message())
        if request.kind is RequestKind.CONTINUE:
            return self._grow_last(builder.message())
        message = self._save_streaming(builder, None)
        self.conversation.messages.append(message)
        return message

    def interrupt(self) -> None:
        """The window is closing mid-answer: keep what was generated, marked as interrupted."""
        if self.builder is not None and self.builder.has_new_tokens:
            if self.request.kind is RequestKind.ANSWER:
                self.conversation.messages.append(self._save_streaming(self.builder, FinishReason.INTERRUPTED))
            elif self.request.kind is RequestKind.REGENERATE:
                self._save_version(self.builder.message(FinishReason.INTERRUPTED))
            elif self.request.kind is RequestKind.CONTINUE:
                self._grow_last(self.builder.message(FinishReason.INTERRUPTED))
        self.builder = self.request = self._streaming_id = None

    def _save_version(self, answer: Message) -> Message:
        """A regenerated answer as a new version of the last message: added at its first save,
        grown at the later ones (each second while it streams, then at its end)."""
        if self._version_saved:
            return self._grow_last(answer)
        self._version_saved = True
        message = self.conversation.messages[-1]
        message.add_version(answer)
        self._save(lambda: self.store.update_message(message))
        return message

    def _grow_last(self, answer: Message) -> Message:
        message = self.conversation.messages[-1]
        message.replace_shown(answer)
        self._save(lambda: self.store.update_message(message))
        return message

    # ---- saving -------------------------------------------------------------------------------
    def _save_streaming(self, builder: AnswerBuilder, finish: FinishReason | None) -> Message:
        message = builder.message(finish)
        message.id = self._streaming_id
        if message.id is not None:
            self._save(lambda: self.store.update_message(message))
        elif message.tokens and self._save(lambda: self.store.add_message(self.conversation, message)):
            self._streaming_id = message.id
        return message

    def _forget_streaming_row(self) -> None:
        if self._streaming_id is not None:
            self._save(lambda: self.store.delete_message(self._streaming_id))
            self._streaming_id = None

    def _save(self, write) -> bool:
        try:
            write()
            return True
        except StoreError as error:
            self.errors.append(str(error))
            return False

    def _require_idle(self) -> None:
        if self.busy:
            raise RuntimeError("a request is running in this chat; stop it first")
