"""What the Python SDK clients share: the checks, the handshake of either protocol flow, one
session against a fresh server process (its stderr shown when the session fails), a server
over Streamable HTTP with its bearer tokens and one session against it, and the command-line
entry point that turns any failure into a one-line message and exit code 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.metadata import version as dist_version
from pathlib import Path

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import PaginatedRequestParams

EXPECTED_SDK_VERSION = "2.1.1"
INVALID_PARAMS = -32602
SESSION_TIMEOUT_SECONDS = 60
# A server over HTTP: how long it may take to say where it listens, and to stop on SIGTERM.
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 30
LISTENING = "toolgate-server: serving Streamable HTTP at "
MODES = ("initialize", "discover")


class CheckFailed(Exception):
    pass


async def list_tool_names(session: ClientSession) -> list[str]:
    """Every tool name the server lists, following its pages."""
    names: list[str] = []
    cursor: str | None = None
    while True:
        if cursor is None:
            result = await session.list_tools()
        else:
            result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        names.extend(tool.name for tool in result.tools)
        cursor = result.next_cursor
        if cursor is None:
            return names


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


async def handshake(session: ClientSession, mode: str) -> None:
    """The 2025-11-25 `initialize` handshake or the 2026-07-28 `server/discover` flow."""
    if mode == "initialize":
        init = await session.initialize()
        check(
            init.protocol_version == "2025-11-25",
            f"initialize negotiated {init.protocol_version!r}, expected '2025-11-25'",
        )
        print(f"  initialize: protocol {init.protocol_version}, server {init.server_info.name} {init.server_info.version}")
    else:
        await session.discover()
        check(
            session.protocol_version == "2026-07-28",
            f"server/discover adopted {session.protocol_version!r}, expected '2026-07-28'",
        )
        info = session.server_info
        print(f"  server/discover: protocol {session.protocol_version}, server {info.name if info else '?'}")


async def with_session(
    params: StdioServerParameters,
    errlog_path: Path,
    body: Callable[[ClientSession], Awaitable[None]],
) -> None:
    """Runs `body` in a session with the server `params` start, under the session timeout; on
    any failure prints the last lines of the server's stderr, then re-raises."""
    with errlog_path.open("w") as errlog:
        try:
            with anyio.fail_after(SESSION_TIMEOUT_SECONDS):
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        await body(session)
        except BaseException:
            errlog.flush()
            tail = errlog_path.read_text(errors="replace").splitlines()[-20:]
            if tail:
                print(f"  server stderr (last {len(tail)} lines):", file=sys.stderr)
                for line in tail:
                    print(f"    {line}", file=sys.stderr)
            raise


def print_tail(path: Path, what: str) -> None:
    tail = path.read_text(errors="replace").splitlines()[-20:] if path.exists() else []
    if tail:
        print(f"  {what} (last {len(tail)} lines):", file=sys.stderr)
        for line in tail:
            print(f"    {line}", file=sys.stderr)


def operator(server: str, ledger: Path, *args: str) -> str:
    """Runs `SERVER --ledger LEDGER ARGS...` (a token or audit command) and returns its stdout;
    a non-zero exit is a failed check naming the command and its stderr."""
    done = subprocess.run(
        [server, "--ledger", str(ledger), *args],
        capture_output=True,
        text=True,
        timeout=SESSION_TIMEOUT_SECONDS,
        stdin=subprocess.DEVNULL,
    )
    check(
        done.returncode == 0,
        f"`toolgate-server {' '.join(args)}` exited {done.returncode}: {done.stderr.strip()}",
    )
    return done.stdout


def create_token(server: str, ledger: Path, principal: str) -> str:
    """`token create --principal P`: the token is its only line on stdout."""
    lines = operator(server, ledger, "token", "create", "--principal", principal).splitlines()
    check(
        len(lines) == 1 and lines[0].startswith("tgt_"),
        f"token create for {principal}: expected one tgt_ line on stdout, got {len(lines)} lines",
    )
    return lines[0]


