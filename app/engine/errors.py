class ModelError(Exception):
    """A model cannot be used: missing, corrupt, or incompatible. The message is for the user."""


class IncompatibleModelsError(ModelError):
    """The draft's tokenizer differs from the target's: its token ids would mean other text."""


class PromptTooLongError(ValueError):
    """The prompt leaves no room in the model's context for a single new token."""


class EngineBusyError(RuntimeError):
    """A second request reached an engine that is still generating."""
