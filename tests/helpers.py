from app.engine.engine import GenerationOptions, SpeculativeEngine


def options(**overrides) -> GenerationOptions:
    """Tests that name a k mean a fixed k unless they ask for adaptive, drafted by the draft
    model alone unless they ask for lookup."""
    return GenerationOptions(**{"adaptive": False, "lookup": 0, **overrides})


def generated_ids(engine: SpeculativeEngine, prompt: list[int], **overrides) -> list[int]:
    return [token.id for step in engine.generate(prompt, options(**overrides)) for token in step.tokens]


def all_steps(engine: SpeculativeEngine, prompt: list[int], **overrides):
    return list(engine.generate(prompt, options(**overrides)))
