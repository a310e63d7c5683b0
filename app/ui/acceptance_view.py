"""Live acceptance view: rates, speed, time split, accepted-length histogram, acceptance
along the answer, memory, and the last A/B comparison."""
from __future__ import annotations

from collections import Counter

from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QProgressBar, QVBoxLayout, QWidget

from ..chat.conversation import AnswerStats, Comparison
from .message_html import comparison_html

NO_COMPARISON = "Use Compare to rerun the last answer's prompt without speculation."


def _small_text(painter: QPainter) -> None:
    """The charts' labels: 80% of the text's size, 6 points at least."""
    small = painter.font()
    small.setPointSizeF(max(6.0, small.pointSizeF() * 0.8))
    painter.setFont(small)


class Histogram(QWidget):
    """Steps by number of draft tokens: accepted (filled bars) and drafted (outlined behind them)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[int, int] = {}  # accepted length -> steps
        self.drafted: dict[int, int] = {}  # drafted length -> steps
        self.colour = QColor("#0072B2")
        self.setMinimumHeight(80)
        self.setToolTip("Steps by number of draft tokens accepted (filled) and drafted (outlined)")

    def set_lengths(self, accepted: list[int], drafted: list[int] = ()) -> None:
        self.counts, self.drafted = dict(Counter(accepted)), dict(Counter(drafted))
        self.update()

    def axis_labels(self) -> tuple[str, str]:
        """(the value axis's top: the most steps at one length, the length axis's name)."""
        most = max([*self.counts.values(), *self.drafted.values()], default=0)
        return f"{most} step{'s' if most != 1 else ''}", "tokens per step: accepted, drafted (outline)"

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        text = self.palette().windowText().color()
        painter.setPen(text)
        if not self.counts:
            painter.drawText(self.rect(), Qt.AlignCenter, "accepted length per step")
            return
        most_label, length_label = self.axis_labels()
        _small_text(painter)
        area = QRectF(self.rect()).adjusted(4, 14, -4, -28)
        painter.drawText(QRectF(4, 0, area.width(), 14), Qt.AlignLeft | Qt.AlignVCenter, most_label)
        painter.drawText(QRectF(4, area.bottom() + 14, area.width(), 14), Qt.AlignCenter, length_label)
        top = max([*self.counts, *self.drafted])
        most = max([*self.counts.values(), *self.drafted.values()])
        width = area.width() / (top + 1)
        for length in range(top + 1):
            left = area.left() + length * width
            drafted = area.height() * self.drafted.get(length, 0) / most
            if drafted:
                painter.setPen(QPen(self.colour, 1))
                painter.drawRect(QRectF(left + 1, area.bottom() - drafted, width - 2, drafted))
            height = area.height() * self.counts.get(length, 0) / most
            painter.fillRect(QRectF(left + 3, area.bottom() - height, width - 6, height), self.colour)
            painter.setPen(text)
            painter.drawText(QRectF(left, area.bottom(), width, 14), Qt.AlignCenter, str(length))


class Trace(QWidget):
    """Running acceptance rate along the answer, step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []
        self.colour = QColor("#D55E00")
        self.setMinimumHeight(60)
        self.setToolTip("Acceptance rate along the answer (0 to 100%)")

    def set_values(self, values: list[float]) -> None:
        self.values = values
        self.update()

    def axis_labels(self) -> tuple[str, str, str]:
        """(the top line's value, the bottom line's, the step axis's span)."""
        return "100%", "0%", f"step 1 to {len(self.values)}" if self.values else ""

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        top_label, bottom_label, steps_label = self.axis_labels()
        _small_text(painter)
        area = QRectF(self.rect()).adjusted(34, 6, -4, -16)
        text = self.palette().windowText().color()
        painter.setPen(text)
        painter.drawText(QRectF(0, area.top() - 7, 30, 14), Qt.AlignRight | Qt.AlignVCenter, top_label)
        painter.drawText(QRectF(0, area.bottom() - 7, 30, 14), Qt.AlignRight | Qt.AlignVCenter, bottom_label)
        painter.drawText(QRectF(area.left(), area.bottom() + 2, area.width(), 14), Qt.AlignCenter, steps_label)
        grid = self.palette().mid().color()
        painter.setPen(QPen(grid, 1, Qt.DashLine))
        painter.drawLine(area.topLeft(), area.topRight())
        painter.drawLine(area.bottomLeft(), area.bottomRight())
        if len(self.values) < 2:
            return
        painter.setPen(QPen(self.colour, 2))
        step = area.width() / (len(self.values) - 1)
        points = [QPointF(area.left() + i * step, area.bottom() - v * area.height()) for i, v in enumerate(self.values)]
        painter.drawPolyline(points)


