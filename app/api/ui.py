"""The status page: `/ui` and its assets, and the JSON it reads.

    GET /                     307 -> /ui
    GET /ui                   index.html (no data in it: the page asks for the admin key)
    GET /ui/assets/*          app.js, app.css, icon.svg, shipped in the package
                              (Starlette's StaticFiles: ETag / 304, no path escapes)
    GET /admin/ui/snapshot    everything the page draws, behind the admin key

No build step, no CDN, nothing fetched from elsewhere: it works on an air-gapped
management node. Every page response forbids scripts, styles and connections to other
origins and inline script (CSP), framing, MIME sniffing and referrers. Assets are
revalidated on each load (`no-cache` + ETag), so an upgraded gateway never runs a stale
script against a new snapshot. `ui.enabled = false` mounts none of this (404).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api import snapshot
from app.api.admin import AdminDep
from app.errors import NotFound

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-cache",
}

_SECURE = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> Response:
    # Relative Location: never built from the client's Host header.
    return RedirectResponse("/ui", status_code=307)


@router.get("/ui")
async def page() -> Response:
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS, media_type="text/html")


@router.get("/admin/ui/snapshot")
async def ui_snapshot(gateway: AdminDep) -> Response:
    if gateway.board is None:  # not mounted then; this narrows the type
        raise NotFound("status page disabled (ui.enabled = false)")
    body = await snapshot.snapshot(gateway, gateway.board)
    return JSONResponse(body, headers={"cache-control": "no-store", **_SECURE})


class _WithHeaders:
    """Adds `PAGE_HEADERS` to every response of the wrapped app (the static assets)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.extra = [(k.encode(), v.encode()) for k, v in PAGE_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *self.extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI) -> None:
    """Mount the page, its assets and its snapshot route on `app`."""
    app.include_router(router)
    app.mount("/ui/assets", _WithHeaders(StaticFiles(directory=STATIC)), name="ui-assets")
