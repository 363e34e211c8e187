"""Every example in README.md and docs/*.md runs as written (README.md, "Set up").

The fenced blocks of each page are extracted and, by language:

- `python`: a block that defines `agent = Agent(...)` is written to a module (named by its
  `# name.py` first line) and served by a real `agent-server run module:agent` (with the
  flags of a `# served by: agent-server run module:agent FLAGS` line): the page's server.
  Any other block runs as a script, `127.0.0.1:8000` pointed at the page's server (the
  embedded demo agent when the page defines none); a comment `... prints X` states a line of
  its output, which must appear (in order). Every reasoner a page's agent defines must have
  succeeded once the page's examples have run.
- `sh`, `bash`: each command runs in bash in the page's directory, `localhost:8000` pointed at
  the page's server, `<id>` filled from the last execution id printed, `127.0.0.1:6379` at a
  real redis-server. `agent-server run ...` starts a server (on a free port) that the rest of
  the block talks to, stopped with SIGTERM (exit 0) when the block ends. `agent-server call`
  finds the server through AGENT_SERVER_URL and prints JSON lines (`agent-server drill` its
  table, unless `--json`). What a comment states is checked: `exit N`, an
  HTTP status (`# 202 ...`: curl reports every status through a curlrc, so a request that
  says nothing must answer 2xx), `prints X` (X is in its output), `Location`, `the same
  execution`. In a transcript (`$ ` lines) the lines after a command are its output.
- `json`, `yaml`: parsed; an execution (or a webhook body's `data`) is compared with what the
  server really returns, and a shutdown report with the report the page's server logs when it
  is stopped.
- `text` (diagrams, formulas, outputs): not code. One preceded by `<!-- output of: COMMAND -->`
  is output the page's run of COMMAND must contain.
- `promql`: docs/metrics.md's queries, which tests/process/test_prometheus_real.py runs.

A block that cannot run on one machine says why in `<!-- not run: REASON -->` right before its
fence; any other block is run, parsed or declared text, or this test fails.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.process import ServerProcess, need

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Bound of one command or script of an example (the longest takes about 3 s).
COMMAND_TIMEOUT = 60.0
#: Bound of a server's drain once it is sent SIGTERM (nothing of the examples is left running).
EXIT_TIMEOUT = 15.0

FENCE = re.compile(r"^( *)(`{3,})([\w+-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!-- not run: (.+?) -->\s*$")
OUTPUT_OF = re.compile(r"^\s*<!-- output of: (.+?) -->\s*$")
#: The flags a page's server runs with beside its app (a protocol the page shows: `--a2a`).
ADDRESS = re.compile(r"\b(localhost|127\.0\.0\.1):(\d+)\b")
EXECUTION_ID = re.compile(
    r'"execution_id": ?"([0-9a-f]{32})"|location: /executions/([0-9a-f]{32})', re.I
)
#: A comment stating output: `prints X` (up to a `;`).
PRINTS = re.compile(r"\bprints ([^;]+?)\s*(?:;|$)")
CURL_STATUS = re.compile(r"^curl-status: (\d{3})$", re.M)
#: Every curl request reports its status on stderr, leaving its output as written.
CURLRC = 'write-out = "%{stderr}curl-status: %{http_code}\\n"\n'
#: How each language is treated when its block carries no `not run` reason.
RUN, PARSED, TEXT, PROMQL = "run", "parsed", "text", "promql"
TREATMENT = {
    "python": RUN,
    "sh": RUN,
    "bash": RUN,
    "json": PARSED,
    "yaml": PARSED,
    "text": TEXT,
    "promql": PROMQL,
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    text: str  # without the fence's indentation
    not_run: str | None
    output_of: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def treatment(self) -> str | None:
        return "not run" if self.not_run else TREATMENT.get(self.lang)

    @property
    def module(self) -> str | None:
        """The module name of a block that defines an agent, else None."""
        if self.lang != "python" or not re.search(r"^agent = Agent\(", self.text, re.M):
            return None
        named = re.match(r"# (\w+)\.py\n", self.text)
        return named.group(1) if named else f"{self.page.stem.lower()}_example"

    @property
    def serve_flags(self) -> list[str]:
        """The flags an agent's block says it is served with: a comment line `# served by:
        agent-server run MODULE:agent FLAGS` (the page's server gets them too)."""
        said = re.search(r"^# served by: agent-server run \S+(.*)$", self.text, re.M)
        return shlex.split(said.group(1)) if said else []


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence, lang = opening.groups()
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        assert end < len(lines), f"{page.name}:{index + 1}: the fence is never closed"
        body = [
            line[len(indent) :] if line.startswith(indent) else line
            for line in lines[index + 1 : end]
        ]
        before = lines[index - 1] if index else ""
        not_run, output_of = NOT_RUN.match(before), OUTPUT_OF.match(before)
        found.append(
            Block(
                page,
                index + 1,
                lang,
                "\n".join(body) + "\n",
                not_run.group(1) if not_run else None,
                output_of.group(1) if output_of else None,
            )
        )
        index = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]


def test_every_block_is_run_or_says_why() -> None:
    """A block the test cannot run must say why in the page; nothing is left out silently."""
    problems = []
    for block in ALL_BLOCKS:
        if not block.lang:
            problems.append(f"{block.where}: a fence names its language (`text` for no code)")
        elif block.treatment is None:
            problems.append(f"{block.where}: ```{block.lang} needs <!-- not run: why --> before it")
        elif block.treatment == TEXT and re.search(r"^\$ ", block.text, re.M):
            problems.append(f"{block.where}: a shell transcript is ```sh, so that it runs")
        elif block.treatment == PROMQL and block.page.name != "metrics.md":
            problems.append(f"{block.where}: only docs/metrics.md's queries run on a Prometheus")
    assert not problems, "\n".join(problems)
    markers = sum(page.read_text().count("<!-- not run:") for page in PAGES)
    assert markers == sum(bool(block.not_run) for block in ALL_BLOCKS), (
        "a marker is not right before its fence"
    )
    promql_test = (Path(__file__).parent / "test_prometheus_real.py").read_text()
    assert '"docs" / "metrics.md"' in promql_test and "```promql" in promql_test
    counts = {kind: sum(b.treatment == kind for b in ALL_BLOCKS) for kind in (RUN, PARSED)}
    assert counts[RUN] >= 12 and counts[PARSED] >= 6, counts


#: Debian packages the tests name that `.ci/run` need not install, and why.
COME_WITH = {
    "util-linux": "essential: on every Debian",
    "redis-tools": "a dependency of redis-server",
}


def test_the_readme_installs_what_ci_installs() -> None:
    """README's apt-get line is the list `.ci/run` installs, and that list holds every Debian
    package a test names when it skips for want of it."""
    readme = (ROOT / "README.md").read_text()
    (line,) = re.findall(r"`apt-get install ([^`]+)`", readme)
    ci = (ROOT / ".ci" / "run").read_text()
    listed = re.search(r"^programs=\((.*?)\)", ci, re.M | re.S)
    assert listed is not None, "`.ci/run` lists its programs as programs=(program=package ...)"
    packages = [entry.split("=", 1)[1] for entry in listed.group(1).split()]
    assert line.split() == packages
    sources = "".join(path.read_text() for path in (ROOT / "tests").rglob("*.py"))
    named = set(re.findall(r'need\(\s*"[^"]+",\s*package="([^"]+)"\)', sources))
    assert {"redis-server", "haproxy", "chromium-driver", "wrk"} <= named  # the helper is used
    assert named - set(COME_WITH) <= set(packages), named - set(packages)


# -- running a page ----------------------------------------------------------------------------


class ShellServer(ServerProcess):
    """`agent-server run ...` as a page's shell block writes it, run by bash."""

    def command(self, args: list[str]) -> list[str]:
        return ["bash", "-c", f"exec {args[0]}"]


@dataclass
class Done:
    """What a command printed, for the checks that come after it."""

    command: str
    stdout: str


def split_comment(command: str) -> tuple[str, str]:
    """A shell command and the comment ending it (a `#` after a blank, outside quotes)."""
    quote = ""
    for at, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (at == 0 or command[at - 1].isspace()):
            return command[:at].rstrip(), command[at + 1 :].strip()
    return command, ""