ESTIMATED = (" This answer's colours are estimated: it ended before the server's account of its steps came (Stop, "
             "a failure), or that account fits its chunks more than one way.")


class AcceptanceView(QWidget):
    def __init__(self) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        box = QGroupBox("Acceptance")
        form = QFormLayout(box)
        # A value that now wraps onto more lines gets them: the form keeps the row heights it
        # measured for the old texts (the rows below then overlapped it in a narrow window) unless
        # it is measured again once the new texts are laid out. One measuring per batch of updates.
        self._relayout = QTimer(self, singleShot=True, interval=0)
        self._relayout.timeout.connect(form.invalidate)
        self.fields = {}
        for key, label in [("mode", "Mode"), ("acceptance", "Acceptance rate"), ("length", "Mean accepted length"),
                           ("speed", "Speed"), ("first", "First token"), ("time", "Draft / target time"),
                           ("memory", "Memory")]:
            self.fields[key] = QLabel("–", wordWrap=True)
            form.addRow(label, self.fields[key])
        self.context = QProgressBar(textVisible=True, maximumHeight=16)
        self.context.setFormat("no answer yet")
        self.context.setToolTip("How much of the target's context window this chat's last answer used")
        form.addRow("Context", self.context)
        self.colours = QLabel(wordWrap=True)  # where a served target's colours come from, or why there are none
        form.addRow("Colours", self.colours)
        self._form = form
        self.show_colours_note("")
        self.histogram = Histogram()
        self.trace = Trace()
        form.addRow(QLabel("Draft tokens per step"))
        form.addRow(self.histogram)
        form.addRow(QLabel("Acceptance along the answer"))
        form.addRow(self.trace)
        layout.addWidget(box)
        compare = QGroupBox("A/B: speculation on vs off")
        compare_layout = QVBoxLayout(compare)
        self.comparison = QLabel(NO_COMPARISON)
        self.comparison.setWordWrap(True)
        compare_layout.addWidget(self.comparison)
        layout.addWidget(compare)
        layout.addStretch(1)

    def set_colours(self, accepted: str, corrected: str) -> None:
        self.histogram.colour = QColor(accepted)
        self.trace.colour = QColor(corrected)

    def show_stats(self, stats: AnswerStats | None) -> None:
        """An answer's stats (live or saved with a message)."""
        if not stats:
            return
        self.fields["mode"].setText(stats.mode)
        copied = f", {stats.looked_up} copied" if stats.looked_up else ""
        self.fields["acceptance"].setText(
            f"{stats.acceptance_rate:.1%} ({stats.accepted}/{stats.drafted}{copied})" if stats.drafted else "– (nothing drafted)")
        self.fields["length"].setText(f"{stats.mean_accepted_length:.2f} tokens per target pass")
        self.fields["speed"].setText(f"{stats.tokens_per_s:.2f} tokens/s ({stats.emitted} tokens)")
        self.fields["time"].setText(f"{stats.draft_seconds:.1f} s / {stats.target_seconds:.1f} s")
        cached = (f" ({stats.cached_prompt_tokens:,} of {stats.prompt_tokens:,} prompt tokens cached)"
                  if stats.cached_prompt_tokens else "")
        self.fields["first"].setText("–" if stats.first_token_seconds is None else f"{stats.first_token_seconds:.2f} s{cached}")
        self.show_context(stats.context_used, stats.context_length)
        self.histogram.set_lengths(list(stats.accepted_lengths), list(stats.drafted_lengths))
        self.trace.set_values(list(stats.acceptance_trace))
        self.show_comparison(stats.comparison)
        self._relayout.start()

    def show_context(self, used: int, length: int) -> None:
        self.context.setRange(0, max(length, 1))
        self.context.setValue(min(used, length))
        self.context.setFormat(f"{used:,} / {length:,} tokens ({used / length:.0%})" if length else f"{used:,} tokens")

    def show_colours_note(self, note: str) -> None:
        """Where the colours come from, for a target on a server ("" hides the row: they are this computer's)."""
        self._colours_note = note
        self._show_colours(note)

    def show_estimated(self, estimated: bool) -> None:
        """Whether the last served answer's colours are guesses (stopped before the server's account)."""
        note = self._colours_note + (ESTIMATED if estimated else "")
        if note != self.colours.text():
            self._show_colours(note)

    def _show_colours(self, note: str) -> None:
        self.colours.setText(note)
        self._form.setRowVisible(self.colours, bool(note))
        self._relayout.start()

    def show_memory(self, text: str, details: str = "") -> None:
        self.fields["memory"].setText(text)
        self.fields["memory"].setToolTip(details)
        self._relayout.start()

    def show_comparison(self, comparison: Comparison | None) -> None:
        self.comparison.setText(comparison_html(comparison) if comparison else NO_COMPARISON)
