"""Under uvicorn: the scheduler runs in the FastAPI lifespan; uvicorn owns the signals.

DATABASE_URL=postgres://billing_svc@db/app uvicorn fastapi_service:app
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from prometheus_client import REGISTRY, generate_latest

import ticklease
from ticklease.prometheus import Collector

scheduler = ticklease.Scheduler(os.environ["DATABASE_URL"])


@scheduler.job("webhooks", 1.0)
async def webhooks(term: ticklease.Term) -> None: ...


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    REGISTRY.register(Collector(scheduler))
    running = asyncio.create_task(scheduler.run(handle_signals=False))
    yield
    scheduler.stop()  # uvicorn's shutdown: every term released as interrupted
    await running


app = FastAPI(lifespan=lifespan)


@app.get("/metrics")
async def metrics() -> Response:
    text = await asyncio.to_thread(generate_latest, REGISTRY)
    return Response(text, media_type="text/plain; version=0.0.4")
