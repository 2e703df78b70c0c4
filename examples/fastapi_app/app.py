"""A FastAPI app that enqueues in the request's own transaction, through an AsyncSession.

SQLA_QUEUE_DATABASE_URL=postgresql://... uvicorn examples.fastapi_app.app:app
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from sqla_queue import enqueue
from sqla_queue.db.database import normalize_url

from .models import Order
from .tasks import send_receipt


class OrderIn(BaseModel):
    email: str
    total: float


class OrderOut(BaseModel):
    id: int


async def request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """A session from the app's sessionmaker, closed after the request."""
    async with request.app.state.sessions() as session:
        yield session


router = APIRouter()


@router.post("/orders", status_code=201)
async def place_order(
    order_in: OrderIn, session: Annotated[AsyncSession, Depends(request_session)]
) -> OrderOut:
    async with session.begin():  # the request's transaction: the order and its job
        order = Order(email=order_in.email, total=order_in.total)
        session.add(order)
        await session.flush()
        enqueue(session, send_receipt.name, {"order_id": order.id})
        if order_in.total <= 0:  # raised after the enqueue: both roll back
            raise HTTPException(status_code=422, detail="the total must be positive")
    return OrderOut(id=order.id)


def create_app(database_url: str | None = None) -> FastAPI:
    """The app on `database_url` (default: SQLA_QUEUE_DATABASE_URL)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = normalize_url(database_url or os.environ["SQLA_QUEUE_DATABASE_URL"])
        engine = create_async_engine(url)
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        yield
        await engine.dispose()

    app = FastAPI(lifespan=lifespan)
    app.include_router(router)
    return app


app = create_app()  # reads SQLA_QUEUE_DATABASE_URL at startup
