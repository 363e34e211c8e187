#!/usr/bin/env bash
# Build the agent-server image with podman, run it, and check that it shuts down gracefully
# inside the container:
#
#   1. build the image (making a local Python base image from Debian packages with debootstrap
#      when BASE_IMAGE is a localhost/ image that does not exist yet: no image registry needed);
#   2. check the image: non-root numeric user, STOPSIGNAL SIGTERM, exec-form ENTRYPOINT,
#      HEALTHCHECK;
#   3. run it as Kubernetes would (read-only root filesystem, no capabilities, no privilege
#      escalation), wait for /readyz, run the HEALTHCHECK once;
#   4. start background executions: some that finish within the drain timeout, one that
#      checkpoints and returns early when the server drains, one that outlives the drain
#      timeout and is cancelled;
#   5. `podman stop -t STOP_TIMEOUT` (SIGTERM, then SIGKILL after STOP_TIMEOUT seconds) and,
#      while it drains: /readyz 503, /healthz 200, /metrics served, new work 503 + Retry-After;
#   6. check: the shutdown report is in the container log with the expected outcomes, the exit
#      code is 0, and the stop took less than STOP_TIMEOUT seconds.
#
# Exits non-zero with a message on the first failure. Needs podman, runc, debootstrap (for the
# local base image), slirp4netns, curl and python3; deploy/ci.sh installs them.
#
# Settings (environment):
#   AGENT_SERVER_SCRATCH  scratch folder for podman's storage, config and the base rootfs
#                         [/tmp/agent-server-image]
#   BASE_IMAGE            base image [localhost/python-base]; e.g. python:3.11-slim where a
#                         registry is reachable
#   IMAGE                 tag to build [localhost/agent-server:test]
#   STOP_TIMEOUT          seconds podman stop waits before SIGKILL, and the server's grace
#                         period [20]
#   NETWORK               slirp4netns (port published on 127.0.0.1) or host [slirp4netns]
#   PORT                  loopback port [a free one]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
scratch=${AGENT_SERVER_SCRATCH:-/tmp/agent-server-image}
base_image=${BASE_IMAGE:-localhost/python-base}
image=${IMAGE:-localhost/agent-server:test}
stop_timeout=${STOP_TIMEOUT:-20}
network=${NETWORK:-slirp4netns}
name=agent-server-test-$$

# The shutdown budget given to the container: unready + drain + cancel + http + 1 <= grace.
unready_delay=2
drain_timeout=6
cancel_timeout=2
http_timeout=1

say() { printf 'test-image: %s\n' "$*" >&2; }
fail() {
    printf 'test-image: FAIL: %s\n' "$*" >&2
    if [[ -n "${container_started:-}" ]]; then
        say "container log (last 40 lines):"
        podman logs --tail 40 "$name" >&2 2>&1 || true
    fi
    exit 1
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }

for tool in podman runc python3 curl; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (deploy/ci.sh installs it)"
done
(( unready_delay + drain_timeout + cancel_timeout + http_timeout + 1 <= stop_timeout )) \
    || fail "STOP_TIMEOUT=$stop_timeout is shorter than the shutdown budget this test uses"

# ---- podman, confined to the scratch folder --------------------------------------------------
# runc (crun fails on these hosts' cgroups), cgroupfs, no default network (never podman's bridge,
# which creates a private network and firewall rules), explicit ulimits.
mkdir -p "$scratch/storage" "$scratch/run"
cat >"$scratch/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat >"$scratch/storage.conf" <<EOF
[storage]
driver = "overlay"
runroot = "$scratch/run"
graphroot = "$scratch/storage"
EOF
export CONTAINERS_CONF="$scratch/containers.conf"
export CONTAINERS_STORAGE_CONF="$scratch/storage.conf"

