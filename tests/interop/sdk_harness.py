"""What the Python SDK clients share: the checks, the handshake of either protocol flow, one
session against a fresh server process (its stderr shown when the session fails), and the
command-line entry point that turns any failure into a one-line message and exit code 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from importlib.metadata import version as dist_version
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

EXPECTED_SDK_VERSION = "2.1.1"
INVALID_PARAMS = -32602
SESSION_TIMEOUT_SECONDS = 60
MODES = ("initialize", "discover")


class CheckFailed(Exception):
    pass


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


def run_client(label: str, usage: str, run_mode: Callable[[str, Path, str], Awaitable[None]]) -> None:
    """`CLIENT SERVER_BINARY POLICY_JSON`: checks the SDK version, runs `run_mode` for each
    protocol flow, and exits 0, 1 (a check failed, with its message) or 2 (usage)."""
    if len(sys.argv) != 3:
        print(usage, file=sys.stderr)
        sys.exit(2)
    server_path, policy_path = sys.argv[1], Path(sys.argv[2])
    if not os.access(server_path, os.X_OK):
        print(f"{label}: server binary {server_path} is not executable", file=sys.stderr)
        sys.exit(2)

    async def main() -> None:
        installed = dist_version("mcp")
        check(installed == EXPECTED_SDK_VERSION, f"expected mcp=={EXPECTED_SDK_VERSION}, found {installed}")
        for mode in MODES:
            await run_mode(server_path, policy_path, mode)

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
