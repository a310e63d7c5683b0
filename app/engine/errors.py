class ModelError(Exception):
    """A model cannot be used: missing, corrupt, or incompatible. The message is for the user."""


class IncompatibleModelsError(ModelError):
    """The draft's tokenizer differs from the target's: its token ids would mean other text."""


class PromptTooLongError(ValueError):
    """The prompt leaves no room in the model's context for a single new token."""


class EngineBusyError(RuntimeError):
    """A second request reached an engine that is still generating."""


def in_one_line(error: BaseException | str, limit: int = 240) -> str:
    """What an error from a library (or a name read from a file) says, as one printable line of
    at most `limit` characters: a hostile file's names and a reader's tracebacks can hold anything."""
    text = " ".join(str(error).split())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
