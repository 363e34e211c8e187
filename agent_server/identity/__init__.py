"""Identity: who is calling, and how a request's credentials say so.

The principal and the refusal (`principal`), what an API token may be and reading one from a
mounted file (`tokens`), the tokens file of `--api-tokens-file` and following it as it
changes (`tokens_file`), the keys JWTs are verified with (`jwt_keys`), where a JWT's key
comes from: the files or a JWKS URL (`jwks`), verifying a JWT and reading its principal
(`jwt_bearer`), and the flags' authenticator, headers in and a principal out
(`authenticators`).

Beside the model, in its layer: the model's execution and context carry a `Principal`, and
these modules use the model's counts, URL redaction and JSON codec; the model reaches nothing
here but `principal`, which imports nothing of the server. Nothing here knows HTTP's types,
the settings or the runtime: the settings read the token, key and tokens files with these
functions, and the HTTP layer's middleware (`agent_server/http/auth.py`) builds the
authenticator from them and runs it on each request.
"""
