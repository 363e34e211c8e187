"""The app: `Agent`, the user's object and an ASGI app, and the embedded demo agent."""
