from app.engine.engine import GenerationOptions, SpeculativeEngine


def generated_ids(engine: SpeculativeEngine, prompt: list[int], **options) -> list[int]:
    return [token.id for step in engine.generate(prompt, GenerationOptions(**options)) for token in step.tokens]


def all_steps(engine: SpeculativeEngine, prompt: list[int], **options):
    return list(engine.generate(prompt, GenerationOptions(**options)))