cleanup() { podman rm --force --time 0 "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# ---- the base image ---------------------------------------------------------------------------
debian_mirror() {
    # The Debian mirror apt already uses (deb822 .sources first, then one-line lists).
    local uri
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
    if [[ -z "$uri" ]]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n 1)
    fi
    printf '%s\n' "${DEBIAN_MIRROR:-$uri}"
}

if podman image exists "$base_image"; then
    say "base image $base_image: present"
elif [[ "$base_image" == localhost/* ]]; then
    command -v debootstrap >/dev/null || fail "debootstrap is not installed (deploy/ci.sh installs it)"
    mirror=$(debian_mirror)
    [[ -n "$mirror" ]] || fail "cannot tell which Debian mirror apt uses; set DEBIAN_MIRROR"
    suite=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-bookworm}")
    rootfs="$scratch/rootfs"
    rm -rf "$rootfs"
    say "making $base_image: debootstrap $suite from $mirror"
    t=$(now)
    debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$rootfs" "$mirror" \
        >"$scratch/debootstrap.log" 2>&1 \
        || { tail -20 "$scratch/debootstrap.log" >&2; fail "debootstrap failed (log: $scratch/debootstrap.log)"; }
    say "debootstrap: $(since "$t") s"
    # What an image needs no copy of: downloaded packages, package lists, docs, locales.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    tar -C "$rootfs" -c . | podman import --quiet --change 'CMD ["/usr/bin/python3"]' - "$base_image" >/dev/null \
        || fail "podman import of the base rootfs failed"
    rm -rf "$rootfs"
    say "base image $base_image: made in $(since "$t") s"
fi

# ---- build ------------------------------------------------------------------------------------
# The build reaches the package index through the host's network (--network host). pip inside
# the build trusts the host's CA bundle (a TLS-inspecting proxy the host trusts works there
# too) and the host's index, if one is configured; both only mounted for the RUN steps, never
# stored in the image.
build_args=(--format docker --network host --build-arg "BASE_IMAGE=$base_image" --tag "$image")
if [[ "$base_image" == localhost/* ]]; then build_args+=(--pull=never); else build_args+=(--pull=missing); fi
{
    printf '[global]\n'
    if [[ -r /etc/ssl/certs/ca-certificates.crt ]]; then printf 'cert = /etc/ssl/host-ca-certificates.crt\n'; fi
    if [[ -n "${PIP_INDEX_URL:-}" ]]; then printf 'index-url = %s\n' "$PIP_INDEX_URL"; fi
} >"$scratch/pip.conf"
build_args+=(--volume "$scratch/pip.conf:/etc/pip.conf:ro")
if [[ -r /etc/ssl/certs/ca-certificates.crt ]]; then
    build_args+=(--volume "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca-certificates.crt:ro")
fi
say "building $image from $root (base $base_image)"
t=$(now)
podman build "${build_args[@]}" "$root" >"$scratch/build.log" 2>&1 \
    || { tail -30 "$scratch/build.log" >&2; fail "podman build failed (log: $scratch/build.log)"; }
say "build: $(since "$t") s"

# ---- the image's configuration ---------------------------------------------------------------
podman image inspect "$image" | python3 -c '
import json, sys
image = json.load(sys.stdin)[0]
config = image["Config"]
problems = []
user = config.get("User", "")
if not user.split(":")[0].isdigit() or user.split(":")[0] == "0":
    problems.append(f"User is {user!r}, not a numeric non-root uid")
if config.get("StopSignal") != "SIGTERM":
    problems.append("StopSignal is %r" % config.get("StopSignal"))
if config.get("Entrypoint") != ["agent-server", "run"]:
    problems.append("Entrypoint is %r, not exec-form agent-server run" % config.get("Entrypoint"))
if not (image.get("Healthcheck") or {}).get("Test"):
    problems.append("no HEALTHCHECK (build with --format docker)")
if "8000/tcp" not in (config.get("ExposedPorts") or {}):
    problems.append("port 8000 not exposed")
if problems:
    sys.exit("; ".join(problems))
' || fail "image configuration"
say "image: non-root user, SIGTERM, exec-form entrypoint, healthcheck, port 8000"

# ---- run --------------------------------------------------------------------------------------
port=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
base="http://127.0.0.1:$port"
run_args=(--detach --name "$name"
    --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges
    --health-interval disable
    --env AGENT_SERVER_GRACE_PERIOD="$stop_timeout"
    --env AGENT_SERVER_UNREADY_DELAY="$unready_delay"
    --env AGENT_SERVER_DRAIN_TIMEOUT="$drain_timeout"
    --env AGENT_SERVER_CANCEL_TIMEOUT="$cancel_timeout"
    --env AGENT_SERVER_HTTP_TIMEOUT="$http_timeout"
    --env AGENT_SERVER_LOG_FORMAT=json)
case "$network" in
    slirp4netns) run_args+=(--network slirp4netns --publish "127.0.0.1:$port:8000") ;;
    host) run_args+=(--network host --env AGENT_SERVER_HOST=127.0.0.1 --env AGENT_SERVER_PORT="$port") ;;
    *) fail "NETWORK must be slirp4netns or host, not $network" ;;
esac
# podman schedules healthchecks with systemd timers, absent here: --health-interval disable
# keeps the HEALTHCHECK for `podman healthcheck run` without the timer.
podman run "${run_args[@]}" "$image" >/dev/null 2>"$scratch/run.err" \
    || { cat "$scratch/run.err" >&2; fail "podman run failed"; }
container_started=1

status() { curl --silent --output /dev/null --write-out '%{http_code}' --max-time 5 "$@" || true; }

t=$(now)
ready=""
for _ in $(seq 1 300); do   # 30 s at most
    if [[ "$(status "$base/readyz")" == 200 ]]; then ready=1; break; fi
    [[ "$(podman inspect --format '{{.State.Running}}' "$name")" == true ]] || fail "the container exited before it was ready"
    sleep 0.1
done
[[ -n "$ready" ]] || fail "/readyz did not answer 200 within 30 s"
say "ready after $(since "$t") s on $base ($network)"

podman healthcheck run "$name" >/dev/null 2>&1 || fail "the image's HEALTHCHECK did not pass"
say "HEALTHCHECK: healthy"

start() {  # start REASONER BODY: POST .../async, expect 202
    local code
    code=$(status -X POST -H 'Content-Type: application/json' --data "$2" "$base/reasoners/$1/async")
    [[ "$code" == 202 ]] || fail "POST /reasoners/$1/async answered $code, not 202"
}
finishing=4
for i in $(seq 1 "$finishing"); do
    start sleep "{\"seconds\": 3, \"text\": \"finishes $i\"}"   # ends within the drain timeout
done
start research '{"steps": 600, "step_seconds": 1}'             # returns early on drain
start sleep '{"seconds": 600, "text": "outlives the drain"}'   # cancelled at the deadline
inflight=$(curl --silent --max-time 5 "$base/metrics" \
    | awk '/^agent_server_executions_inflight\{/ { n += $2 } END { print n + 0 }')
[[ "$inflight" == $((finishing + 2)) ]] || fail "agent_server_executions_inflight is $inflight, expected $((finishing + 2))"
say "started $((finishing + 2)) background executions"

# ---- stop -------------------------------------------------------------------------------------
say "podman stop -t $stop_timeout"
t=$(now)
podman stop --time "$stop_timeout" "$name" >/dev/null 2>"$scratch/stop.err" &
stopper=$!

# While it drains. Readiness turns 503 at once; liveness stays 200.
unready=""
for _ in $(seq 1 50); do   # 5 s at most
    if [[ "$(status "$base/readyz")" == 503 ]]; then unready=1; break; fi
    sleep 0.1
done
[[ -n "$unready" ]] || fail "/readyz did not turn 503 within 5 s of SIGTERM"
[[ "$(status "$base/healthz")" == 200 ]] || fail "/healthz is not 200 while draining"
# Read whole, then searched: `curl | grep -q` under pipefail fails when grep exits at its
# match before curl has written the rest of the exposition (curl's SIGPIPE, exit 23).
draining=$(curl --silent --max-time 5 "$base/metrics" || true)
grep -q '^agent_server_draining 1' <<<"$draining" \
    || fail "/metrics not served, or agent_server_draining not 1, while draining"
say "draining: /readyz 503, /healthz 200, /metrics served"

# Once admission closes (after the unready delay), new work is refused with 503 + Retry-After.
refused=""
for _ in $(seq 1 $(( (unready_delay + drain_timeout) * 10 ))); do
    headers=$(curl --silent --max-time 5 --dump-header - --output /dev/null -X POST \
        -H 'Content-Type: application/json' --data '{"text": "late"}' "$base/reasoners/echo" || true)
    if [[ "$headers" == "HTTP/1.1 503"* ]]; then
        grep -qi '^retry-after:' <<<"$headers" || fail "503 for new work carries no Retry-After"
        refused=1
        break
    fi
    sleep 0.1
done
[[ -n "$refused" ]] || fail "new work was not refused with 503 during the drain"
say "admission closed: new work 503 + Retry-After"

wait "$stopper" || { cat "$scratch/stop.err" >&2; fail "podman stop failed"; }
stop_seconds=$(since "$t")
say "stopped in $stop_seconds s (limit $stop_timeout s)"

# ---- checks -----------------------------------------------------------------------------------
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[[ "$exit_code" == 0 ]] || fail "exit code $exit_code, expected 0 (137 would mean SIGKILL)"
python3 -c 'import sys; sys.exit(float(sys.argv[1]) >= float(sys.argv[2]))' "$stop_seconds" "$stop_timeout" \
    || fail "the stop took $stop_seconds s, not under $stop_timeout s"

podman logs "$name" >"$scratch/container.log" 2>&1
grep -q 'shutdown report' "$scratch/container.log" || fail "no shutdown report in the container log"
if grep -E 'Task exception was never retrieved|Task was destroyed but it is pending|Traceback' "$scratch/container.log" >&2; then
    fail "the container log shows an unobserved task or a traceback"
fi
python3 - "$scratch/container.log" "$finishing" <<'EOF' || fail "shutdown report"
import json, sys
log, finishing = sys.argv[1], int(sys.argv[2])
reports = []
for line in open(log, encoding="utf-8", errors="replace"):
    try:
        record = json.loads(line)
    except ValueError:
        continue
    if isinstance(record, dict) and record.get("message") == "shutdown report":
        reports.append(record.get("report") or {})
if len(reports) != 1:
    sys.exit(f"expected one shutdown report, found {len(reports)}")
report = reports[0]
print("test-image: shutdown report:", json.dumps(report, sort_keys=True), file=sys.stderr)
problems = []
if report.get("signal") not in ("SIGTERM", "15", 15):
    problems.append(f"signal {report.get('signal')!r}, expected SIGTERM")
# The sleeps and the research run end during the drain (the echo probes may add more).
if report.get("finished", 0) < finishing + 1:
    problems.append(f"finished {report.get('finished')}, expected at least {finishing + 1}")
if report.get("cancelled") != 1:
    problems.append(f"cancelled {report.get('cancelled')}, expected 1 (the 600 s sleep)")
if report.get("abandoned") != 0:
    problems.append(f"abandoned {report.get('abandoned')}, expected 0")
if report.get("exit_code") != 0:
    problems.append(f"exit_code {report.get('exit_code')}, expected 0")
if problems:
    sys.exit("; ".join(problems))
EOF

say "OK: drained in the container: shutdown report logged, exit code 0, stopped in $stop_seconds s < $stop_timeout s"
