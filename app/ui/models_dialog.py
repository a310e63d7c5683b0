"""The Models dialog (Get models... beside the target picker, Find the best draft beside the draft
picker): the hub searched and its files fetched (with progress, cancel and resume),
the models on this machine with what removing them frees, and the drafts for the loaded target,
with the draft finder's measured ranking and *Use this pair*. The work is the Qt-free
chat.model_library's; this only shows it and hands the user's choices on."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QMessageBox,
                               QProgressBar, QPushButton, QTableWidget, QTableWidgetItem, QTabWidget, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from ..chat.model_library import DraftOption, FileOffer, ModelLibrary, RepoOffer, size_words
from ..engine.api import DEFAULT_MODELS, LOOKUP

DRAFTS_TAB = 2
RANKED_COLUMNS = ["", "Draft", "Speed-up", "Decode", "Accepted", "Tokens/pass", "Memory", "Identical"]
DRAFT_COLUMNS = ["Draft", "Size", "Cost vs target", "Last measured", "Pairs with the target"]


def duration_words(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown"
    return f"{seconds:.0f} s left" if seconds < 90 else f"{seconds / 60:.0f} min left"


def label(source: str) -> str:
    return source if source in DEFAULT_MODELS else source.rstrip("/").rsplit("/", 1)[-1]


class ModelsDialog(QDialog):
    use_as_target = Signal(str)  # a source to add to the pickers and load as the target
    use_as_draft = Signal(str)  # the same as the draft (LOOKUP: prompt lookup, no draft model)
    add_to_pickers = Signal(list)  # sources of models on this machine
    remove_from_pickers = Signal(list)  # the same, out of the pickers (their files stay)
    deleted = Signal(list)  # sources no longer on disk: out of the pickers

    def __init__(self, library: ModelLibrary, draft_sources, added_sources, parent: QWidget | None = None) -> None:
        """draft_sources() -> the sources the draft picker offers (what pairing checks);
        added_sources() -> the models added to the pickers by path."""
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.library, self.draft_sources, self.added_sources = library, draft_sources, added_sources
        self.tabs = QTabWidget()
        self.tabs.addTab(self._get_tab(), "Get models")
        self.tabs.addTab(self._local_tab(), "On this machine")
        self.tabs.addTab(self._drafts_tab(), "Drafts for the target")
        self.tabs.currentChanged.connect(lambda tab: tab == DRAFTS_TAB and self.refresh_drafts())
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        library.found.connect(self._show_found)
        library.search_failed.connect(lambda message: self._searched(message))
        library.pull_progress.connect(self._show_progress)
        library.pulled.connect(self._pulled)
        library.pull_stopped.connect(self._pull_stopped)
        library.drafts_listed.connect(self._show_drafts)
        library.rank_progress.connect(self.rank_state.setText)
        library.ranked.connect(self._show_ranked)
        library.rank_failed.connect(lambda message: self._ranking_ended(message))
        self.resize(900, 560)

    # ---- Get models -------------------------------------------------------------------------------
    def _get_tab(self) -> QWidget:
        page = QWidget()
        self.query = QLineEdit(placeholderText="keywords, user/model, or a hub URL")
        self.query.setAccessibleName("Search the hub")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.search_state = QLabel("GGUF files, and folders of the architectures SpecChat runs.")
        self.search_state.setWordWrap(True)
        self.found = QTreeWidget()
        self.found.setHeaderLabels(["Repository / file", "Quantisation", "Size", "This machine", "Here"])
        self.found.setAccessibleName("Models found on the hub")
        self.found.header().setSectionResizeMode(0, QHeaderView.Stretch)
        self.found.itemSelectionChanged.connect(self._pull_controls)
        self.download = QPushButton("Download")
        self.download.clicked.connect(self.pull_selected)
        self.cancel = QPushButton("Cancel download")
        self.cancel.clicked.connect(self.library.cancel_pull)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download progress")
        self.progress_state = QLabel()
        self.progress_state.setWordWrap(True)
        self.as_target, self.as_draft = QPushButton("Use as target"), QPushButton("Use as draft")
        self.fetched: str | None = None
        self.as_target.clicked.connect(lambda: self.use_as_target.emit(self.fetched))
        self.as_draft.clicked.connect(lambda: self.use_as_draft.emit(self.fetched))
        search_row, download_row, use_row = QHBoxLayout(), QHBoxLayout(), QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.search_button)
        for widget in (self.download, self.cancel):
            download_row.addWidget(widget)
        download_row.addWidget(self.progress, 1)
        use_row.addWidget(self.progress_state, 1)
        use_row.addWidget(self.as_target)
        use_row.addWidget(self.as_draft)
        layout = QVBoxLayout(page)
        layout.addLayout(search_row)
        layout.addWidget(self.search_state)
        layout.addWidget(self.found, 1)
        layout.addLayout(download_row)
        layout.addLayout(use_row)
        self._pull_controls()
        return page

    def search(self) -> None:
        if self.query.text().strip():
            self.search_state.setText(f"Searching the hub for '{self.query.text().strip()}'...")
            self.search_button.setEnabled(False)
            self.library.search(self.query.text())

    def _searched(self, state: str) -> None:
        self.search_button.setEnabled(True)
        self.search_state.setText(state)

    def _show_found(self, repos: list[RepoOffer]) -> None:
        self.found.clear()
        for repo in repos:
            notes = ", ".join(n for n in ("gated: accept its terms on the hub" if repo.gated else "",
                                          f"{repo.downloads:,} downloads" if repo.downloads else "") if n)
            top = QTreeWidgetItem([repo.id + (f"  ({notes})" if notes else ""), "", "", "", ""])
            for offer in repo.files:
                fits = "fits" if offer.too_big is None else f"too big: {offer.too_big}"
                child = QTreeWidgetItem([offer.name or "(transformers folder)", offer.quantization or "",
                                         size_words(offer.size), fits, "yes" if offer.here else ""])
                child.setData(0, Qt.UserRole, offer)
                child.setToolTip(3, fits)
                top.addChild(child)
            self.found.addTopLevelItem(top)
            top.setExpanded(True)
        self._searched(f"{len(repos)} repositories SpecChat can run." if repos else
                       f"Nothing SpecChat can run matches '{self.query.text().strip()}'.")

    def offer(self) -> FileOffer | None:
        item = self.found.currentItem()
        return item.data(0, Qt.UserRole) if item is not None else None

    def pull_selected(self) -> None:
        offer = self.offer()
        if offer is not None:
            self._pull(offer.repo_id, offer.name)

    def _pull(self, repo_id: str, name: str | None) -> None:
        """Starts a download (none while another runs), its progress shown on the Get models tab."""
        if self.library.pull(repo_id, name):
            self.tabs.setCurrentIndex(0)
            self.progress.setRange(0, 0)
            self.progress_state.setText(f"Fetching {name or repo_id}...")
            self._pull_controls()

    def _show_progress(self, name: str, progress) -> None:
        if progress.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * progress.done / progress.total))
        self.progress_state.setText(f"{name}: {size_words(progress.done)} of {size_words(progress.total)}, "
                                    f"{size_words(int(progress.bytes_per_second))}/s, {duration_words(progress.seconds_left)}")

    def _pulled(self, source: str) -> None:
        self.fetched = source
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.progress_state.setText(f"Ready: {source}")
        self._pull_controls()
        self.refresh_local()
        self._mark_here()

    def _pull_stopped(self, message: str) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress_state.setText(message)
        self._pull_controls()
        self.refresh_local()

    def _pull_controls(self) -> None:
        pulling = self.library.pulling
        self.download.setEnabled(not pulling and self.offer() is not None)
        self.cancel.setEnabled(pulling)
        for button in (self.as_target, self.as_draft):
            button.setEnabled(not pulling and self.fetched is not None)

    def _mark_here(self) -> None:
        """The fetched file marked here in the search's listing."""
        for index in range(self.found.topLevelItemCount()):
            top = self.found.topLevelItem(index)
            for child_index in range(top.childCount()):
                child = top.child(child_index)
                offer = child.data(0, Qt.UserRole)
                if offer and self.fetched and (offer.name or "config.json") in self.fetched + "/config.json":
                    child.setText(4, "yes")

    # ---- On this machine --------------------------------------------------------------------------
    def _local_tab(self) -> QWidget:
        page = QWidget()
        self.local = QTreeWidget()
        self.local.setHeaderLabels(["Model", "On disk", "Unfinished download"])
        self.local.setAccessibleName("Models on this machine")
        self.local.header().setSectionResizeMode(0, QHeaderView.Stretch)
        self.local_state = QLabel()
        self.local_state.setWordWrap(True)
        self.add_local = QPushButton("Add to the pickers")
        self.remove_local = QPushButton("Remove from the pickers")
        self.delete_local = QPushButton("Delete from disk...")
        self.add_local.clicked.connect(self._add_selected_local)
        self.remove_local.clicked.connect(self._remove_selected_local)
        self.delete_local.clicked.connect(self.delete_selected_local)
        buttons = QHBoxLayout()
        buttons.addWidget(self.local_state, 1)
        for button in (self.add_local, self.remove_local, self.delete_local):
            buttons.addWidget(button)
        layout = QVBoxLayout(page)
        layout.addWidget(self.local, 1)
        layout.addLayout(buttons)
        self.refresh_local()
        return page

    def refresh_local(self) -> None:
        """The hub cache's models by repository, then the models added by path (Add model...)."""
        self.local.clear()
        in_cache = []
        for repo_id, on_disk, unfinished, sources in self.library.local_models():
            self._local_item(repo_id, sources, [repo_id, size_words(on_disk), size_words(unfinished) if unfinished else ""])
            in_cache += sources
        added = [source for source in self.added_sources() if source not in in_cache]
        if added:
            self._local_item(None, added, ["Added from disk (Add model...)", "", ""])

    def _local_item(self, repo_id: str | None, sources: list[str], cells: list[str]) -> None:
        """repo_id: the hub cache repository (None: models added by path, not deleted from here)."""
        top = QTreeWidgetItem(cells)
        top.setData(0, Qt.UserRole, (repo_id, sources))
        for source in sources:
            child = QTreeWidgetItem([source, "", ""])
            child.setData(0, Qt.UserRole, (repo_id, [source]))
            top.addChild(child)
        self.local.addTopLevelItem(top)
        top.setExpanded(True)

    def _selected_local(self) -> tuple[str | None, list[str]] | None:
        item = self.local.currentItem()
        return item.data(0, Qt.UserRole) if item is not None else None

    def _add_selected_local(self) -> None:
        selected = self._selected_local()
        if selected and selected[1]:
            self.add_to_pickers.emit(selected[1])
            self.local_state.setText(f"In the pickers: {', '.join(label(s) for s in selected[1])}")

    def _remove_selected_local(self) -> None:
        selected = self._selected_local()
        if selected and selected[1]:
            self.remove_from_pickers.emit(selected[1])
            self.local_state.setText(f"Out of the pickers (the files stay): {', '.join(label(s) for s in selected[1])}")
            self.refresh_local()

    def delete_selected_local(self) -> None:
        selected = self._selected_local()
        if selected is None:
            return
        repo_id, sources = selected
        if repo_id is None:
            self.local_state.setText("Only models in the hub cache are deleted here; a file added by path stays "
                                     "where it is (Remove from the pickers takes it out of the list).")
            return
        asked = QMessageBox.question(self, "Delete from disk", f"Delete {repo_id} from the hub cache?")
        if asked != QMessageBox.Yes:
            return
        freed, said = self.library.remove(repo_id)
        self.local_state.setText(said)
        if freed is not None:
            self.deleted.emit(sources)
            self.refresh_local()

    # ---- Drafts for the target --------------------------------------------------------------------
    def _drafts_tab(self) -> QWidget:
        page = QWidget()
        self.drafts_state = QLabel("Load a target to see the drafts that pair with it.")
        self.drafts_state.setWordWrap(True)
        self.drafts = self._table(DRAFT_COLUMNS, "Drafts for the target")
        self.fetch_draft = QPushButton("Fetch this draft")
        self.fetch_draft.clicked.connect(self._fetch_hub_draft)
        self.find_best = QPushButton("Find the best draft")
        self.find_best.setToolTip("Measures every compatible draft and prompt lookup against plain decoding on this\n"
                                  "machine: 3 prompts (your latest questions, or a built-in mix) x 64 tokens each")
        self.find_best.clicked.connect(self.find_best_draft)
        self.rank_state = QLabel()
        self.rank_state.setWordWrap(True)
        self.ranking = self._table(RANKED_COLUMNS, "Drafts ranked by measured speed-up")
        self.use_pair = QPushButton("Use this pair")
        self.use_pair.setEnabled(False)
        self.use_pair.clicked.connect(self._use_ranked)
        buttons, ranked = QHBoxLayout(), QHBoxLayout()
        buttons.addWidget(self.drafts_state, 1)
        buttons.addWidget(self.fetch_draft)
        buttons.addWidget(self.find_best)
        ranked.addWidget(self.rank_state, 1)
        ranked.addWidget(self.use_pair)
        layout = QVBoxLayout(page)
        layout.addWidget(self.drafts, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.ranking, 1)
        layout.addLayout(ranked)
        self.draft_options: list[DraftOption] = []
        self.rank_when_listed = False  # Find the best draft: measures once the drafts are checked
        self.ranked_rows: list = []
        return page

    @staticmethod
    def _table(columns: list[str], name: str) -> QTableWidget:
        """A read-only table of whole-row, single selections, named for screen readers."""
        table = QTableWidget(0, len(columns))
        table.setHorizontalHeaderLabels(columns)
        table.setAccessibleName(name)
        table.setSelectionBehavior(QAbstractItemView.SelectRows)
        table.setSelectionMode(QAbstractItemView.SingleSelection)
        table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        table.verticalHeader().hide()
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        table.horizontalHeader().setStretchLastSection(True)
        return table

    def refresh_drafts(self, search_hub: bool = True) -> None:
        self.drafts_state.setText("Checking which drafts pair with the target...")
        self.library.list_drafts(self.draft_sources(), search_hub)

    def _show_drafts(self, options: list[DraftOption], hub_note: str) -> None:
        self.draft_options = options
        self.drafts.setRowCount(len(options))
        for row, option in enumerate(options):
            pairs = ("on the hub: fetch it, then its vocabulary is checked" if option.on_hub else
                     "yes" if option.reason is None else f"no: {option.reason}")
            cells = [label(option.source) + (f" ({option.on_hub})" if option.on_hub else ""), size_words(option.size),
                     f"{option.cost_ratio:.2f}x" if option.cost_ratio else "?",
                     f"{option.measured:.2f}x" if option.measured else "", pairs]
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(option.reason or option.source)
                self.drafts.setItem(row, column, item)
        compatible = sum(o.reason is None and not o.on_hub for o in options)
        pairing = f"{compatible} drafts here pair" if compatible != 1 else "1 draft here pairs"
        self.drafts_state.setText(f"{pairing} with the target. {hub_note}".strip())
        if self.rank_when_listed:
            self.rank_when_listed = False
            self.find_best_draft()

    def _fetch_hub_draft(self) -> None:
        row = self.drafts.currentRow()
        option = self.draft_options[row] if 0 <= row < len(self.draft_options) else None
        if option is not None and option.on_hub:
            self._pull(option.source, option.on_hub)

    def compatible_drafts(self) -> list[str]:
        return [LOOKUP, *(o.source for o in self.draft_options if o.reason is None and not o.on_hub)]

    def find_best_draft(self) -> None:
        drafts = self.compatible_drafts()
        if self.library.rank(drafts):
            self.find_best.setEnabled(False)
            self.use_pair.setEnabled(False)
            self.rank_state.setText(f"Measuring {len(drafts)} candidates against plain decoding (after the answer "
                                    "running now, if any)...")
        else:
            self.rank_state.setText("Load a target on this machine first.")

    def _show_ranked(self, ranked: list) -> None:
        self.ranked_rows = ranked
        self.ranking.setRowCount(len(ranked))
        place = 0
        for row, result in enumerate(ranked):
            if result.speedup is None:
                cells = ["-", label(result.draft), f"not measured: {result.note}", "", "", "", "", ""]
            else:
                place += 1
                cells = [str(place), label(result.draft), f"{result.speedup:.2f}x", f"{result.decode_speedup or 0:.2f}x",
                         f"{result.acceptance or 0:.0%}", f"{result.tokens_per_pass or 0:.2f}",
                         size_words(result.memory_bytes) if result.memory_bytes else "-",
                         {True: "yes", False: "NO", None: "-"}[result.identical]]
            for column, text in enumerate(cells):
                self.ranking.setItem(row, column, QTableWidgetItem(text))
        if ranked and ranked[0].speedup is not None:
            self.ranking.selectRow(0)
            best = ranked[0]
            verdict = "pays" if best.speedup >= 1 else "does not pay: plain decoding is faster here"
            self._ranking_ended(f"Best: {label(best.draft)}, {best.speedup:.2f}x ({verdict}).")
        else:
            self._ranking_ended("No candidate could be measured.")
        self.refresh_drafts(search_hub=False)

    def _ranking_ended(self, state: str) -> None:
        self.rank_state.setText(state)
        self.find_best.setEnabled(True)
        self.use_pair.setEnabled(any(r.speedup is not None for r in self.ranked_rows))

    def _use_ranked(self) -> None:
        row = self.ranking.currentRow()
        if 0 <= row < len(self.ranked_rows) and self.ranked_rows[row].speedup is not None:
            self.use_as_draft.emit(self.ranked_rows[row].draft)
