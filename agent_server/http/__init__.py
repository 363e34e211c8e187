"""The HTTP edge: routes and what a request may say.

The fast path in front of Starlette (`front`), the routes (`api`, which binds the groups
`runs`, `executions`, `inputs`, `sessions` and `health`; `routing`), answers to
input requests (`answers`), query parameters (`params`), live events (`sse`), OpenAPI
(`openapi`), the docs page (`docs_page`), authentication (`auth`, the middleware over
`agent_server.identity`), request bounds (`http_limits`) and coalesced reads (`coalescing`).
Knows nothing of signals.
"""
