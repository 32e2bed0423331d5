"""The test API server and the operator, each on an event loop in a thread of its own.

Used by `tests/operator/` and `tessera bench reconcile`. kopf treats every task of its loop
as its own and the `kubernetes` client blocks, so the API server cannot share a loop with
either; here each runs in a daemon thread and is stopped (and joined) explicitly.
`ApiServerThread.call()` runs a function on the server's loop, so readers never race
with its writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import kmock

from tessera import crd
from tessera_operator import config, runner
from tessera_operator.testing import apiserver

T = TypeVar("T")


class ApiServerThread:
    """`apiserver.ApiServer` behind KMock's HTTP server on 127.0.0.1 (random port)."""

    def __init__(self, crd_files: list[Path] | None = None) -> None:
        self.crds = [crd.load(p) for p in (crd_files or [crd.default_path()])]
        self.url = ""
        self.server: apiserver.ApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kmock-apiserver", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with apiserver.ApiServer(crds=self.crds) as srv, kmock.Server(srv) as http:
            self.server = srv
            self.url = str(http.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self, timeout: float = 30.0) -> ApiServerThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the test API server did not start: {self._error!r}")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def call(self, fn: Callable[[apiserver.ApiServer], T], timeout: float = 10.0) -> T:
        """Run `fn(server)` on the server's loop and return its result."""
        assert self._loop is not None and self.server is not None
        server = self.server

        async def run() -> T:
            return fn(server)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def usage(self) -> set[tuple[str, str, str]]:
        return self.call(lambda s: set(s.usage))

    def counts(self) -> dict[tuple[str, str, str], int]:
        """The operator's requests so far by (verb, apiGroup, resource)."""
        return self.call(lambda s: dict(s.counts))

    def __enter__(self) -> ApiServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OperatorThread:
    """The operator (`runner.serve`) against `cfg.api_server`, until `stop()`."""

    def __init__(self, cfg: config.OperatorConfig) -> None:
        self.cfg = cfg
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, name="tessera-operator", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(runner.serve(self.cfg, stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as exc:
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)

    def start(self, timeout: float = 30.0) -> OperatorThread:
        self._thread.start()
        while not self._ready.wait(0.05):
            if self._done.done():
                self._done.result()  # raises the operator's error
                raise RuntimeError("the operator exited before it was ready")
            timeout -= 0.05
            if timeout <= 0:
                raise RuntimeError("the operator did not become ready")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the operator did not stop")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> OperatorThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
