"""`GET /console`: a page for people to see and steer what runs (docs/console.md).

The page (HTML, ES-module script, style) ships in the package (`console_assets/`), written
by hand: no CDN, no build step, no library. Like `/docs`, the page and its assets are open:
they name no route, reasoner or execution. The page then asks for a token, keeps it in the
tab's `sessionStorage` (never `localStorage`, a cookie or a URL), and calls the API with
`Authorization: Bearer`, so what it shows and does is exactly what the API lets that token
see and do. A strict Content-Security-Policy keeps it to its own origin with no inline
script or style; the script writes every value with `textContent`, never as markup.
`--no-console` turns it off (404).
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

PATH = "/console"
ROOT = Path(__file__).parent / "console_assets"
#: What the page may load and call: its own origin only, no inline script or style, no
#: frame around it, no form posting anywhere (the script sends what it sends).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'"
)
#: The files the page is made of, by the name they are served under (below /console/).
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
    "execution.js": "text/javascript; charset=utf-8",
    "schema_form.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
PAGE = "console.html"


class ConsolePage:
    """The page and its assets, read from the package once and kept (a few tens of KB)."""

    open_paths = frozenset({PATH, *(f"{PATH}/{name}" for name in ASSETS)})

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    async def page(self, request: Request) -> Response:
        return _answer(self._read(PAGE), "text/html; charset=utf-8")

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            raise HTTPException(404, "unknown console asset")
        return _answer(self._read(name), ASSETS[name])

    def _read(self, name: str) -> bytes:
        if name not in self._files:
            self._files[name] = (ROOT / name).read_bytes()
        return self._files[name]


def _answer(body: bytes, media_type: str) -> Response:
    return Response(
        body,
        media_type=media_type,
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )
