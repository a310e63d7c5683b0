"""The models in memory and the engine built on them, loaded one request at a time.

The window asks for a model pair every time the user changes a picker; loads run on worker
threads. Loads are serialised by a lock (two threads never mutate the cache together) and each
request has a ticket: a request superseded by a newer one returns None instead of an engine,
so an older load that finishes last can never replace the newer choice.

torch and transformers are imported by the first load, on its thread: the window that holds a
ModelPool opens without waiting for them.

While a pair loads, a marker file names it. A load that ends the process (a crash in native code,
the system's out-of-memory killer) leaves the marker behind, so that the next start can say which
pair it was and not load it again blindly.
"""
from __future__ import annotations

import gc
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .choices import LoadOptions, Precision
from .files import write_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .engine import SpeculativeEngine
    from .models.loading import LoadedModel
    from .remote.engine import RemoteEngine

Report = Callable[[str, float | None], None]


class ModelPool:
    def __init__(self, load=None, saved_caches: Path | None = None, load_marker: Path | None = None) -> None:
        """load: models.load_model's signature (its default); saved_caches: where the engines keep
        copies of their caches between runs (none: not kept); load_marker: the file that names the
        pair while it loads (none: no marker)."""
        self.load = load
        self.saved_caches = saved_caches
        self.load_marker = load_marker
        self.crashed_load = _left_marker(load_marker)  # {"target", "draft"}: a load an earlier run died in
        self.device_text: str | None = None  # in words for the UI, once the first load picked the device
        self.on_gpu = False  # the last pair runs on a GPU: one float model each, whatever the precision
        self.gpus: list[tuple[str, str]] = []  # (device, name) of each GPU torch sees, once the first load looked
        # (source, precision (None on a GPU), device) -> model
        self.models: dict[tuple[str, Precision | None, str], LoadedModel] = {}
        self.tokenizers: dict[str, PreTrainedTokenizerBase] = {}  # of every model loaded, kept after it goes (small)
        self._lock = threading.Lock()
        self._ticket = 0

    def request(self) -> int:
        """A ticket for a new load; every earlier ticket becomes stale."""
        self._ticket += 1
        return self._ticket

    def is_current(self, ticket: int) -> bool:
        return ticket == self._ticket

    def engine(self, ticket: int, chosen: LoadOptions, report: Report) -> SpeculativeEngine | RemoteEngine | None:
        """Loads what `chosen` needs (keeping models already loaded), builds and calibrates the
        engine; None when a newer request arrived meanwhile. Raises ModelError for bad models (a
        ServerError for a server that cannot serve). A draft whose vocabulary differs from the
        target's is dropped (SpeculativeEngine.for_pair)."""
        from .calibration import calibrate_remembered
        from .engine import SpeculativeEngine
        from .devices import gpus, pick_device, release_cached
        from .models.loading import load_model

        if chosen.server:
            return self._served(ticket, chosen, report)
        with self._lock:
            device, dtype, self.device_text = pick_device(chosen.device)
            self.gpus = gpus()
            self.on_gpu = device.type != "cpu"
            if not self.is_current(ticket):
                return None
            picked = [(chosen.target, chosen.precision), (chosen.draft, chosen.draft_precision)]
            # a GPU runs every precision as the one float model: a picker's change reloads nothing
            keys = [(source, precision if device.type == "cpu" else None, str(device)) for source, precision in picked]
            replaced = [key for key in self.models if key not in keys]
            for key in replaced:
                del self.models[key]  # free a replaced model before loading the next
            if replaced:
                gc.collect()  # the engine that used it went with the window's last reference
                release_cached(device)  # on a GPU: its memory back for the next model
            self._mark(chosen)
            try:
                for key, (source, precision) in zip(keys, picked):
                    if key not in self.models:  # checked for memory beside the model already loaded
                        held = sum(model.memory_bytes for model in self.models.values())
                        self.models[key] = (self.load or load_model)(source, device, dtype, report, precision=precision,
                                                                     held=held)
                        self.tokenizers[source] = self.models[key].tokenizer
                    if not self.is_current(ticket):
                        return None
                self.models[keys[0]].context_limit = chosen.context_length
                engine = SpeculativeEngine.for_pair(self.models[keys[0]], self.models[keys[1]],
                                                    chosen.draft_vocabulary, chosen.kv_cache_dtype)
                if chosen.context_length:
                    engine.check_context_fits()
                if engine.draft_refused:
                    del self.models[keys[1]]  # a draft of another vocabulary: its memory back
                report("Measuring draft and verification costs", None)
                calibrate_remembered(engine)  # the models' first passes: a native crash shows here too
            finally:  # an error the window reports is no crash
                self._mark(None)
            if self.saved_caches is not None:
                engine.keep_saved_caches(self.saved_caches)
            return engine if self.is_current(ticket) else None

    def tokenizer(self, source: str) -> PreTrainedTokenizerBase:
        """A model's tokenizer: kept from its load, else read alone (ModelError when it cannot be)."""
        if source not in self.tokenizers:
            from .models.loading import load_tokenizer

            self.tokenizers[source] = load_tokenizer(source)
        return self.tokenizers[source]

    def _served(self, ticket: int, chosen: LoadOptions, report: Report) -> RemoteEngine | None:
        """The target on a server: the local models go (their memory back), the chosen target's
        tokenizer stays here to build prompts."""
        from .models.loading import load_tokenizer
        from .remote.engine import RemoteEngine

        with self._lock:
            report(f"Connecting to {chosen.server}", None)
            tokenizer = load_tokenizer(chosen.target)
            engine = RemoteEngine.connect(chosen.server, chosen.server_model or None, tokenizer,
                                          os.environ.get("SPECCHAT_SERVER_KEY") or None, chosen.target)
            self.models.clear()  # connected: the local models' memory back (a failed connect keeps them)
            self.device_text, self.on_gpu = f"a server ({engine.served_by})", False
            return engine if self.is_current(ticket) else None

    def closing(self) -> None:
        """The app closes while a load may run (it is left behind): that is no crash to report."""
        self._mark(None)

    def _mark(self, chosen: LoadOptions | None) -> None:
        if self.load_marker is None:
            return
        try:
            if chosen is None:
                self.load_marker.unlink(missing_ok=True)
            else:
                write_text(self.load_marker, json.dumps({"target": chosen.target, "draft": chosen.draft,
                                                         "pid": os.getpid()}))
        except OSError:  # a read-only or full disk: loads go on unmarked
            pass


def _left_marker(path: Path | None) -> dict | None:
    """The pair an earlier run was loading when it died; None when there is none (or it is this one's)."""
    try:
        left = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(left, dict) or left.get("pid") == os.getpid():
        return None
    return {"target": str(left.get("target")), "draft": str(left.get("draft"))}
