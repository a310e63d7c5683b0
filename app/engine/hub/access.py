"""Where the hub and its cache are, and what went wrong with them, in one line."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelError

DEFAULT_ENDPOINT = "https://huggingface.co"


class HubError(ModelError):
    """The hub could not answer (no network, a gated or missing repository, a damaged download):
    its message is one line for the user."""


def endpoint() -> str:
    """The hub's address: HF_ENDPOINT as set now (huggingface_hub reads it once, at its import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_dir() -> Path:
    """The standard hub cache, as huggingface_hub finds it, read now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def api():
    """The hub's client, once the hub answers at all (see reachable)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import logging

    logging.set_verbosity_error()  # its retry warnings are no message for the user: ours is one line
    reachable()
    return HfApi(endpoint=endpoint())


def reachable(timeout: float = 5.0) -> None:
    """Raises HubError at once when the hub's host cannot be reached: huggingface_hub would retry
    a failed connection five times over 23 s before saying so."""
    import socket
    from urllib.parse import urlparse

    address = urlparse(endpoint())
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        socket.create_connection((address.hostname, port), timeout=timeout).close()
    except OSError as error:
        raise HubError(f"No connection to the hub ({address.netloc}): {error.strerror or type(error).__name__}; "
                       f"models already here keep working.") from error


def in_words(error: BaseException, what: str) -> HubError:
    """A hub or network error while doing `what` ("searching the hub for 'qwen'"), as one line."""
    from huggingface_hub import errors

    if isinstance(error, HubError):
        return error
    host = endpoint().split("://", 1)[-1]
    offline = (*_network("ConnectError"), *_network("ConnectTimeout"), getattr(errors, "OfflineModeIsEnabled", HubError))
    if isinstance(error, offline):
        return HubError(f"No connection to the hub ({host}) while {what}: models already here keep working.")
    if isinstance(error, _network("TimeoutException")):
        return HubError(f"The hub ({host}) did not answer in time while {what}; try again later.")
    if isinstance(error, errors.GatedRepoError):
        return HubError(f"That repository is gated: accept its terms on the hub and log in (`hf auth login`) "
                        f"before {what}.")
    if isinstance(error, errors.RepositoryNotFoundError):
        return HubError(f"No such repository on the hub (or it is private) while {what}.")
    if isinstance(error, (errors.EntryNotFoundError, errors.RevisionNotFoundError)):
        return HubError(f"No such file in that repository while {what}.")
    if isinstance(error, errors.HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "no answer"
        return HubError(f"The hub answered {status} while {what}.")
    if isinstance(error, _network("HTTPError")):
        return HubError(f"The connection to the hub ({host}) failed while {what} ({type(error).__name__}).")
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    return HubError(f"{what[0].upper()}{what[1:]} failed: {detail}")


def _network(name: str) -> tuple[type, ...]:
    """The exception class `name` of the HTTP clients huggingface_hub may use (httpx2 from its 2.x, httpx before)."""
    import importlib

    found = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)
