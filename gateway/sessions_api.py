"""The session endpoints (``/v1/sessions...``) and the inspector page (``/ui``).

A caller sees only its own tenant's sessions (the tenant comes from its API key, as for
every other request); someone else's session is as unknown as one that never existed: 404.
Errors take OpenAI's shape.

No ``from __future__ import annotations`` here: Ray Serve's ingress resolves these route
signatures at run time.
"""

from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib import resources
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway import session_view
from gateway.config import GatewayConfig
from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import openai_error_body
from gateway.fold.renderer import Renderer
from gateway.http_errors import ERRORS, ErrorRule, error_response
from gateway.identity import resolve_tenant
from gateway.pipeline import Pipeline
from store import NotFound, StoreUnavailable

UI_FILES = {"": ("index.html", "text/html"), "inspector.js": ("inspector.js", "text/javascript")}

SESSION_ERRORS = {
    **ERRORS,
    NotFound: ErrorRule(404, "not_found_error"),
    session_view.NoSuchRequest: ErrorRule(404, "not_found_error"),
    StoreUnavailable: replace(ERRORS[StoreUnavailable], kind="api_error"),
}


class SessionEndpoints:
    """The handlers; ``pipeline`` gives the app's pipeline once its lifespan started it;
    ``shown`` is what a client may see of a built answer (replica labels, not URLs)."""

    def __init__(
        self, pipeline: Callable[[], Pipeline], config: GatewayConfig, shown: Callable[[Any], Any]
    ) -> None:
        self.pipeline = pipeline
        self.config = config
        self.shown = shown

    def routes(self) -> list[tuple[str, Callable[..., Awaitable[Response]]]]:
        """(path, handler) of each GET route; the render route before the detail route,
        since a session id may contain slashes (``:path``)."""
        routes = [
            ("/v1/sessions", self.list_sessions),
            ("/v1/sessions/{session_id:path}/render", self.render),
            ("/v1/sessions/{session_id:path}", self.show),
        ]
        if self.config.ui:
            routes += [("/ui", self.ui), ("/ui/{name}", self.ui)]
        return routes

    async def list_sessions(self, request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            data = await session_view.summaries(self.pipeline().store, tenant)
            return {"object": "list", "data": data}

        return await self.answer(request, build)

    async def render(self, session_id: str, request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            number = int_param(request, "request", required=True)
            branch = int_param(request, "branch", required=False)
            p = self.pipeline()
            budget = p.tenants.settings(tenant).budget

            def renderer_for(strategy: str, fold: str) -> Renderer:
                return p.renderer(tenant, strategy, fold, budget)

            return await session_view.request_view(
                p.store, renderer_for, tenant, known(session_id), number, branch
            )

        return await self.answer(request, build)

    async def show(self, session_id: str, request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            branch = int_param(request, "branch", required=False)
            store = self.pipeline().store
            return await session_view.detail(store, tenant, known(session_id), branch)

        return await self.answer(request, build)

    async def ui(self, name: str = "") -> Response:
        if name not in UI_FILES:
            return Response(status_code=404)
        filename, media_type = UI_FILES[name]
        body = resources.files("gateway").joinpath("ui", filename).read_bytes()
        return Response(body, media_type=media_type, headers={"cache-control": "no-cache"})

    async def answer(
        self, request: Request, build: Callable[[str], Awaitable[dict[str, Any]]]
    ) -> Response:
        try:
            tenant = resolve_tenant(request.headers, self.config)
            return JSONResponse(self.shown(await build(tenant)))
        except Exception as exc:
            return error_response(
                exc, openai_error_body, table=SESSION_ERRORS, where=request.url.path
            )


def known(session_id: str) -> str:
    """A session id the store could hold; anything else names no session."""
    if not session_id or len(session_id) > 512 or "\x00" in session_id:
        raise NotFound(f"no session {session_id[:80]!r}")
    return session_id


def int_param(request: Request, name: str, *, required: bool) -> int | None:
    """A non-negative integer query parameter (``request`` numbers start at 1)."""
    raw = request.query_params.get(name)
    if raw is None:
        if required:
            raise DialectError(f"the query parameter {name}=N is required", param=name)
        return None
    lowest = 1 if name == "request" else 0
    if not raw.isdigit() or int(raw) < lowest:
        raise DialectError(f"{name} must be an integer >= {lowest}, got {raw!r}", param=name)
    return int(raw)
