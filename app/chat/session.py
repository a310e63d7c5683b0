"""One chat's state and actions, without Qt: what to generate next, what each engine step does
to the answer, when the growing answer is saved, and what a finished or interrupted request
leaves in the conversation. The window only forwards events here and draws the result."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from enum import Enum

from ..engine.engine import GenerationOptions, ProposerKind, SpeculativeEngine
from ..engine.steps import FinishReason, Step
from .answer import AnswerBuilder
from .conversation import Comparison, Conversation, Message
from .prompt import chat_prompt_ids
from .store import ChatStore, StoreError

SAVE_EVERY_SECONDS = 1.0  # a kill -9 loses at most about this much of a streaming answer


class RequestKind(str, Enum):
    ANSWER = "answer"  # a new answer to the last user message
    COMPARE = "compare"  # the last answer's prompt again with speculation off; not added to the chat


@dataclass(frozen=True)
class Request:
    kind: RequestKind
    prompt_ids: list[int]
    options: GenerationOptions


def describe(options: GenerationOptions) -> str:
    if not options.speculative:
        return "plain"
    how = "prompt lookup" if options.proposer is ProposerKind.PROMPT_LOOKUP else "draft model"
    return f"speculative ({how}, {'adaptive k' if options.adaptive else f'k={options.k}'})"


class ChatSession:
    def __init__(self, store: ChatStore, clock=time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.conversation = Conversation()
        self.request: Request | None = None
        self.builder: AnswerBuilder | None = None
        self.errors: list[str] = []  # save failures for the window to show; the data stays in memory
        self.answer_options: GenerationOptions | None = None  # what the last answer here was made with
        self._saved_at = 0.0
        self._streaming_saved = False  # the streaming answer has a row in the store

    # ---- chats ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.request is not None

    def new_chat(self) -> None:
        self._require_idle()
        self.conversation, self.answer_options = Conversation(), None

    def open_chat(self, chat_id: int) -> None:
        self._require_idle()
        self.conversation, self.answer_options = self.store.load_chat(chat_id), None

    def last_answer(self) -> Message | None:
        answers = [m for m in self.conversation.messages if m.role == "assistant" and m.stats and m.stats.token_ids]
        return answers[-1] if answers else None

    # ---- requests -----------------------------------------------------------------------------
    def ask(self, text: str, engine: SpeculativeEngine, options: GenerationOptions) -> Request:
        """Adds the user's message (saved at once) and returns the request that answers it."""
        self._require_idle()
        if not self.conversation.messages:
            self.conversation.title = text.splitlines()[0][:60]
        user = Message(role="user", content=text)
        self.conversation.messages.append(user)
        self._save(lambda: self.store.add_message(self.conversation, user))
        return self._begin(RequestKind.ANSWER, self.conversation.prompt_messages(), engine, options)

    def compare(self, engine: SpeculativeEngine, options: GenerationOptions) -> Request | None:
        """The last answer's prompt again with speculation off, with the options that answer was
        made with (`options` when they are not known, as in a reopened chat)."""
        self._require_idle()
        answer = self.last_answer()
        if answer is None:
            return None
        index = self.conversation.messages.index(answer)
        prompt = [m.to_prompt() for m in self.conversation.messages[:index]]
        return self._begin(RequestKind.COMPARE, prompt, engine, replace(self.answer_options or options, speculative=False))

    def _begin(self, kind: RequestKind, prompt: list[dict], engine: SpeculativeEngine,
               options: GenerationOptions) -> Request:
        tokenizer = engine.target.tokenizer
        prompt_ids = chat_prompt_ids(tokenizer, prompt)
        self.request = Request(kind, prompt_ids, options)
        if kind is RequestKind.ANSWER:
            self.answer_options = options
        self.builder = AnswerBuilder(tokenizer, describe(options), len(prompt_ids), engine.target.context_length)
        self._saved_at, self._streaming_saved = self.clock(), False
        return self.request

    def streaming_message(self) -> Message | None:
        """The answer as it grows (None while comparing: that run is not part of the chat)."""
        if self.builder is None or self.request.kind is not RequestKind.ANSWER:
            return None
        return self.builder.message()

    def add_step(self, step: Step) -> None:
        if self.builder is None:
            return
        self.builder.add(step)
        if self.request.kind is RequestKind.ANSWER and self.clock() - self._saved_at >= SAVE_EVERY_SECONDS:
            self._save_streaming(self.builder, FinishReason.INTERRUPTED)  # what a reopen shows if we die now

    def finish(self) -> Message | None:
        """Ends the request: a new answer joins the chat, a comparison is stored with the answer
        it compared. Returns the message that changed (None when nothing was generated)."""
        builder, request = self.builder, self.request
        self.builder = self.request = None
        if builder is None or not builder.tokens:
            self._forget_streaming_row()
            return None
        if request.kind is RequestKind.COMPARE:
            answer = self.last_answer()
            if answer is None:
                return None
            answer.stats = replace(answer.stats, comparison=Comparison.of(answer, builder.message()))
            self._save(lambda: self.store.update_message(answer))
            return answer
        message = self._save_streaming(builder, None)
        self.conversation.messages.append(message)
        return message

    def interrupt(self) -> None:
        """The window is closing mid-answer: keep what was generated, marked as interrupted."""
        if self.builder is not None and self.request.kind is RequestKind.ANSWER and self.builder.tokens:
            message = self._save_streaming(self.builder, FinishReason.INTERRUPTED)
            self.conversation.messages.append(message)
        self.builder = self.request = None

    # ---- saving -------------------------------------------------------------------------------
    def _save_streaming(self, builder: AnswerBuilder, finish: FinishReason | None) -> Message:
        message = builder.message(finish)
        if self._streaming_saved:
            message.id = self._streaming_id
            self._save(lambda: self.store.update_message(message))
        elif message.tokens:
            self._streaming_saved = self._save(lambda: self.store.add_message(self.conversation, message))
            self._streaming_id = message.id
        self._saved_at = self.clock()
        return message

    def _forget_streaming_row(self) -> None:
        if self._streaming_saved:
            self._save(lambda: self.store.delete_message(self._streaming_id))
            self._streaming_saved = False

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
