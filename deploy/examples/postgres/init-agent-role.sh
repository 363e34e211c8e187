#!/bin/sh
# Run once, by the official postgres image's entrypoint, on an empty data directory
# (/docker-entrypoint-initdb.d): the store's ordinary role and the database it owns. The
# server's superuser (POSTGRES_USER, postgres) is for the administrator only; agent-server
# connects as `agent`, which is no superuser, cannot create roles or databases, and owns
# `agents`, so its migrations can create and alter the tables there and nothing else.
set -eu
psql --no-psqlrc -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    --set=password="$AGENT_PASSWORD" <<'SQL'
CREATE ROLE agent LOGIN PASSWORD :'password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE agents OWNER agent;
REVOKE ALL ON DATABASE agents FROM PUBLIC;
SQL
