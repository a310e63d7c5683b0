"""The Hugging Face hub through `huggingface_hub`: finding models SpecChat can run (catalog.py),
fetching their files into the standard hub cache, resumably and checked (fetch.py), and the
models already there (local.py). No Qt: the window and `python -m app models` share it.

The hub's address is read at each call from `HF_ENDPOINT` (a mirror, or a stand-in on loopback
in the tests), the cache's from `HF_HUB_CACHE` / `HF_HOME`, as `huggingface_hub` reads them."""
