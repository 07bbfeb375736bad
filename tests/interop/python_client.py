#!/usr/bin/env python3
"""Drive toolgate-server with the official MCP Python SDK's own stdio client.

Usage: python_client.py SERVER_BINARY POLICY_JSON

Runs the same scenario twice, each time against a fresh server process with a fresh
temporary ledger: once over the 2025-11-25 `initialize` handshake and once over the
2026-07-28 `server/discover` flow. Each run:

  1. lists tools: write_note and read_ledger present, rm_rf absent;
  2. calls write_note twice with the same request_id and text: "committed", then "replay";
  3. calls rm_rf directly: it must surface as the SDK's MCPError with code -32602,
     and the file it names must still exist;
  4. calls read_ledger: exactly the one note written in step 2.

Uses only the SDK's public client API (ClientSession, stdio_client, StdioServerParameters,
MCPError). Exits 0 when every check passes, 1 with a message naming the failed check.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from mcp import ClientSession, MCPError, StdioServerParameters

from sdk_harness import (
    EXPECTED_SDK_VERSION,
    INVALID_PARAMS,
    CheckFailed,
    check,
    handshake,
    list_tool_names,
    run_client,
    with_session,
)


async def call_write_note(session: ClientSession, request_id: str, text: str) -> dict[str, Any]:
    result = await session.call_tool("write_note", {"request_id": request_id, "text": text})
    check(not result.is_error, f"write_note returned isError=true: {result.content!r}")
    sc = result.structured_content
    check(isinstance(sc, dict), f"write_note structuredContent is not an object: {sc!r}")
    return sc


async def scenario(session: ClientSession, mode: str, workdir: Path) -> None:
    await handshake(session, mode)

    names = await list_tool_names(session)
    check("write_note" in names, f"tools/list lacks write_note: {names}")
    check("read_ledger" in names, f"tools/list lacks read_ledger: {names}")
    check("rm_rf" not in names, f"tools/list shows the denied tool rm_rf: {names}")
    print(f"  tools/list: {sorted(names)} (rm_rf absent)")

    request_id = f"interop-py-{mode}-0001"
    text = f"written by the official Python SDK {EXPECTED_SDK_VERSION} over {mode}"

    first = await call_write_note(session, request_id, text)
    check(
        first == {"request_id": request_id, "status": "committed"},
        f"first write_note: expected committed for {request_id!r}, got {first!r}",
    )
    second = await call_write_note(session, request_id, text)
    check(
        second == {"request_id": request_id, "status": "replay"},
        f"repeated write_note: expected replay for {request_id!r}, got {second!r}",
    )
    print("  write_note x2: committed, then replay")

    target = workdir / "precious.txt"
    target.write_text("must survive rm_rf\n")
    try:
        result = await session.call_tool("rm_rf", {"path": str(target)})
    except MCPError as err:
        check(err.code == INVALID_PARAMS, f"rm_rf: expected error code {INVALID_PARAMS}, got {err.code} ({err.message!r})")
        check("not found" in err.message.lower(), f"rm_rf: expected a 'tool not found' message, got {err.message!r}")
        print(f"  rm_rf: MCPError {err.code} {err.message!r}")
    else:
        raise CheckFailed(f"rm_rf did not raise MCPError; the SDK returned {result!r}")
    check(target.read_text() == "must survive rm_rf\n", "rm_rf changed its target file")

    ledger = await session.call_tool("read_ledger", {})
    check(not ledger.is_error, f"read_ledger returned isError=true: {ledger.content!r}")
    sc = ledger.structured_content
    check(isinstance(sc, dict) and isinstance(sc.get("notes"), list), f"read_ledger structuredContent: {sc!r}")
    notes = [{"request_id": n.get("request_id"), "text": n.get("text")} for n in sc["notes"]]
    check(
        notes == [{"request_id": request_id, "text": text}],
        f"read_ledger: expected exactly the one note {request_id!r}, got {sc['notes']!r}",
    )
    print("  read_ledger: the one note, text intact")


async def run_mode(server: str, policy: Path, mode: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"toolgate-interop-py-{mode}-"))
    errlog_path = workdir / "server.stderr"
    try:
        shutil.copyfile(policy, workdir / "policy.json")
        params = StdioServerParameters(
            command=server,
            args=["--policy", str(workdir / "policy.json"), "--ledger", str(workdir / "ledger")],
            cwd=str(workdir),
        )
        print(f"python SDK {dist_version('mcp')}, {mode} flow:")
        await with_session(params, errlog_path, lambda session: scenario(session, mode, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_client("python SDK client", __doc__.splitlines()[2], run_mode)
