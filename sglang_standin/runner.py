"""Process lifecycle: "load" with the port closed, bind, warm up, drain on SIGTERM.

Real SGLang binds its port only after the model is loaded (clients see
connection refused, not an HTTP status), answers health 503 until warm-up
is done, and on SIGTERM keeps serving until its running requests are done,
answering health 503 meanwhile, then exits 0. The stand-in does the same so
that worker health gates and shutdown handling get tested for real.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType

import uvicorn

from sglang_standin.config import StandinConfig
from sglang_standin.server import build_app
from sglang_standin.state import StandinState

log = logging.getLogger("sglang_standin")
_DRAIN_POLL_SECONDS = 0.1


class StandinServer(uvicorn.Server):
    """uvicorn.Server with a ready log line and SGLang-like graceful SIGTERM."""

    def __init__(self, config: uvicorn.Config, state: StandinState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:
            return
        self._loop = asyncio.get_running_loop()
        self.state.lifecycle.mark_listening()
        cfg = self.state.cfg
        log.info("standin ready on http://%s:%d model=%s", cfg.host, self._bound_port(), cfg.model_path)

    def _bound_port(self) -> int:
        """The real port (differs from cfg.port when --port 0)."""
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.state.cfg.port

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        lifecycle = self.state.lifecycle
        if sig == signal.SIGTERM and self._loop is not None and not lifecycle.draining:
            lifecycle.draining = True  # health answers 503 from now on
            log.info("SIGTERM received: finishing %d running request(s), then exiting",
                     self.state.engine.running_count + self.state.engine.waiting_count)
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)  # SIGINT, or a second SIGTERM: uvicorn's way

    def _start_drain(self) -> None:
        assert self._loop is not None
        self._drain_task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        """Keep serving (like SGLang) until no request is being generated (a wedged engine never
        finishes them: it exits at once)."""
        engine, lifecycle, wedge = self.state.engine, self.state.lifecycle, self.state.wedge
        while (lifecycle.inflight or engine.running_count or engine.waiting_count) and not wedge.wedged:
            await asyncio.sleep(_DRAIN_POLL_SECONDS)
        self.should_exit = True  # uvicorn then closes connections; exit code 0


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")


def run(cfg: StandinConfig) -> None:
    """Run one stand-in server until it is told to stop."""
    configure_logging(cfg.log_level)
    if cfg.load_seconds > 0:
        log.info("loading (simulated) for %.1f s; the port stays closed", cfg.load_seconds)
        time.sleep(cfg.load_seconds)
    state = StandinState(cfg)
    config = uvicorn.Config(
        build_app(cfg, state),
        host=cfg.host,
        port=cfg.port,
        access_log=cfg.access_log,
        log_level="info" if cfg.access_log else "warning",
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=cfg.timeout_keep_alive,
        ssl_certfile=cfg.ssl_certfile,
        ssl_keyfile=cfg.ssl_keyfile,
    )
    StandinServer(config, state).run()
