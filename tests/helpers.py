import struct

from app.engine.engine import GenerationOptions, SpeculativeEngine

# The smallest well-formed GGUF: its header (version 3), no fields, no tensors. Tests whose loaders
# are stand-ins need a file that passes the structural check, and nothing more.
EMPTY_GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)


def options(**overrides) -> GenerationOptions:
    """Tests that name a k mean a fixed k unless they ask for adaptive, drafted by the draft
    model alone unless they ask for lookup."""
    return GenerationOptions(**{"adaptive": False, "lookup": 0, **overrides})


def generated_ids(engine: SpeculativeEngine, prompt: list[int], **overrides) -> list[int]:
    return [token.id for step in engine.generate(prompt, options(**overrides)) for token in step.tokens]


def all_steps(engine: SpeculativeEngine, prompt: list[int], **overrides):
    return list(engine.generate(prompt, options(**overrides)))
