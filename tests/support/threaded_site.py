"""An aiohttp application on a loopback socket, served from a thread and event loop of its own:
the scripted upstream fakes run in one so that a synchronous test (and a gateway in another
thread) can talk to them.

Stopping one leaves nothing behind: a loop stopped with a request handler still pending (a
scripted stream sleeping between chunks, an idle keep-alive connection waiting for its next
request) gets collected later, with that task in it, as asyncio's "Task was destroyed but it
is pending!" or an "Event loop is closed" error from the handler's coroutine, in whatever test
happens to run then. So every task is cancelled and awaited, and the loop closed, in its own
thread before `stop()` returns.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from contextlib import suppress

from aiohttp import web

# How long a request still in flight at `stop()` may take to finish before its handler is cancelled.
SHUTDOWN_TIMEOUT = 0.5


class ThreadedSite:
    def __init__(self, app: web.Application, ssl_context: ssl.SSLContext | None = None) -> None:
        self._app = app
        self._ssl = ssl_context
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> int:
        """Serve, and return the port once it listens."""
        self._thread.start()
        self._ready.wait(10)
        return self.port

    def stop(self) -> None:
        if self._runner is not None and self._thread.is_alive():
            with suppress(Exception):  # best effort at teardown: the loop's own exit cancels what is left
                asyncio.run_coroutine_threadsafe(self._shutdown(self._runner), self._loop).result(SHUTDOWN_TIMEOUT + 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            runner = self._runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self._ssl)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()
            self._loop.run_forever()
        finally:  # whatever `_shutdown` did not get to (it timed out, or failed): cancelled and awaited here
            self._loop.run_until_complete(_cancel_pending())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    @staticmethod
    async def _shutdown(runner: web.AppRunner) -> None:
        """Close the listener and every connection; a handler still running after SHUTDOWN_TIMEOUT is cancelled."""
        await runner.cleanup()
        await _cancel_pending()


async def _cancel_pending() -> None:
    """Cancel every other task of the running loop (handlers still sleeping in a scripted hang), and await them."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
