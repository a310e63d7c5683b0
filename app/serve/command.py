"""`python -m app serve`: the API on a port of its own, the models loading behind it (503 until
they are ready)."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

from ..engine.api import ModelError, ModelPool, Turns, in_thread
from ..engine.flags import generation_options, load_options
from .guard import Access, is_loopback, parse_origins
from .server import ServerState, create_app


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    key = args.api_key or os.environ.get("SPECCHAT_API_KEY") or None
    if not is_loopback(args.host) and key is None:
        print(f"error: serving on {args.host} would let anyone who can reach this machine use it; give an API key "
              "(--api-key or SPECCHAT_API_KEY), or serve on 127.0.0.1", file=sys.stderr)
        return 2
    loaded = {}
    access = Access(key, parse_origins(" ".join(args.allow_origin or [])), args.host)
    state = ServerState(lambda: loaded.get("engine"), args.target,
                        generation_options(args, max_new_tokens=args.max_new_tokens), access, Turns(args.queue))
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning"))
    progress = lambda stage, fraction: print(f"  {stage}" + (f" {fraction:.0%}" if fraction is not None else ""),
                                             file=sys.stderr, flush=True)
    outcome = {"code": 0}

    async def load() -> None:
        models = ModelPool()
        try:
            engine = await in_thread("load", lambda: models.engine(models.request(), load_options(args), progress))
        except ModelError as error:
            print(f"error: {error}", file=sys.stderr)
            outcome["code"], server.should_exit = 2, True
            return
        state.model_name = engine.target.name
        loaded["engine"] = engine
        print(f"ready: {engine.target.name} ({engine.target.label})"
              + (f", draft {engine.draft.name} ({engine.draft.label})" if engine.draft else "")
              + f" on {models.device_text}", file=sys.stderr, flush=True)

    async def main() -> None:
        print(f"SpecChat serves an OpenAI-compatible API on http://{args.host}:{args.port}/v1 "
              "(the models load meanwhile; requests get 503 until they are ready)", file=sys.stderr, flush=True)
        loading = asyncio.get_running_loop().create_task(load())
        await server.serve()
        loading.cancel()

    asyncio.run(main())
    return outcome["code"] or (1 if not server.started else 0)
