"""The session endpoints (``/v1/sessions...``) and the inspector page (``/ui``).

A caller sees only its own tenant's sessions (the tenant comes from its API key, as for
every other request); someone else's session is as unknown as one that never existed: 404.
Errors take OpenAI's shape: a malformed parameter is a 400 naming it, a well-formed one
that names nothing (no such session, branch or request) a 404.

A session id is the rest of the path, percent-decoded once (``/v1/sessions/a/b`` and
``/v1/sessions/a%2Fb`` both name ``a/b``; UTF-8 in percent escapes), and passes the same
check and normalisation as the id a request names its session with
(``identity.session_id``), so every id a request can use addresses its session here. The
render route's suffix is a literal ``/render``; a percent-encoded one belongs to the id
(``/v1/sessions/x%2Frender`` is the session ``x/render``).

No ``from __future__ import annotations`` here: Ray Serve's ingress resolves these route
signatures at run time.
"""

from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib import resources
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.convertors import Convertor, register_url_convertor

from gateway import session_view
from gateway.config import GatewayConfig
from gateway.dialects.errors import DialectError
from gateway.dialects.openai_chat import openai_error_body
from gateway.fold.renderer import Renderer
from gateway.http_errors import ERRORS, ErrorRule, error_response
from gateway.identity import resolve_tenant, session_id
from gateway.pipeline import Pipeline
from store import NotFound, StoreUnavailable

# Sessions per page of ``GET /v1/sessions`` (``limit``): each costs a few store reads.
DEFAULT_PAGE = 100
MAX_PAGE = 1000
UI_FILES = {"": ("index.html", "text/html"), "inspector.js": ("inspector.js", "text/javascript")}
RENDER_SUFFIX = b"/render"
# The largest request or branch number: what the store's integer columns hold.
MAX_NUMBER = 2**63 - 1


class SessionPath(Convertor[str]):
    """The rest of the path, line breaks and all (the ``path`` convertor's ``.*`` stops at
    one): every id reaches the handler, to be checked there like any other."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("session", SessionPath())

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
        since a session id may contain slashes."""
        routes = [
            ("/v1/sessions", self.list_sessions),
            ("/v1/sessions/{session_id:session}/render", self.render),
            ("/v1/sessions/{session_id:session}", self.show),
        ]
        if self.config.ui:
            routes += [("/ui", self.ui), ("/ui/{name}", self.ui)]
        return routes

    async def list_sessions(self, request: Request) -> Response:
        """A page of the tenant's sessions, most recently used first, in OpenAI's list shape:
        ``limit`` of them (default ``DEFAULT_PAGE``, at most ``MAX_PAGE``) from the cursor
        ``after`` (the previous page's ``next_cursor``); ``has_more`` says whether more follow."""

        async def build(tenant: str) -> dict[str, Any]:
            limit = int_param(request, "limit", required=False)
            limit = DEFAULT_PAGE if limit is None else limit
            if not 1 <= limit <= MAX_PAGE:
                raise DialectError(
                    f"limit must be between 1 and {MAX_PAGE}, got {limit}", param="limit"
                )
            store = self.pipeline().store
            try:
                data, cursor = await session_view.summaries(
                    store, tenant, limit, request.query_params.get("after")
                )
            except ValueError as exc:  # not a cursor this API gave
                raise DialectError(str(exc), param="after") from exc
            return {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": cursor is not None,
                "next_cursor": cursor,
            }

        return await self.answer(request, build)

    async def render(self, session_id: str, request: Request) -> Response:
        # The path as sent (ASGI's ``raw_path``), where an encoded slash is still ``%2F``.
        sent = request.scope.get("raw_path", RENDER_SUFFIX).partition(b"?")[0]
        if not sent.endswith(RENDER_SUFFIX):
            return await self.show(session_id + "/render", request)  # the id's own suffix

        async def build(tenant: str) -> dict[str, Any]:
            number = int_param(request, "request", required=True)
            branch = int_param(request, "branch", required=False)
            p = self.pipeline()
            budget = p.tenants.settings(tenant).budget

            def renderer_for(strategy: str, fold: str) -> Renderer:
                return p.renderer(tenant, strategy, fold, budget)

            return await session_view.request_view(
                p.store, renderer_for, tenant, addressed(session_id), number, branch
            )

        return await self.answer(request, build)

    async def show(self, session_id: str, request: Request) -> Response:
        async def build(tenant: str) -> dict[str, Any]:
            branch = int_param(request, "branch", required=False)
            store = self.pipeline().store
            return await session_view.detail(store, tenant, addressed(session_id), branch)

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


def addressed(path_id: str) -> str:
    """The session id a path names, keyed as requests key it (``identity.session_id``: the
    same check, the same key for a long id); a blank one names no session."""
    session = session_id(path_id, "session_id")
    if not session:
        raise NotFound("no session ''")
    return session


def int_param(request: Request, name: str, *, required: bool) -> int | None:
    """A query parameter that numbers something: ASCII digits, from 1 for ``request``
    numbers (0 for branches) up to ``MAX_NUMBER``; anything else is a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None:
        if required:
            raise DialectError(f"the query parameter {name}=N is required", param=name)
        return None
    lowest = 1 if name == "request" else 0
    # ``str.isdigit`` takes other scripts' digits and superscripts, which ``int`` parses or
    # refuses, and ``int`` refuses over 4,300 digits: ASCII digits only, and few of them.
    digits = raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_NUMBER))
    if not digits or not lowest <= int(raw) <= MAX_NUMBER:
        shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
        raise DialectError(
            f"{name} must be an integer from {lowest} to {MAX_NUMBER}, got {shown!r}", param=name
        )
    return int(raw)
