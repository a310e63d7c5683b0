"""Our API server, real: uvicorn on a free loopback port, in a thread of the test's process."""
import asyncio
import threading
import time

import uvicorn

from app.serve.server import ServerState, create_app


class RunningServer:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.app = create_app(state)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning"))
        self.server_loop = None  # the server's asyncio loop, for work a test puts on it
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def _serve(self) -> None:
        self.server_loop = asyncio.get_running_loop()
        await self.server.serve()

    def client(self, key: str = "none"):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
