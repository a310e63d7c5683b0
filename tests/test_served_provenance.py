"""A served answer's tokens labelled from the server's own speculation: live from step-sized
chunks, then checked against the server's per-step account (hand-built streams in vLLM's shape)."""
import logging

from app.engine.api import FinishReason, Source
from app.engine.remote.engine import ServedAnswer, Speculation
from app.engine.remote.provenance import exact_sources

A, C, B, P = Source.ACCEPTED, Source.CORRECTED, Source.BONUS, Source.PLAIN

# A real vLLM stream (k = 3, 20 tokens): the tokens of each chunk, then its per-step account.
CHUNKS = [1, 1, 2, 1, 1, 1, 2, 1, 1, 4, 1, 1, 2]
LAST_CHUNK = 1  # the chunk with finish_reason "length": a step of 1 accepted + 1, cut at the limit
PER_STEP_ACCEPTED = [0, 1, 0, 0, 0, 1, 0, 0, 3, 0, 0, 1, 1]
PER_STEP_DRAFTED = [3] * 13
EXPECTED = [P, C, A, C, C, C, C, A, C, C, C, A, A, A, B, C, C, A, C, A]


def stream(sizes, last, accepted, drafted, spec_tokens=3):
    """The chunks of a streamed completion as vLLM sends them: token ids per step, finish_reason on
    the last, the metrics on the usage chunk after it."""
    ids = iter(range(100, 10_000))
    chunks = [{"choices": [{"index": 0, "text": "", "token_ids": [next(ids) for _ in range(size)],
                            "finish_reason": None}]} for size in sizes]
    chunks.append({"choices": [{"index": 0, "text": "", "token_ids": [next(ids) for _ in range(last)],
                                "finish_reason": "length"}]})
    chunks.append({"choices": [], "usage": {}, "metrics": {"speculative_decoding": {
        "num_spec_tokens": spec_tokens, "num_draft_tokens": sum(drafted), "num_accepted_draft_tokens": sum(accepted),
        "num_spec_steps": len(accepted), "per_step_accepted": accepted, "per_step_drafted": drafted}}})
    return chunks


def answer_of(chunks, spec_tokens=3):
    answer = ServedAnswer(spec_tokens)
    steps = [step for step in (answer.add(chunk) for chunk in chunks) if step is not None]
    return steps + [answer.end()]


def test_a_real_vllm_stream_is_labelled_exactly_as_its_per_step_account_says():
    empty = {"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": None}]}  # counts as no step
    steps = answer_of([empty] + stream(CHUNKS, LAST_CHUNK, PER_STEP_ACCEPTED, PER_STEP_DRAFTED))
    assert [token.source for step in steps for token in step.tokens] == EXPECTED
    # each live step is one of the server's: the prompt's token, then its blocks
    assert [len(step.tokens) for step in steps] == CHUNKS + [LAST_CHUNK]
    last = steps[-1]
    assert last.relabelled is None and last.finish is FinishReason.LENGTH
    assert last.stats.emitted == 20 and last.stats.accepted == 7 and last.stats.drafted == 39
    assert last.stats.accepted_lengths == tuple(PER_STEP_ACCEPTED) and last.stats.target_passes == 14


def test_exact_sources_follow_the_rule_and_refuse_an_account_that_does_not_add_up():
    exact = lambda accepted, drafted, chunks: exact_sources(accepted, drafted, chunks).sources
    assert exact(PER_STEP_ACCEPTED, PER_STEP_DRAFTED, CHUNKS + [LAST_CHUNK]) == EXPECTED
    assert exact(PER_STEP_ACCEPTED, PER_STEP_DRAFTED, [20]) == EXPECTED  # all in one chunk: the counts decide
    assert exact([3, 0], [3, 3], [1, 4, 1]) == [P, A, A, A, B, C]
    assert exact([3, 0], [3, 0], [1, 4, 1]) == [P, A, A, A, B, P]  # a step listed as drafting nothing
    assert exact([2], [3], [1, 2]) == [P, A, A]  # the last block cut at the limit
    assert exact_sources([2, 0], [3, 0], [1, 3, 1, 1]) is None  # more tokens than the listed steps made
    assert exact_sources([2, 0], [3, 3], [1, 1]) is None  # a whole step more than the tokens
    assert exact_sources([4], [3], [1, 5]) is None  # more accepted than drafted


