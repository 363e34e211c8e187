"""The model: what an execution is, needing nothing else here.

Statuses and the one table of moves (`status`), the record's fields (`record`), the
execution and its context (`execution`), events (`events`), the JSON codec (`jsoncodec`),
names (`names`), scheduling declarations (`scheduling`), asks (`asks`), waiting primitives
(`waiting`), token checks and the tokens file (`tokens`, `tokens_file`), who is calling
(`principal`), URL redaction (`redaction`), and the reasoner's declaration (`reasoner`). No
module here imports a server library beyond pydantic, so the client can read `status` and
`record`.
"""
