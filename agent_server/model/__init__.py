"""The model: what an execution is, needing nothing else here but who is calling.

Statuses and the one table of moves (`status`), every field a store keeps (`record`), the
execution (`execution`), what the replica running it holds beside its record (`live`), the
reasoner's view of it (`context`), execution ids (`ids`), events (`events`), the JSON codec
(`jsoncodec`), names (`names`), scheduling declarations (`scheduling`), asks (`asks`),
waiting primitives (`waiting`), URL redaction (`redaction`), and the reasoner's declaration
(`reasoner`). Who is calling is `agent_server.identity.principal`, in the same layer. No
module here imports a server library beyond pydantic, so the client can read `status` and
`record`.
"""
