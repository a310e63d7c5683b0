"""The draft finder on the tiny models: it ranks the candidates it can measure by their speed-up
over plain decoding, says why it cannot measure the others, checks every output against plain
decoding's, and keeps its results per target, draft and hardware."""
import pytest

from app.engine.choices import GenerationOptions
from app.engine.draft_finder import LOOKUP, Ranked, last_measured, rank_drafts, remember
from app.engine.errors import ModelError
from tests.tiny import tiny_model

PROMPTS = [[1, 2, 3, 4, 5], [10, 11, 12, 10, 11, 12, 10, 11], list(range(30, 50))]


@pytest.fixture
def candidates(tiny_target, tiny_draft):
    models = {"same": tiny_target, "unrelated": tiny_draft, "other-vocabulary": tiny_model(seed=3, vocab_size=128)}

    def load(name):
        if name not in models:
            raise ModelError(f"Model not found: {name}")
        return models[name]
    return load


def test_the_finder_ranks_what_it_measured_and_says_why_not_the_rest(tiny_target, candidates):
    said = []
    # a fixed k: on tiny models a draft costs what the target does, and adaptive k would not draft
    ranked = rank_drafts(tiny_target, ["unrelated", LOOKUP, "same", "missing", "other-vocabulary"], PROMPTS,
                         GenerationOptions(k=4, adaptive=False), candidates, max_new_tokens=24, progress=said.append)
    measured = [row for row in ranked if row.speedup is not None]
    assert {row.draft for row in measured} == {"unrelated", LOOKUP, "same"}
    assert [row.speedup for row in measured] == sorted((row.speedup for row in measured), reverse=True)
    assert all(row.identical for row in measured)  # greedy: every answer is plain decoding's
    by_name = {row.draft: row for row in ranked}
    assert by_name["same"].acceptance > 0.8 > 0.5 > by_name["unrelated"].acceptance  # (copies may miss)
    assert by_name[LOOKUP].memory_bytes == 0 and by_name["same"].memory_bytes > 0
    assert ranked[-2:] == [Ranked("missing", note="Model not found: missing"), ranked[-1]]
    assert ranked[-1].draft == "other-vocabulary" and "vocabular" in ranked[-1].note
    assert any("prompt 3 of 3" in line for line in said)


def test_the_budget_stops_further_prompts_for_every_candidate_alike(tiny_target, candidates):
    said = []
    ranked = rank_drafts(tiny_target, ["same", LOOKUP], PROMPTS, GenerationOptions(), candidates,
                         max_new_tokens=24, budget_seconds=0, progress=said.append)
    assert all(row.speedup is not None for row in ranked)  # the first prompt always runs
    assert "budget spent after 1 of 3 prompts" in said and not any("prompt 2 of 3" in line for line in said)


def test_results_are_kept_per_target_draft_and_hardware(tiny_target, tmp_path):
    path = tmp_path / "ranks.json"
    remember(tiny_target, [Ranked("same", 1.4, 1.5, 0.9, 3.2, 10, True), Ranked("missing", note="gone")], path)
    kept = last_measured(tiny_target, "same", path)
    assert kept["speedup"] == 1.4 and kept["identical"] is True and kept["measured"]
    assert last_measured(tiny_target, "missing", path) is None  # nothing measured, nothing kept
    other = tiny_model(seed=1)
    other.name = "another target"
    assert last_measured(other, "same", path) is None
