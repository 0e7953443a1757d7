"""The web console (SPEC UI1): ``GET /`` and ``GET /console/{file}``, plain HTML, CSS and
JavaScript modules shipped in the package (``static/``), nothing loaded from elsewhere.

The files are public, as RabbitMQ's login page is: they hold no data. Everything the page
shows it reads through the HTTP API with the credentials it keeps in ``sessionStorage`` and
sends in an ``Authorization`` header it sets itself (never a cookie, so no request can be
forged cross-site), and the API's authorization table decides, as for curl.

Every response here forbids inline script and outside sources and being framed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["HEADERS", "STATIC", "add_routes"]

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
         ".png": "image/png"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "frame-ancestors 'none'; connect-src 'self'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _files() -> dict[str, Path]:
    """The servable files, by name, listed once: a request can only name one of them."""
    return {p.name: p for p in STATIC.iterdir() if p.is_file() and p.suffix in TYPES}


def add_routes(app: web.Application, mgmt: Any) -> None:
    """The console's files, and the one route only the console needed (the message trace)."""
    from gateway.management import trace

    trace.add_routes(app, mgmt)
    files = _files()

    def send(path: Path) -> web.Response:
        charset = None if path.suffix == ".png" else "utf-8"
        return web.Response(body=path.read_bytes(), content_type=TYPES[path.suffix], charset=charset,
                            headers=HEADERS)

    async def index(request: web.Request) -> web.Response:
        return send(files["index.html"])

    async def static(request: web.Request) -> web.Response:
        path = files.get(request.match_info["file"])
        if path is None:
            raise web.HTTPNotFound(headers=HEADERS)
        return send(path)

    app.router.add_get("/", index)
    app.router.add_get("/console/{file}", static)
