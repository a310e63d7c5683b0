"""The controls: models, speculation, draft length, proposer, sampling, device; one tab each,
so they take a fixed, small height below the acceptance view instead of pushing it away."""
from __future__ import annotations

import re

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGridLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QSpinBox, QTabWidget, QWidget)

from ..chat.session import Overflow
from ..engine.api import (CACHE_TYPES, CHAT_DEFAULTS, DEFAULTS, LOAD_DEFAULTS, GenerationOptions, LoadOptions,
                          Precision, ProposerKind, SamplingParams)

DEFAULT_TARGETS = [("Qwen2.5-Coder-1.5B-Instruct (default)", "default-target")]
DEFAULT_DRAFTS = [("Qwen2.5-Coder-0.5B-Instruct (default)", "default-draft")]
INCOMPATIBLE = "  (different vocabulary)"
GPU_PRECISION = ("The models run on the GPU, each as one float model (the Device row says its dtype);\n"
                 "these precisions are the CPU's. SPECCHAT_DEVICE=cpu runs them on the CPU instead.")
MISSING = "  (file not found)"
UNREADABLE = "  (cannot be read)"
MARKS = (INCOMPATIBLE, MISSING, UNREADABLE)
MEASURED = re.compile(r"  \([\d.]+x measured\)")  # the draft finder's last speed-up, beside a draft
CACHE_LABELS = {"float16": "float16 (half the memory)", "float32": "float32 (the reference's rounding)"}
PRECISION_LABELS = {Precision.LOWBIT: "Low-bit (GGUF's own blocks)", Precision.BITS4: "4-bit",
                    Precision.BITS3: "3-bit feed-forward, 4-bit rest",
                    Precision.FP32: "fp32 (reference)", Precision.INT8: "fp32 + dynamic int8"}


RANDOM_SEED = -1  # the seed picker's "random"
# The controls a preset sets, by the name of both the field and the widget (and the proposer, the context)
PRESET_SPINS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_new_tokens", "k")
PRESET_CHECKS = ("speculative", "adaptive", "lookup")
MIN_CONTEXT = 128  # the shortest context length the picker takes (0: the model's maximum)


