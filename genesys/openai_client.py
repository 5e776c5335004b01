"""An async HTTP client for OpenAI-compatible servers: bounded concurrency, retries with backoff.

Used by the `openai` generation backend and by the LLM judge verifier.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class APIError(RuntimeError):
    """A request the server refused, or that still failed after every retry."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class OpenAIClient:
    """POSTs JSON to an OpenAI-compatible server: at most `concurrency` requests at once, retrying
    connection errors, 429 and 5xx with exponential backoff (honouring `Retry-After`).

    Use as an async context manager, inside the event loop that runs the requests.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        concurrency: int = 64,
        max_retries: int = 8,
        timeout: float = 600.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
    ) -> None:
        import httpx

        self.base_url = resolve_base_url(base_url)
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._semaphore = asyncio.Semaphore(concurrency)
        self._http = httpx.AsyncClient(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` (relative to the base URL) and return the JSON reply."""
        import httpx

        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            async with self._semaphore:
                try:
                    response = await self._http.post(path, json=body)
                except httpx.TransportError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code < 400:
                        return response.json()
                    problem = f"HTTP {response.status_code}: {response.text[:500]}"
                    if response.status_code not in RETRY_STATUS:
                        raise APIError(
                            f"{self.base_url}/{path} refused the request: {problem}", response.status_code
                        )
                    retry_after = _seconds(response.headers.get("retry-after"))
            if attempt == self.max_retries:
                break
            delay = min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + random.random() / 2)
            await asyncio.sleep(retry_after if retry_after is not None else delay)
        raise APIError(f"{self.base_url}/{path} failed after {self.max_retries + 1} attempts: {problem}")

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.post("chat/completions", body)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.post("completions", body)


def resolve_base_url(base_url: str | None) -> str:
    """The server address: `base_url`, else $OPENAI_BASE_URL, else a local server on port 8000."""
    return (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