@asynccontextmanager
async def http_server(server: str, policy: Path, ledger: Path, errlog_path: Path) -> AsyncIterator[str]:
    """Starts `SERVER --policy P --ledger L serve --http 127.0.0.1:0`, waits for the line that
    names its URL and yields that URL. On leaving, stops it with SIGTERM and checks that it exits
    0 (a clean stop); on any failure prints the last lines of its stderr. The process never
    outlives the block."""
    with errlog_path.open("w") as errlog:
        process = subprocess.Popen(
            [server, "--policy", str(policy), "--ledger", str(ledger), "serve", "--http", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errlog,
            cwd=str(ledger.parent),
        )
        try:
            url = None
            with anyio.move_on_after(START_TIMEOUT_SECONDS):
                while url is None:
                    for line in errlog_path.read_text(errors="replace").splitlines():
                        if line.startswith(LISTENING):
                            url = line[len(LISTENING) :].strip()
                    if url is None:
                        check(process.poll() is None, f"the HTTP server exited {process.returncode} before listening")
                        await anyio.sleep(0.05)
            check(url is not None, f"the HTTP server did not say where it listens within {START_TIMEOUT_SECONDS}s")
            yield url
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(STOP_TIMEOUT_SECONDS):
                while process.poll() is None:
                    await anyio.sleep(0.05)
            check(process.poll() is not None, f"the HTTP server did not stop within {STOP_TIMEOUT_SECONDS}s of SIGTERM")
            check(process.returncode == 0, f"the HTTP server exited {process.returncode} on SIGTERM, expected 0")
        except BaseException:
            errlog.flush()
            print_tail(errlog_path, "server stderr")
            raise
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


Responses = list[tuple[str, int, str | None]]


async def with_http_session(
    url: str,
    token: str,
    body: Callable[[ClientSession, Responses], Awaitable[None]],
) -> Responses:
    """Runs `body(session, responses)` in a session over the SDK's Streamable HTTP client, with
    `Authorization: Bearer TOKEN` on every request, under the session timeout. `responses`
    collects (method, status, WWW-Authenticate) of each HTTP response the SDK received, up to
    the end of the session (its DELETE in the 2025-11-25 flow), and is returned."""
    responses: Responses = []

    async def record(response: httpx2.Response) -> None:
        responses.append((response.request.method, response.status_code, response.headers.get("www-authenticate")))

    with anyio.fail_after(SESSION_TIMEOUT_SECONDS):
        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(SESSION_TIMEOUT_SECONDS),
            event_hooks={"response": [record]},
            trust_env=False,  # a loopback server: no proxy settings from the environment
        ) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await body(session, responses)
    return responses


def run_client(label: str, usage: str, run_mode: Callable[..., Awaitable[None]], files: int = 1) -> None:
    """`CLIENT SERVER_BINARY FILE...` (`files` paths, the policy first): checks the SDK version,
    runs `run_mode(server, *files, mode)` for each protocol flow, and exits 0, 1 (a check
    failed, with its message) or 2 (usage)."""
    if len(sys.argv) != 2 + files:
        print(usage, file=sys.stderr)
        sys.exit(2)
    server_path, paths = sys.argv[1], [Path(arg) for arg in sys.argv[2:]]
    if not os.access(server_path, os.X_OK):
        print(f"{label}: server binary {server_path} is not executable", file=sys.stderr)
        sys.exit(2)

    async def main() -> None:
        installed = dist_version("mcp")
        check(installed == EXPECTED_SDK_VERSION, f"expected mcp=={EXPECTED_SDK_VERSION}, found {installed}")
        for mode in MODES:
            await run_mode(server_path, *paths, mode)

    try:
        try:
            anyio.run(main)
        except BaseExceptionGroup as group:  # task groups may wrap the one real failure
            raise first_leaf(group) from group
    except CheckFailed as failure:
        print(f"FAIL ({label}): {failure}", file=sys.stderr)
        sys.exit(1)
    except TimeoutError:
        print(f"FAIL ({label}): no answer within {SESSION_TIMEOUT_SECONDS}s", file=sys.stderr)
        sys.exit(1)
    except Exception as error:  # an SDK exception is an interop failure too: name it
        print(f"FAIL ({label}): {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
    print(f"{label}: all checks passed")
