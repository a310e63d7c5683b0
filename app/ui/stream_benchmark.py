"""`python -m app bench ui`: what streaming costs the window's thread. A 4000-token answer (prose, lists and
code blocks) streams into a chat that already holds 50 messages; each update is timed as the
window runs it (acceptance view plus chat view), and the milliseconds per update are reported
near the start and near the end of the answer. No model is needed: the tokens are text pieces
with alternating provenance, as an engine would stream them."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace

from ..chat.conversation import AnswerStats, Message, TokenRecord

PROSE = ("Speculative decoding lets a small draft model propose several tokens that the large target "
         "model then checks in a single forward pass, so the answer is the target's own. ")
CODE = "```python\ndef add(a, b):\n    return a + b\n\nprint(add(2, 3))\n```\n\n"
LIST = "1. Draft proposes k tokens.\n2. Target verifies them at once.\n3. Rejection sampling keeps exactness.\n\n"


def answer_text(tokens: int) -> list[str]:
    """Text pieces of about four characters, paragraphs, lists and code blocks in turn."""
    pieces: list[str] = []
    section = 0
    while len(pieces) < tokens:
        block = [PROSE * 3 + "\n\n", LIST, CODE][section % 3]
        pieces += [block[i : i + 4] for i in range(0, len(block), 4)]
        section += 1
    return pieces[:tokens]


def history(messages: int) -> list[Message]:
    out = []
    for i in range(messages):
        if i % 2 == 0:
            out.append(Message("user", f"Question {i}: how does speculative decoding keep the output exact?"))
        else:
            pieces = answer_text(120)
            tokens = [TokenRecord(p, ("accepted", "corrected", "bonus")[j % 3], 0.9) for j, p in enumerate(pieces)]
            out.append(Message("assistant", "".join(pieces), tokens, AnswerStats(mode="speculative", emitted=120)))
    return out


def run_ui(args: argparse.Namespace) -> dict:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from .acceptance_view import AcceptanceView
    from .chat_view import ChatView
    from .token_html import RenderOptions
    from .theme import LIGHT

    app = QApplication.instance() or QApplication([])
    view, acceptance = ChatView(RenderOptions(LIGHT)), AcceptanceView()
    view.resize(800, 700)
    view.show()
    before = history(args.messages)
    view.show_messages(before)
    pieces = answer_text(args.tokens)
    tokens: list[TokenRecord] = []
    stats = AnswerStats(mode="speculative")
    timings: list[float] = []
    for end in range(args.tokens_per_update, len(pieces) + 1, args.tokens_per_update):
        tokens += [TokenRecord(p, ("accepted", "accepted", "corrected", "bonus")[i % 4], 0.9)
                   for i, p in enumerate(pieces[len(tokens) : end], start=len(tokens))]
        stats = replace(stats, emitted=len(tokens), accepted_lengths=stats.accepted_lengths + (3,))
        answer = Message("assistant", "".join(p.text for p in tokens), list(tokens), stats)
        start = time.perf_counter()
        acceptance.show_stats(stats)
        if args.full_render:
            view.show_messages(before + [answer])
        else:
            view.stream(before, answer)
        app.processEvents()  # the repaint the update causes
        timings.append((time.perf_counter() - start) * 1000)
    window = max(10, len(timings) // 20)
    result = {
        "answer_tokens": len(tokens), "chat_messages": args.messages, "updates": len(timings),
        "full_render": args.full_render,
        "ms_per_update_first": round(statistics.mean(timings[:window]), 2),
        "ms_per_update_last": round(statistics.mean(timings[-window:]), 2),
        "ms_per_update_p95_last": round(sorted(timings[-window:])[int(0.95 * window) - 1], 2),
        "ms_per_update_max": round(max(timings), 2),
    }
    print(f"streamed {result['answer_tokens']} tokens into a {args.messages}-message chat in {len(timings)} updates")
    print(f"UI-thread ms per update: first {window} updates {result['ms_per_update_first']}, last {window} "
          f"{result['ms_per_update_last']} (p95 {result['ms_per_update_p95_last']}), max {result['ms_per_update_max']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result
