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

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
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
    """The page and its assets, as two routes of the API's router (so they cost the other
    routes nothing, and are counted and closed while draining like every answer)."""

    #: The paths that need no token, as the probes.
    open_paths = frozenset({PATH, f"{PATH}/{INIT}", *(f"{PATH}/{name}" for name in ASSETS)})

    def __init__(self, title: str, *, secured: bool) -> None:
        self.root = Path(str(swagger_ui_path))
        self._assets: dict[str, bytes] = {}  # read on first use, then kept (1.5 MB in all)
        self.page_body = PAGE.format(
            title=_escape(title), secured="true" if secured else "false"
        ).encode()

    async def page(self, request: Request) -> Response:
        return _answer(self.page_body, "text/html; charset=utf-8")

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == INIT:
            return _answer(INIT_SCRIPT.encode(), "text/javascript; charset=utf-8")
        if name not in ASSETS:
            raise HTTPException(404, "unknown docs asset")
        if name not in self._assets:
            self._assets[name] = (self.root / name).read_bytes()
        return _answer(self._assets[name], ASSETS[name])


def _answer(body: bytes, media_type: str) -> Response:
    return Response(
        body,
        media_type=media_type,
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
