"""`GET /docs`: Swagger UI for `/openapi.json`, for people.

The page's script and style come from the `swagger-ui-bundle-v2` package and are served from
here (`/docs/swagger-ui-bundle.js`, `/docs/swagger-ui.css`): nothing is fetched from the
internet, and a Content-Security-Policy keeps the page to its own origin. The page and its
assets are open, like the probes: they name no route, reasoner or execution. What describes
the API, `/openapi.json`, keeps its bearer check: with `--api-token` set the page first asks
for the token, loads the document with it, and fills Swagger UI's "Authorize" with it, so
"Try it out" sends it too. `--no-docs` turns the page off (404).
"""

from __future__ import annotations

from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

PATH = "/docs"
#: The Swagger UI files the page uses, by the name they are served under (below /docs/).
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
INIT = "docs-init.js"
#: Only this origin (and inline images and styles Swagger UI builds itself).
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'"
)

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - agent-server</title>
<link rel="stylesheet" href="docs/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/favicon-32x32.png">
<style>
#token-form {{ font-family: sans-serif; padding: 12px 20px; background: #fafafa;
  border-bottom: 1px solid #ddd; }}
#token-form[hidden] {{ display: none; }}
#token-form input {{ width: 28em; padding: 4px; }}
</style>
</head>
<body>
<form id="token-form" data-secured="{secured}" hidden>
<label for="token">Bearer token (the server's --api-token):</label>
<input id="token" name="token" type="password" autocomplete="off">
<button id="token-submit" type="submit">Open the API</button>
</form>
<div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script src="docs/docs-init.js"></script>
</body>
</html>
"""

INIT_SCRIPT = """\
"use strict";
(function () {
  var form = document.getElementById("token-form");
  function open(token) {
    window.ui = SwaggerUIBundle({
      url: "openapi.json",
      dom_id: "#swagger-ui",
      validatorUrl: null,
      deepLinking: false,
      tryItOutEnabled: false,
      persistAuthorization: false,
      requestInterceptor: function (request) {
        // The document itself needs the token; operations get it from "Authorize".
        if (token && request.loadSpec) {
          request.headers.Authorization = "Bearer " + token;
        }
        return request;
      },
      onComplete: function () {
        if (token) {
          window.ui.preauthorizeApiKey("bearer", token);
        }
      }
    });
  }
  if (form.dataset.secured === "true") {
    form.hidden = false;
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var token = document.getElementById("token").value.trim();
      if (token) {
        form.hidden = true;
        open(token);
      }
    });
  } else {
    open(null);
  }
})();
"""


class DocsPage:
    """ASGI middleware answering `GET /docs` and its assets; everything else goes on."""

    def __init__(self, app: ASGIApp, title: str, *, secured: bool) -> None:
        self.app = app
        self.root = Path(str(swagger_ui_path))
        self._assets: dict[str, bytes] = {}  # read on first use, then kept (1.5 MB in all)
        self.page = PAGE.format(
            title=_escape(title), secured="true" if secured else "false"
        ).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(PATH):
            await self.app(scope, receive, send)
            return
        if path == PATH:
            body, media_type = self.page, "text/html; charset=utf-8"
        elif path == f"{PATH}/{INIT}":
            body, media_type = INIT_SCRIPT.encode(), "text/javascript; charset=utf-8"
        elif path.removeprefix(PATH + "/") in ASSETS:
            name = path.removeprefix(PATH + "/")
            body, media_type = self._asset(name), ASSETS[name]
        else:
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, b'{"detail":"Method Not Allowed"}', "application/json")
            return
        await _answer(send, 200, b"" if scope["method"] == "HEAD" else body, media_type, len(body))

    def _asset(self, name: str) -> bytes:
        if name not in self._assets:
            self._assets[name] = (self.root / name).read_bytes()
        return self._assets[name]


async def _answer(
    send: Send, status: int, body: bytes, media_type: str, length: int | None = None
) -> None:
    headers = [
        (b"content-type", media_type.encode()),
        (b"content-length", b"%d" % (len(body) if length is None else length)),
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"cache-control", b"no-cache"),
    ]
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
