"""The FastAPI example's own table: an order, with a flag its background job sets."""

from __future__ import annotations

from sqlalchemy import Numeric, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "fastapi_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(Text)
    total: Mapped[float] = mapped_column(Numeric(10, 2))
    receipt_sent: Mapped[bool] = mapped_column(default=False)
