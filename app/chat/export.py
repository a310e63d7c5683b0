"""A conversation exported: as Markdown to read, or as JSON that keeps everything (the system
prompt, every version of each answer, every token's id, text, source and probabilities, the stats
with Compare's results and the seed) and imports back exactly."""
from __future__ import annotations

import json
from dataclasses import asdict, fields

from .conversation import AnswerStats, Conversation, Message, TokenRecord, Version

FORMAT = "specchat-chat"  # the JSON file's kind, and its version below
FORMAT_VERSION = 1
_TOKEN_FIELDS = {f.name for f in fields(TokenRecord)}


class ChatFileError(ValueError):
    """A file that is not a chat SpecChat exported, or is damaged: said in one line."""


def to_markdown(conversation: Conversation) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["**System prompt:**", "", conversation.system_prompt, ""]
    for message in conversation.messages:
        lines.append(f"**{'You' if message.role == 'user' else 'Assistant'}:**")
        lines.append("")
        lines.append(message.content)
        stats = message.stats
        if message.role == "assistant" and stats:
            # a plain answer drafted nothing: it has no acceptance to tell
            speculated = (f", acceptance {stats.acceptance_rate:.0%}, mean accepted length "
                          f"{stats.mean_accepted_length:.2f}") if stats.drafted else ""
            lines.append("")
            lines.append(f"*{stats.mode}: {stats.emitted} tokens, {stats.tokens_per_s:.2f} tokens/s{speculated}*")
        lines.append("")
    return "\n".join(lines)


def to_json(conversation: Conversation) -> str:
    return json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "title": conversation.title,
                       "system_prompt": conversation.system_prompt, "preset": conversation.preset,
                       "updated": conversation.updated, "messages": [_message_dict(m) for m in conversation.messages]},
                      ensure_ascii=False, indent=1)


def _message_dict(message: Message) -> dict:
    return {"role": message.role, "content": message.content, "created": message.created,
            "tokens": _tokens_with_ids(message.tokens, message.stats), "stats": message.stats.to_dict() if message.stats else None,
            "versions": [version.to_dict() | {"tokens": _tokens_with_ids(version.tokens, version.stats)}
                         for version in message.versions], "shown": message.shown}


def _tokens_with_ids(tokens: list[TokenRecord], stats: AnswerStats | None) -> list[dict]:
    """Each token's record with its id (the answer's stats hold the ids in order)."""
    ids = list(stats.token_ids) if stats and len(stats.token_ids) == len(tokens) else [None] * len(tokens)
    return [asdict(token) | ({"id": token_id} if token_id is not None else {}) for token, token_id in zip(tokens, ids)]


def from_json(text: str) -> Conversation:
    """The conversation a to_json file holds, as a new chat (not yet saved). ChatFileError says
    why a file cannot be read."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ChatFileError(f"Not a JSON file: {error}") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatFileError("Not a chat exported by SpecChat (File > Export chat as JSON).")
    if data.get("version", 0) > FORMAT_VERSION:
        raise ChatFileError(f"The chat was exported by a newer SpecChat (format {data['version']}); update SpecChat.")
    try:
        messages = [Message(role=m["role"], content=m["content"], tokens=_tokens(m["tokens"]),
                            stats=AnswerStats.from_dict(m["stats"]) if m.get("stats") is not None else None,
                            created=m["created"], shown=m.get("shown", 0),
                            versions=[Version.from_dict(v | {"tokens": [_record(t) for t in v["tokens"]]})
                                      for v in m.get("versions", [])])
                    for m in data["messages"]]
        if any(m.role not in ("user", "assistant") for m in messages):
            raise ValueError("a message's role is neither user nor assistant")
        return Conversation(title=str(data["title"]), messages=messages, system_prompt=str(data.get("system_prompt", "")),
                            preset=str(data.get("preset", "")))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ChatFileError(f"The chat file is damaged: {type(error).__name__}: {error}") from error


def _tokens(records: list[dict]) -> list[TokenRecord]:
    return [TokenRecord(**_record(record)) for record in records]


def _record(record: dict) -> dict:
    """A token's saved fields (its id lives in the answer's stats)."""
    return {key: value for key, value in record.items() if key in _TOKEN_FIELDS}