def shell_commands(text: str) -> list[tuple[str, list[str]]]:
    """The commands of an `sh` block, continuation lines joined, each with the output a
    transcript shows after it (transcript: commands are the `$ ` lines)."""
    transcript = any(line.startswith("$ ") for line in text.splitlines())
    commands: list[tuple[str, list[str]]] = []
    pending = ""
    for line in text.splitlines():
        if pending:
            pending += "\n" + line
        elif transcript and not line.startswith("$ "):
            if line.strip():
                assert commands, f"output before any command: {line!r}"
                commands[-1][1].append(line)
            continue
        elif not line.strip() or line.lstrip().startswith("#"):
            continue
        else:
            pending = line[2:] if transcript else line
        if not pending.endswith("\\"):
            commands.append((pending, []))
            pending = ""
    assert not pending, f"a continuation line ends the block: {pending!r}"
    return commands


def printed_claims(code: str) -> list[str]:
    """The lines a Python block says it prints: `... prints X` in a comment."""
    claims = []
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            stated = PRINTS.search(token.string)
            if stated:
                claims.append(stated.group(1))
    return claims


def key_shape(value: Any) -> Any:
    """The keys of nested objects (what a documented JSON must share with the real one)."""
    if isinstance(value, dict):
        return {key: key_shape(item) for key, item in value.items()}
    return None


def sse_records(text: str) -> list[str]:
    """An event stream's records (events and comments), each without its blank line."""
    return [record.strip() for record in text.replace("\r\n", "\n").split("\n\n") if record.strip()]


def record_pattern(record: str) -> re.Pattern[str]:
    """A documented event record: `...` stands for the rest, an execution id for any."""
    pattern = re.escape(record).replace(re.escape("..."), ".*")
    return re.compile(re.sub(r"[0-9a-f]{32}", "[0-9a-f]{32}", pattern), re.S)


