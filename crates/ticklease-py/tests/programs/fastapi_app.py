"""A FastAPI service whose lifespan runs the scheduler (uvicorn owns the signals): ``uvicorn fastapi_app:app``.
Reads TICKLEASE_URL and TICKLEASE_ROLE; prints ``leading <token>`` and, at shutdown, ``stopped <all_released>``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import ticklease

scheduler = ticklease.Scheduler(os.environ["TICKLEASE_URL"], config=ticklease.Config.scaled_down(5))


@scheduler.job(os.environ["TICKLEASE_ROLE"], 0.05)
async def hold(term: ticklease.Term) -> None:
    print(f"leading {term.token}", flush=True)
    await term.cancelled()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    running = asyncio.create_task(scheduler.run(handle_signals=False))
    yield
    scheduler.stop()
    stopped = await running
    print(f"stopped {stopped.all_released}", flush=True)


app = FastAPI(lifespan=lifespan)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
