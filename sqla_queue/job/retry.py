"""How long a failed job waits before its next attempt."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sqla_queue.errors import ConfigurationError


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter.

    The wait before attempt `n + 1` is `base * factor ** (n - 1)`, capped at `max_delay`,
    then spread by up to `jitter` (a fraction) either way, so failures that happened
    together do not retry together.
    """

    base: float = 2.0
    factor: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        numbers = (self.base, self.factor, self.max_delay, self.jitter)
        if (
            not all(math.isfinite(n) for n in numbers)
            or self.base < 0
            or self.factor < 1
            or self.max_delay < 0
            or not 0 <= self.jitter <= 1
        ):
            raise ConfigurationError(
                detail=f"invalid RetryPolicy {self!r}: need finite base >= 0, factor >= 1, "
                "max_delay >= 0 and 0 <= jitter <= 1"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1 for the first)."""
        exponent = max(attempt - 1, 0)
        # Cap the exponent first: factor ** 1000 would overflow a float.
        raw = self.base * self.factor ** min(exponent, 64)
        capped = min(raw, self.max_delay)
        spread = capped * self.jitter
        return max(0.0, capped + random.uniform(-spread, spread))


DEFAULT_RETRY = RetryPolicy()
