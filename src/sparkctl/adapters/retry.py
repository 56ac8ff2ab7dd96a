"""Retries for adapter calls: only errors marked transient, with exponential backoff (tenacity)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from sparkctl.errors import SparkctlError

F = TypeVar("F", bound=Callable)


def transient(attempts: int = 3, *, first_wait: float = 0.5) -> Callable[[F], F]:
    """Retry the call while it raises a transient SparkctlError; re-raise the last one."""
    return retry(
        retry=retry_if_exception(lambda e: isinstance(e, SparkctlError) and e.transient),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=first_wait, max=8.0),
        reraise=True,
    )