def test_a_server_that_lists_only_drafting_steps_has_its_plain_tokens_found_between_them():
    """vLLM's arrays (an n-gram proposer finds nothing at some steps) leave those steps out: they
    are the one-token chunks that no block fits, and a chunk of one that could be either is said
    to be a guess."""
    reading = exact_sources([2, 1], [3, 3], [1, 1, 3, 1, 2])
    assert reading.sources == [P, P, A, A, C, P, A, C] and reading.unique
    ambiguous = exact_sources([0], [3], [1, 1, 1])  # which of the two later tokens was the correction?
    assert ambiguous is not None and not ambiguous.unique
    steps = answer_of(stream([1, 3, 1, 2], 1, [2, 0, 1], [3, 3, 3]))  # the last step drafted nothing
    assert [token.source for step in steps for token in step.tokens] == [P, A, A, C, C, A, C, P]
    assert not steps[-1].estimated and steps[-1].stats.target_passes == 5


def test_a_chunk_holding_two_steps_is_corrected_by_the_account_and_logged(caplog):
    # The server fell behind: steps of 1 and 2 tokens (0 and 1 accepted) came as one chunk of 3.
    sizes = [1, 3, 1]
    with caplog.at_level(logging.ERROR, logger="specchat"):
        steps = answer_of(stream(sizes, 1, [0, 1, 0, 0], [3, 3, 3, 3]))
    live = [token.source for step in steps for token in step.tokens]
    assert live[:4] == [P, A, A, C]  # as the chunk suggested
    assert steps[-1].relabelled == (P, C, A, C, C, C)
    assert "differ from the server's per-step account from token 1" in caplog.text


def test_without_the_per_step_account_every_token_is_plain_and_the_view_says_why():
    summary_only = {"metrics": {"speculative_decoding": {"num_draft_tokens": 30, "num_accepted_draft_tokens": 12,
                                                         "num_spec_tokens": 3}}}
    llama_server = {"timings": {"draft_n": 30, "draft_n_accepted": 12}}
    for response in (summary_only, llama_server):
        speculation = Speculation.of(response)
        assert speculation.spec_tokens is None and "per answer only" in speculation.note
        chunks = stream([1, 2, 4], 1, [], [])
        chunks[-1] = response
        steps = answer_of(chunks, speculation.spec_tokens)
        assert {token.source for step in steps for token in step.tokens} == {P}
        assert steps[-1].stats.accepted == 12 and steps[-1].stats.drafted == 30
    assert "no speculation" in Speculation.of({"usage": {}}).note


def test_our_servers_per_token_sources_are_taken_as_they_come():
    chunk = {"choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": None,
                          "provenance": [{"id": 5, "source": "accepted"}, {"id": 6, "source": "bonus"}]}]}
    answer = ServedAnswer(3)
    assert [t.source for t in answer.add(chunk).tokens] == [A, B]


def test_an_answer_stopped_before_the_servers_account_has_its_colours_marked_estimated(qtbot):
    """Stop (or a server that fails mid-answer) ends the answer with no account: its colours stay
    the live guesses, said so in the acceptance view; an answer the account labels is not."""
    from app.ui.acceptance_view import AcceptanceView

    answer = ServedAnswer(3)
    for chunk in stream([1, 3, 2], 1, [2, 1], [3, 3])[:3]:
        answer.add(chunk)
    stopped = answer.stopped()
    assert stopped.estimated and stopped.finish is FinishReason.CANCELLED
    assert not answer_of(stream([1, 3, 2], 1, [2, 1, 0], [3, 3, 3]))[-1].estimated

    view = AcceptanceView()
    qtbot.addWidget(view)
    view.show_colours_note("Colours come from the server's own speculation (k = 3), step by step.")
    view.show_estimated(stopped.estimated)
    assert "estimated" in view.colours.text() and view.colours.text().startswith("Colours come from")
    view.show_estimated(False)  # the next answer's first step
    assert "estimated" not in view.colours.text()