@dataclass
class PageRun:
    """One page's examples, in order, against one server of the page (started once)."""

    page: Path
    tmp_path: Path
    server: ServerProcess | None = None
    redis: Any = None
    last_id: str | None = None
    done: list[Done] = field(default_factory=list)
    handled: dict[int, str] = field(default_factory=dict)  # block line -> what was done
    deferred: list[Block] = field(default_factory=list)
    servers: list[ServerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = self.tmp_path / "work"
        self.workdir.mkdir()
        self.curl_home = self.tmp_path / "curl"
        self.curl_home.mkdir()
        (self.curl_home / ".curlrc").write_text(CURLRC)
        self.blocks = blocks(self.page)
        # Every page may serve the README's `mymodule:agent`, as the docs do.
        for block in [*blocks(ROOT / "README.md"), *self.blocks]:
            if block.module and not block.not_run:
                (self.workdir / f"{block.module}.py").write_text(block.text)
        agents = [block for block in self.blocks if block.module and not block.not_run]
        assert len(agents) <= 1, f"{self.page.name}: one agent per page, one server"
        self.agent = agents[0] if agents else None

    # -- servers

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("AGENT_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["CURL_HOME"] = str(self.curl_home)
        env["AGENT_SERVER_PORT"] = "0"  # an `agent-server run` without --port binds a free one
        return env

    def start(self, cls: type[ServerProcess], args: list[str]) -> ServerProcess:
        marker_dir = self.tmp_path / f"server{len(self.servers)}"
        marker_dir.mkdir()
        env = {"PATH": self.env()["PATH"], "AGENT_SERVER_PORT": "0"}
        server = cls(args, env, marker_dir, cwd=self.workdir)
        self.servers.append(server)
        server.wait_ready()
        return server

    def page_server(self) -> ServerProcess:
        """The page's agent (else the embedded demo agent), logging JSON for its report."""
        if self.server is None:
            app = [f"{self.agent.module}:agent", *self.agent.serve_flags] if self.agent else []
            self.server = self.start(ServerProcess, [*app, "--log-format", "json"])
        return self.server

    def stop(self, server: ServerProcess, what: str) -> str:
        server.signal(signal.SIGTERM)
        code, _ = server.wait_exit(EXIT_TIMEOUT)
        assert code == 0, f"{what} exited {code}:\n{server.stderr()}"
        return server.stderr()

    def address(self, found: re.Match[str], block_servers: dict[int, ServerProcess]) -> str:
        port = int(found.group(2))
        if port == 6379:
            if self.redis is None:
                from tests.support.redis_server import RedisServer

                self.redis = RedisServer(self.tmp_path / "redis-dir")
                self.redis.directory.mkdir()
                self.redis.start()
            return f"127.0.0.1:{self.redis.port}"
        if port in block_servers:
            return f"127.0.0.1:{block_servers[port].port}"
        assert port == 8000, f"no server for {found.group(0)}"
        return f"127.0.0.1:{self.page_server().port}"

    def close(self) -> None:
        for server in self.servers:
            server.close()
        if self.redis is not None:
            self.redis.kill()

    # -- blocks

    def run(self) -> None:
        if self.agent is not None:
            self.page_server()
            self.handled[self.agent.line] = f"served by agent-server run {self.agent.module}:agent"
        for block in self.blocks:
            if block.line in self.handled:
                continue
            if block.not_run:
                self.handled[block.line] = f"not run: {block.not_run}"
            elif block.lang == "python":
                self.python(block)
            elif block.lang in ("sh", "bash"):
                self.shell(block)
            elif block.lang == "json":
                self.json_block(block)
            elif block.lang == "yaml":
                assert yaml.safe_load(block.text) is not None, block.where
                self.handled[block.line] = "parsed"
            elif block.output_of:
                self.deferred.append(block)
            elif block.treatment in (TEXT, PROMQL):
                self.handled[block.line] = block.treatment
        self.finish()
        unhandled = [b.where for b in self.blocks if b.line not in self.handled]
        assert not unhandled, f"blocks neither run nor marked: {unhandled}"

    def python(self, block: Block) -> None:
        code = ADDRESS.sub(lambda found: self.address(found, {}), block.text)
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.workdir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stderr}"
        printed = done.stdout.splitlines()
        for claim in printed_claims(block.text):
            assert claim in printed, f"{block.where}: does not print {claim!r}:\n{done.stdout}"
            printed = printed[printed.index(claim) + 1 :]
        self.remember(block.text, done.stdout)
        self.handled[block.line] = "ran"

    def shell(self, block: Block) -> None:
        block_servers: dict[int, ServerProcess] = {}  # by the port the block gives it
        for command, output in shell_commands(block.text):
            self.command(block, command, output, block_servers)
        for port, server in reversed(block_servers.items()):  # (close() kills them on a failure)
            self.stop(server, f"{block.where}: the server for port {port}")
        self.handled[block.line] = "ran"

    def command(
        self, block: Block, command: str, output: list[str], servers: dict[int, ServerProcess]
    ) -> None:
        where = f"{block.where}: {command.splitlines()[0]}"
        comment = split_comment(command)[1]
        stated_exit = re.search(r"\bexit (\d+)", comment)
        program = shlex.split(command, comments=True)[0]
        if program in ("curl", "openssl"):
            need(program, package=program)
        line = command
        if "<id>" in line:
            assert self.last_id, f"{where}: no execution id printed before it"
            line = line.replace("<id>", self.last_id)
        if re.match(r"agent-server run\b", line) and not (stated_exit and stated_exit[1] != "0"):
            doc_port = re.search(r"--port (\d+)", line)
            line = re.sub(r"--port \d+", "--port 0", line)
            line = ADDRESS.sub(lambda found: self.address(found, servers), line)
            servers[int(doc_port[1]) if doc_port else 8000] = self.start(ShellServer, [line])
            return
        line = ADDRESS.sub(lambda found: self.address(found, servers), line)
        env = self.env()
        if program == "agent-server":
            target = servers.get(8000) or self.page_server()
            env["AGENT_SERVER_URL"] = target.url
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        statuses = [int(status) for status in CURL_STATUS.findall(done.stderr)]
        stderr = CURL_STATUS.sub("", done.stderr).strip()
        told = f"{where}\nstdout: {done.stdout}\nstderr: {stderr}"
        expected = int(stated_exit[1]) if stated_exit else 0
        assert done.returncode == expected, f"exit {done.returncode}, not {expected}: {told}"
        if program == "curl":
            assert statuses, told
            stated = re.match(r"(\d{3})\b", comment)
            if stated:
                assert statuses[-1] == int(stated[1]), f"answered {statuses}: {told}"
            else:  # an example that says nothing of an error must not get one
                assert all(200 <= status < 300 for status in statuses), statuses
        stated_output = PRINTS.search(comment)
        if stated_output:
            assert stated_output[1] in done.stdout, f"does not print {stated_output[1]}: {told}"
        if "Location" in comment:
            assert re.search(r"^location: /executions/", done.stdout, re.M | re.I), told
        table = re.match(r"agent-server drill\b", line) and "--json" not in line
        if program == "agent-server" and not table:  # a drill prints a table without --json
            for printed in done.stdout.splitlines():
                json.loads(printed)  # one JSON line each: the execution, or an event
        if output:  # a transcript: what it shows is what the command printed
            shown = " ".join(" ".join(output).split())
            assert " ".join((done.stdout + stderr).split()) == shown, told
        before = self.last_id
        self.remember(command, done.stdout)
        if "the same execution" in comment:
            assert before is not None and self.last_id == before, told

    def remember(self, command: str, stdout: str) -> None:
        self.done.append(Done(command, stdout))
        found = EXECUTION_ID.search(stdout)
        if found:
            self.last_id = found.group(1) or found.group(2)

    def json_block(self, block: Block) -> None:
        documented = json.loads(block.text)
        self.handled[block.line] = "parsed"
        if "execution_id" in documented:
            url = self.page_server().url
            schema = httpx.get(f"{url}/openapi.json", timeout=10).json()
            declared = schema["components"]["schemas"]["Execution"]["properties"]
            assert list(documented) == list(declared), block.where
            real = httpx.get(
                f"{url}/executions",
                params={"reasoner": documented["reasoner"], "status": documented["status"]},
                timeout=10,
            ).json()
            if real:  # the page ran it: the documented result is the real one
                assert list(real[0]) == list(documented), block.where
                assert real[0]["result"] == documented["result"], block.where
            self.handled[block.line] += " and compared with the server's"
        elif isinstance(documented.get("data"), dict) and "execution_id" in documented["data"]:
            # A webhook's body (docs/webhooks.md): its `data` is the execution's JSON.
            url = self.page_server().url
            schema = httpx.get(f"{url}/openapi.json", timeout=10).json()
            declared = schema["components"]["schemas"]["Execution"]["properties"]
            assert list(documented["data"]) == list(declared), block.where
            self.handled[block.line] += ": its data has the execution's fields"
        elif documented.get("message") == "shutdown report":
            self.page_server()  # its own report, when it is stopped at the end
            self.deferred.append(block)

    def finish(self) -> None:
        """The checks that need the whole page run: outputs, reasoners, the report."""
        for block in [b for b in self.deferred if b.output_of]:
            wanted = " ".join(block.output_of.split())
            runs = [d for d in self.done if " ".join(split_comment(d.command)[0].split()) == wanted]
            assert runs, f"{block.where}: the page never runs {wanted!r}"
            got = sse_records(runs[0].stdout)
            for record in sse_records(block.text):
                if record.startswith(":"):
                    continue  # a heartbeat comes after 15 s of quiet: none here
                pattern = record_pattern(record)
                assert any(pattern.fullmatch(g) for g in got), f"{block.where}: {record!r} {got}"
            self.handled[block.line] = f"output of {wanted}"
        if self.server is None:
            return
        if self.agent is not None:  # every reasoner it defines ran, and succeeded
            url = self.server.url
            for reasoner in httpx.get(f"{url}/reasoners", timeout=10).json():
                ended = httpx.get(
                    f"{url}/executions",
                    params={"reasoner": reasoner["name"], "status": "succeeded", "limit": 1},
                    timeout=10,
                ).json()
                assert ended, f"{self.page.name}: no example ran {reasoner['name']} to success"
        stderr = self.stop(self.server, f"{self.page.name}'s server")
        reports = [json.loads(line) for line in stderr.splitlines() if "shutdown report" in line]
        assert len(reports) == 1, stderr
        for block in [b for b in self.deferred if not b.output_of]:
            assert key_shape(json.loads(block.text)) == key_shape(reports[0]), block.where
            self.handled[block.line] = "parsed and compared with a real report"


RUNNABLE = [page for page in PAGES if any(b.treatment in (RUN, PARSED) for b in blocks(page))]


@pytest.fixture
def page_run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PageRun]:
    running = PageRun(request.param, tmp_path)
    yield running
    running.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "page_run", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE], indirect=True
)
def test_the_examples_of(page_run: PageRun) -> None:
    page_run.run()