class ControlsPanel(QTabWidget):
    models_changed = Signal()
    add_model_requested = Signal()
    get_models_requested = Signal()
    find_draft_requested = Signal()

    def __init__(self, device_text: str = "known once the models load") -> None:
        super().__init__()
        models = QWidget()
        form = QFormLayout(models)
        self.target = QComboBox()
        self.draft = QComboBox()
        for label, source in DEFAULT_TARGETS:
            self.target.addItem(label, source)
        for label, source in DEFAULT_DRAFTS:
            self.draft.addItem(label, source)
        # short words: the row holds the target's name beside them in the panel's width
        self.add_model = QPushButton("Add...")
        self.add_model.setToolTip("Add model: a .gguf file or a Hugging Face model folder from disk, or a hub id in the "
                                  "local cache")
        self.add_model.setAccessibleName("Add model")
        self.get_models = QPushButton("Hub...")
        self.get_models.setToolTip("Get models: search the Hugging Face hub and download models; the models on this "
                                   "machine (File > Get models..., Ctrl+Shift+M)")
        self.get_models.setAccessibleName("Get models")
        self.find_draft = QPushButton("Find the best draft")
        self.find_draft.setToolTip("Measure which draft (or prompt lookup) makes this target fastest on this machine")
        self.precision = QComboBox()
        self.draft_precision = QComboBox()
        for combo, default in ((self.precision, LOAD_DEFAULTS.precision), (self.draft_precision, LOAD_DEFAULTS.draft_precision)):
            for precision in Precision:
                combo.addItem(PRECISION_LABELS[precision], precision.value)
            combo.setCurrentIndex(combo.findData(default.value))
        self.precision.setToolTip("CPU weights of the target. Low-bit runs the GGUF's own 4-8 bit blocks (fast, small),\n"
                                  "and a model folder's weights quantized to 8 bits; fp32 is the dequantized reference.\n"
                                  "On a GPU each model runs as one float model (the Device row says its dtype).")
        self.draft_precision.setToolTip("CPU weights of the draft. A cheaper draft never changes the answer:\n"
                                        "only the target decides what is emitted.")
        self.kv_cache = QComboBox()
        for name in CACHE_TYPES:
            self.kv_cache.addItem(CACHE_LABELS[name], name)
        self.kv_cache.setCurrentIndex(self.kv_cache.findData(LOAD_DEFAULTS.kv_cache))
        self.kv_cache.setToolTip("Keys and values the low-bit models keep for the conversation (llama.cpp's cache type).\n"
                                 "float16 halves their memory and reads faster on long chats; float32 rounds as the\n"
                                 "fp32 reference does. Plain and speculative decoding round alike with either.")
        self.context = QSpinBox()
        self.context.setRange(0, 1 << 20)
        self.context.setSingleStep(1024)
        self.context.setSpecialValueText("maximum")  # (the model's; a short word for the panel's width)
        self.context.setSuffix(" tokens")
        self.context.setToolTip(f"The tokens a chat may fill: the prompt, the conversation and the answer. A shorter\n"
                                f"context bounds the models' memory (checked when they load); {MIN_CONTEXT:,} at least")
        self.context.setAccessibleName("Context length")
        self.overflow = QComboBox()
        self.overflow.addItem("Stop and say so", Overflow.STOP.value)
        self.overflow.addItem("Drop the oldest turns", Overflow.DROP_OLDEST.value)
        self.overflow.setToolTip("When a chat outgrows the context: refuse the next question, or leave its oldest\n"
                                 "turns out of the prompt (the system prompt stays; the window says which)")
        self.device = QLabel(device_text)
        self.device.setWordWrap(True)
        self.device_choice = QComboBox()
        self.device_choice.addItem("Auto", "auto")
        self.device_choice.addItem("CPU", "cpu")
        self.device_choice.setAccessibleName("Device")
        self.device_choice.setToolTip("Where the models run: Auto takes a GPU where torch sees one; the GPUs appear once\n"
                                      "the first models load. SPECCHAT_DEVICE, when set, overrides this choice")
        for combo in (self.target, self.draft, self.precision, self.draft_precision, self.kv_cache):
            # long names (a model's file, "(different vocabulary)") are cut, not widening the column
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(14)
        target_row = QHBoxLayout()
        target_row.addWidget(self.target, 1)
        target_row.addWidget(self.add_model)
        target_row.addWidget(self.get_models)
        draft_row = QHBoxLayout()
        draft_row.addWidget(self.draft, 1)
        draft_row.addWidget(self.find_draft)
        form.addRow("Target", target_row)
        form.addRow("Draft", draft_row)
        # two pickers a row: the tab widget is as tall as its tallest page (see the Sampling tab)
        precision_row = QHBoxLayout()
        precision_row.addWidget(self.precision, 1)
        precision_row.addWidget(QLabel("draft"))
        precision_row.addWidget(self.draft_precision, 1)
        context_row = QHBoxLayout()
        context_row.addWidget(self.context, 1)
        context_row.addWidget(self.overflow, 1)
        form.addRow("Precision", precision_row)
        form.addRow("KV cache", self.kv_cache)
        form.addRow("Context", context_row)
        # The target on an OpenAI-compatible server (vLLM, another SpecChat): the Target picker then
        # gives the tokenizer and chat template, and the server drafts with its own draft.
        self.on_server = QCheckBox("use")
        self.on_server.setToolTip("The target served by vLLM (one GPU or a cluster) or another SpecChat. Pick the same\n"
                                  "model as Target here: its tokenizer and chat template build the prompt. The server\n"
                                  "speculates with its own draft; colours come from its per-step metrics.")
        self.server_url = QLineEdit(placeholderText="http://localhost:8000/v1")
        self.server_model = QComboBox(editable=True)
        self.server_model.lineEdit().setPlaceholderText("the server's first model")
        self.connect_server = QPushButton("Connect")
        self.server_state = QLabel("not connected")
        server_row = QHBoxLayout()
        server_row.addWidget(self.on_server)
        server_row.addWidget(self.server_url, 1)
        server_row.addWidget(self.connect_server)
        served_row = QHBoxLayout()
        served_row.addWidget(self.server_model, 1)
        served_row.addWidget(self.server_state, 1)
        # rows of several widgets: each named for a screen reader (a single field takes its label's)
        for widget, name in ((self.target, "Target model"), (self.draft, "Draft model"),
                             (self.precision, "Target precision"), (self.draft_precision, "Draft precision"),
                             (self.overflow, "When a chat outgrows the context"),
                             (self.on_server, "Use a server for the target"), (self.server_url, "Server address"),
                             (self.server_model, "Served model")):
            widget.setAccessibleName(name)
        form.addRow("Server", server_row)
        form.addRow("Served model", served_row)
        device_row = QHBoxLayout()
        device_row.addWidget(self.device_choice)
        device_row.addWidget(self.device, 1)
        form.addRow("Device", device_row)
        self._models_form, self._served_row, self._draft_row, self._precision_row = form, served_row, draft_row, precision_row
        self._cpu_pickers = {picker: picker.toolTip() for picker in (self.precision, self.draft_precision, self.kv_cache)}
        self._on_gpu = False  # the loaded pair runs on a GPU (show_device)

        speculation = QWidget()
        form = QFormLayout(speculation)
        self.speculative = QCheckBox("Speculative decoding")
        self.speculative.setChecked(DEFAULTS.speculative)
        self.k = QSpinBox()
        self.k.setRange(1, 16)
        self.k.setValue(DEFAULTS.k)
        self.adaptive = QCheckBox("Adaptive k")
        self.adaptive.setChecked(DEFAULTS.adaptive)
        self.adaptive.setToolTip("Cost-aware: the draft goes on (up to 16 tokens) while the chance that the target\n"
                                 "accepts one more token pays for its measured cost, so it drafts long where it is\n"
                                 "sure and stops at its first doubtful token; none while drafting does not pay")
        self.proposer = QComboBox()
        self.proposer.addItem("Draft model", ProposerKind.DRAFT_MODEL)
        self.proposer.addItem("Prompt lookup (n-gram)", ProposerKind.PROMPT_LOOKUP)
        self.lookup = QCheckBox("Copy repeated text")
        self.lookup.setChecked(DEFAULTS.lookup > 0)
        self.lookup.setToolTip(f"Where the text's last tokens appeared earlier in the conversation, the draft proposes\n"
                               f"up to {DEFAULTS.lookup} tokens that followed the longest such match, as many as matched,\n"
                               f"instead of drafting them (summaries, code edits and answers quote their sources);\n"
                               f"with adaptive k only while such copies pay. The answer is the same either way")
        form.addRow(self.speculative)
        form.addRow("Draft length k", self.k)
        form.addRow(self.adaptive)
        form.addRow("Proposer", self.proposer)
        form.addRow(self.lookup)

        sampling = QWidget()
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(DEFAULTS.sampling.temperature)
        self.temperature.setToolTip("0 = greedy: the answer is exactly the target's, token for token")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setValue(DEFAULTS.sampling.top_k)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("Sample among the k most likely tokens only")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(DEFAULTS.sampling.top_p)
        self.top_p.setToolTip("Sample among the most likely tokens that together reach this probability (1 = off)")
        self.min_p = QDoubleSpinBox()
        self.min_p.setRange(0.0, 0.99)
        self.min_p.setSingleStep(0.01)
        self.min_p.setValue(DEFAULTS.sampling.min_p)
        self.min_p.setSpecialValueText("off")
        self.min_p.setToolTip("Drop tokens less likely than this fraction of the likeliest token's probability")
        self.repeat_penalty = QDoubleSpinBox()
        self.repeat_penalty.setRange(1.0, 2.0)
        self.repeat_penalty.setSingleStep(0.05)
        self.repeat_penalty.setValue(CHAT_DEFAULTS.sampling.repeat_penalty)
        self.repeat_penalty.setSpecialValueText("off")
        self.repeat_penalty.setToolTip(
            f"Make each token among the last {DEFAULTS.sampling.repeat_last_n} less likely (llama.cpp's and LM Studio's\n"
            "repeat penalty), greedy decoding too: small models otherwise often repeat a line to the\n"
            "token limit. Off: the target's own greedy answer. Speculation keeps the answer either way.")
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 8192)
        self.max_new_tokens.setValue(DEFAULTS.max_new_tokens)
        self.seed = QSpinBox()
        self.seed.setRange(RANDOM_SEED, 2**31 - 1)  # the lowest: "random"
        self.seed.setSpecialValueText("random")
        self.seed.setValue(RANDOM_SEED if DEFAULTS.seed is None else DEFAULTS.seed)
        self.seed.setToolTip("Random: each answer and each Regenerate samples with a fresh seed, saved with the answer\n"
                             "(Compare reruns it with the same one). A number fixes it: with a fixed k (or speculation off)\n"
                             "the same settings then give the same answer. Greedy decoding (temperature 0) needs none.")
        # Two pairs a row: the tab widget is as tall as its tallest page, and six rows in one
        # column took the acceptance view's chart its axis labels at 1280x800.
        grid = QGridLayout(sampling)
        pairs = [("Temperature", self.temperature), ("Top-k", self.top_k), ("Top-p", self.top_p),
                 ("Min-p", self.min_p), ("Repeat penalty", self.repeat_penalty), ("Max new tokens", self.max_new_tokens),
                 ("Seed", self.seed)]
        for index, (label, field) in enumerate(pairs):
            row, column = divmod(index, 2)
            grid.addWidget(QLabel(label, buddy=field), row, 2 * column)  # (a form row's label names its field)
            grid.addWidget(field, row, 2 * column + 1)
        # Only where the target's chat template can switch it (Qwen3); the window enables it then
        self.thinking = QCheckBox("Thinking (reasoning models that can switch it)")
        self.thinking.setChecked(True)
        self.thinking.setEnabled(False)
        self.thinking.setToolTip("On, a reasoning model such as Qwen3 thinks before it answers; off, it answers\n"
                                 "directly, sooner and shorter. Disabled where the target's chat template has no switch.")
        rows = -(-len(pairs) // 2)
        grid.addWidget(self.thinking, rows, 0, 1, 4)
        grid.setRowStretch(rows + 1, 1)
        for page, title in ((speculation, "Speculation"), (models, "Models"), (sampling, "Sampling")):
            self.addTab(page, title)

        self.target.currentIndexChanged.connect(lambda _: self.models_changed.emit())
        self.draft.currentIndexChanged.connect(lambda _: self.models_changed.emit())
        self.precision.currentIndexChanged.connect(lambda _: self.models_changed.emit())
        self.draft_precision.currentIndexChanged.connect(lambda _: self.models_changed.emit())
        self.kv_cache.currentIndexChanged.connect(lambda _: self.models_changed.emit())
        self.context.editingFinished.connect(self._context_edited)
        self.device_choice.currentIndexChanged.connect(lambda _: self.models_changed.emit())
        self._loaded_context = 0  # the context length of the last load (editing it again to the same loads nothing)
        self.add_model.clicked.connect(self.add_model_requested.emit)
        self.get_models.clicked.connect(self.get_models_requested.emit)
        self.find_draft.clicked.connect(self.find_draft_requested.emit)
        self.connect_server.clicked.connect(self.models_changed.emit)
        self.server_url.returnPressed.connect(self.models_changed.emit)
        self.on_server.toggled.connect(self._server_toggled)
        self.speculative.toggled.connect(self._update_enabled)
        self.temperature.valueChanged.connect(lambda _: self._update_enabled())
        self.proposer.currentIndexChanged.connect(lambda _: self._update_enabled())
        self._update_enabled()

    def _server_toggled(self, on: bool) -> None:
        self._update_enabled()
        if not on or self.server_url.text().strip():  # on, with no address yet: Connect loads
            self.models_changed.emit()

    def _context_edited(self) -> None:
        if 0 < self.context.value() < MIN_CONTEXT:
            self.context.setValue(MIN_CONTEXT)
        if self.context.value() != self._loaded_context:
            self.models_changed.emit()

    def show_max_context(self, tokens: int) -> None:
        """The loaded target's longest context: the most the context length may be set to."""
        if tokens:
            self.context.setMaximum(tokens)
            self.context.setToolTip(self.context.toolTip().split("\nThis model")[0] + f"\nThis model: up to {tokens:,}")
        self._loaded_context = self.context.value()

    def set_context_quietly(self, tokens: int) -> None:
        self.context.blockSignals(True)
        self.context.setValue(tokens)
        self.context.blockSignals(False)

    def show_gpus(self, gpus: tuple[tuple[str, str], ...]) -> None:
        """Each GPU torch sees as a device choice ("cuda:0" as "GPU 0: <its name>")."""
        for device, name in gpus:
            label = f"GPU {device.partition(':')[2]}: {name}" if device.startswith("cuda") else name
            index = self.device_choice.findData(device)
            if index < 0:
                self.device_choice.addItem(label, device)
            else:
                self.device_choice.setItemText(index, label)

    def select_device(self, device: str) -> None:
        """The device choice `device` (one saved before its GPU is listed is kept under its own name)."""
        if self.device_choice.findData(device) < 0:
            self.device_choice.addItem(device, device)
        select_quietly(self.device_choice, device)

    def show_device(self, text: str, on_gpu: bool) -> None:
        """The device the pair runs on; on a GPU the CPU's precision and cache pickers are greyed out."""
        self.device.setText(text)
        self._on_gpu = on_gpu
        self._update_enabled()

    def _update_enabled(self) -> None:
        served = self.on_server.isChecked()
        for picker, tooltip in self._cpu_pickers.items():  # a GPU runs each model as one float model
            picker.setEnabled(not self._on_gpu)
            picker.setToolTip(GPU_PRECISION if self._on_gpu else tooltip)
        for widget in (self.server_url, self.connect_server):
            widget.setEnabled(served)
        # only the rows that matter: a server's draft, precision and cache are its own
        for row in (self._draft_row, self._precision_row, self.kv_cache):
            self._models_form.setRowVisible(row, not served)
        self._models_form.setRowVisible(self._served_row, served)
        self.speculative.setEnabled(not served)
        on = self.speculative.isChecked() and not served
        for widget in (self.k, self.adaptive, self.proposer):
            widget.setEnabled(on)
        self.lookup.setEnabled(on and self.proposer.currentData() == ProposerKind.DRAFT_MODEL)
        for widget in (self.top_k, self.top_p, self.min_p):  # greedy decoding takes the likeliest token: no filter matters
            widget.setEnabled(self.temperature.value() > 0)

    def generation_options(self) -> GenerationOptions:
        return GenerationOptions(
            speculative=self.speculative.isChecked(),
            proposer=ProposerKind(self.proposer.currentData()),
            k=self.k.value(),
            adaptive=self.adaptive.isChecked(),
            sampling=SamplingParams(temperature=self.temperature.value(), top_k=self.top_k.value(),
                                    top_p=self.top_p.value(), min_p=self.min_p.value(),
                                    repeat_penalty=self.repeat_penalty.value()),
            seed=None if self.seed.value() == RANDOM_SEED else self.seed.value(),
            max_new_tokens=self.max_new_tokens.value(),
            lookup=DEFAULTS.lookup if self.lookup.isChecked() else 0,
        )

    def load_options(self) -> LoadOptions:
        return LoadOptions(target=self.target_source(), draft=self.draft_source(),
                           precision=Precision(self.precision.currentData()),
                           draft_precision=Precision(self.draft_precision.currentData()),
                           kv_cache=self.kv_cache.currentData(),
                           server=self.server_url.text().strip() if self.on_server.isChecked() else "",
                           server_model=self.server_model.currentText().strip() if self.on_server.isChecked() else "",
                           context_length=self.context.value(), device=self.device_choice.currentData())

    def preset_values(self) -> dict:
        """The settings a preset holds, as the controls show them (Preset's fields but the name and
        system prompt)."""
        values = {name: getattr(self, name).value() for name in PRESET_SPINS}
        values |= {name: getattr(self, name).isChecked() for name in PRESET_CHECKS}
        return values | {"proposer": ProposerKind(self.proposer.currentData()), "context_length": self.context.value()}

    def apply_preset(self, values: dict) -> bool:
        """Sets the controls to a preset's values (preset_values' keys); True when its context length
        differs from the loaded one (a reload is due)."""
        for name in PRESET_SPINS:
            getattr(self, name).setValue(values[name])
        for name in PRESET_CHECKS:
            getattr(self, name).setChecked(values[name])
        self.proposer.setCurrentIndex(max(self.proposer.findData(ProposerKind(values["proposer"])), 0))
        context = min(values["context_length"], self.context.maximum())
        self.set_context_quietly(context)
        return context != self._loaded_context

    def show_served(self, models: tuple[str, ...], chosen: str, state: str) -> None:
        """A server connected: the models it serves (the one in use chosen), and `state` in the tooltip."""
        self.server_model.blockSignals(True)
        self.server_model.clear()
        self.server_model.addItems(list(models))
        self.server_model.setCurrentText(chosen)
        self.server_model.blockSignals(False)
        self.show_server_state("connected", state)

    def show_server_state(self, state: str, details: str = "") -> None:
        """A word or two in the row (it must not widen the panel), the whole story in its tooltip."""
        self.server_state.setText(state)
        self.server_state.setToolTip(details)

    def load_pickers(self) -> tuple[tuple[QComboBox, str], ...]:
        """The pickers that choose what loads, with their LoadOptions field (also their setting's key)."""
        return ((self.target, "target"), (self.draft, "draft"), (self.precision, "precision"),
                (self.draft_precision, "draft_precision"), (self.kv_cache, "kv_cache"))

    def show_load_options(self, options: LoadOptions) -> None:
        """The pickers set to `options` without a load for each (the caller loads once)."""
        for combo, field_name in self.load_pickers():
            value = getattr(options, field_name)
            select_quietly(combo, getattr(value, "value", value))  # a Precision as its stored text
        # (a server that failed stays chosen, its address in view to be mended, while the local pair runs)

    def set_on_server_quietly(self, on: bool) -> None:
        self.on_server.blockSignals(True)
        self.on_server.setChecked(on)
        self.on_server.blockSignals(False)
        self._update_enabled()

    def target_source(self) -> str:
        return self.target.currentData()

    def draft_source(self) -> str:
        return self.draft.currentData()

    def add_source(self, label: str, source: str, missing: str | None = None) -> None:
        """missing: why the source's file or folder cannot be found (marked in the pickers)."""
        for combo in (self.target, self.draft):
            index = combo.findData(source)
            if index < 0:
                combo.addItem(label, source)
                if missing:
                    mark(combo, combo.count() - 1, MISSING, missing)
            elif not missing and combo.itemText(index).endswith((MISSING, UNREADABLE)):  # added again, found again
                combo.setItemText(index, label)
                combo.setItemData(index, None, Qt.ToolTipRole)

    def remove_source(self, source: str, missing: str | None = None) -> None:
        """A model out of both pickers, except where it is the one chosen; there `missing` (why its
        file is gone) marks it."""
        for combo in (self.target, self.draft):
            index = combo.findData(source)
            if index < 0:
                continue
            if index != combo.currentIndex():
                combo.blockSignals(True)  # the chosen one stays chosen: nothing to load
                combo.removeItem(index)
                combo.blockSignals(False)
            elif missing:
                mark(combo, index, MISSING, missing)

    def draft_sources(self) -> list[str]:
        return [self.draft.itemData(index) for index in range(self.draft.count())]

    def show_measured(self, speedups: dict[str, float]) -> None:
        """Each draft's last measured speed-up with the loaded target beside its name."""
        for index in range(self.draft.count()):
            text = MEASURED.sub("", self.draft.itemText(index))
            speedup = speedups.get(self.draft.itemData(index))
            if speedup is not None:
                marks = next((m for m in MARKS if text.endswith(m)), "")
                text = text[:len(text) - len(marks)] + f"  ({speedup:.2f}x measured)" + marks
            self.draft.setItemText(index, text)

    def mark_draft_incompatible(self, source: str, reason: str) -> None:
        """A draft whose vocabulary differs from the target's: marked and no longer offered."""
        index = self.draft.findData(source)
        if index < 0:
            return
        mark(self.draft, index, INCOMPATIBLE, reason)
        item = self.draft.model().item(index) if isinstance(self.draft.model(), QStandardItemModel) else None
        if item is not None:
            item.setEnabled(False)

    def clear_draft_marks(self) -> None:
        """Drafts marked for another vocabulary than the last target's offered again (a mark says
        nothing of a target of another family)."""
        for index in range(self.draft.count()):
            if self.draft.itemText(index).endswith(INCOMPATIBLE):
                self.draft.setItemText(index, self.draft.itemText(index).removesuffix(INCOMPATIBLE))
                self.draft.setItemData(index, None, Qt.ToolTipRole)
                if isinstance(self.draft.model(), QStandardItemModel):
                    self.draft.model().item(index).setEnabled(True)

    def mark_unreadable(self, source: str, reason: str) -> None:
        """A model whose tokenizer cannot be read (a damaged or foreign file): marked in both pickers
        but still offered, since the file may be mended; loading it names the reason again."""
        for combo in (self.target, self.draft):
            if (index := combo.findData(source)) >= 0:
                mark(combo, index, UNREADABLE, reason)


def mark(combo: QComboBox, index: int, suffix: str, reason: str) -> None:
    """The item's label followed by `suffix` (once), and `reason` as its tooltip."""
    if not combo.itemText(index).endswith(suffix):
        combo.setItemText(index, combo.itemText(index) + suffix)
    combo.setItemData(index, reason, Qt.ToolTipRole)


def select_quietly(combo: QComboBox, value) -> None:
    """The item holding `value` (the first when none does) chosen without a models_changed for it."""
    combo.blockSignals(True)
    combo.setCurrentIndex(max(combo.findData(value), 0))
    combo.blockSignals(False)
