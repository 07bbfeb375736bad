#!/usr/bin/env python3
"""Drive the example server bookings-mcp with the official MCP Python SDK's own stdio client.

Usage: bookings_client.py BOOKINGS_MCP_BINARY POLICY_JSON

Runs the scenario twice, over the 2025-11-25 `initialize` handshake and over the 2026-07-28
`server/discover` flow, each time against a fresh server process with fresh temporary ledger
and data directories:

  1. tools/list: the four allowed tools, purge_bookings absent; a direct purge_bookings call is
     the SDK's MCPError with code -32602, and nothing is purged;
  2. create_booking three times with one request_id: one booking; the retries carry the
     `_meta` marker io.toolgate/replayed and the first result;
  3. cancel_booking: a preview (nothing cancelled), then confirm_action with its token and
     summary: cancelled;
  4. notify_guest: a preview, then reject_action: nothing sent;
  5. `bookings-mcp halt` while the server runs: the next create_booking is an MCPError naming
     `bookings-mcp resume`; `bookings-mcp resume`: it works again;
  6. after the session, `bookings-mcp verify` accepts the audit chain.

tools/list is the liveness probe (in the 2026-07-28 flow `ping` is -32601). Uses only the SDK's
public client API. Exits 0 when every check passes, 1 with a message naming the failed check.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, MCPError, StdioServerParameters

from sdk_harness import INVALID_PARAMS, CheckFailed, check, handshake, run_client, with_session

HALTED = -32001
REPLAYED = "io.toolgate/replayed"
ALLOWED = ["cancel_booking", "create_booking", "list_bookings", "notify_guest"]


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def stored(data: Path) -> dict[str, Any]:
    return json.loads((data / "bookings.json").read_text())


async def operator(server: str, ledger: Path, *args: str) -> str:
    """`bookings-mcp ARGS --ledger LEDGER`; fails the check unless it exits 0."""
    done = await anyio.run_process([server, *args, "--ledger", str(ledger)], check=False)
    out = done.stdout.decode(errors="replace")
    check(
        done.returncode == 0,
        f"`bookings-mcp {' '.join(args)}` exited {done.returncode}: {out}{done.stderr.decode(errors='replace')}",
    )
    return out


async def scenario(session: ClientSession, mode: str, server: str, ledger: Path, data: Path) -> None:
    await handshake(session, mode)

    # 1. The admin tool is hidden, and refused when called anyway.
    names = sorted(tool.name for tool in (await session.list_tools()).tools)
    for name in ALLOWED:
        check(name in names, f"tools/list lacks {name}: {names}")
    check("purge_bookings" not in names, f"tools/list shows the denied purge_bookings: {names}")
    print(f"  tools/list: {names} (purge_bookings absent)")

    args = {"request_id": f"py-{mode}-0001", "guest": "Ada", "date": "2026-09-01", "nights": 2}
    first = await session.call_tool("create_booking", args)
    check(not first.is_error, f"create_booking failed: {text_of(first)}")
    check(not (first.meta or {}).get(REPLAYED), f"the first create_booking is marked replayed: {first.meta}")
    booking = first.structured_content
    check(isinstance(booking, dict) and booking.get("id") == "bk-1", f"create_booking: {booking!r}")
    # The policy's result allow-list: the stored payment token never leaves the server, and the
    # SDK (which validates structured content against the listed outputSchema) accepts the rest.
    token = stored(data)["bookings"][0]["payment_token"]
    listed = await session.call_tool("list_bookings", {})
    for result in (first, listed):
        dumped = result.model_dump_json()
        check(token not in dumped and "payment_token" not in dumped, f"the payment token left the server: {dumped}")
    print("  results: payment_token dropped from create_booking and list_bookings")
    # An argument refusal of a tool with an output schema: isError, its details as the text's last
    # line and as structuredContent, which the SDK validates against the listed schema.
    refused = await session.call_tool("create_booking", {**args, "request_id": f"py-{mode}-bad1", "date": "soon"})
    check(refused.is_error is True, f"a malformed date was accepted: {text_of(refused)}")
    details = json.loads(text_of(refused).strip().splitlines()[-1])
    check(details.get("error") == "argument_rejected", f"refusal details: {details!r}")
    check(refused.structured_content == details, f"refusal structuredContent: {refused.structured_content!r}")
    print(f"  refusal: isError result, rule {details.get('rule')}, structuredContent = the details")

    try:
        result = await session.call_tool("purge_bookings", {})
    except MCPError as err:
        check(err.code == INVALID_PARAMS, f"purge_bookings: expected {INVALID_PARAMS}, got {err.code} {err.message!r}")
        print(f"  purge_bookings: MCPError {err.code} {err.message!r}")
    else:
        raise CheckFailed(f"purge_bookings did not raise MCPError: {result!r}")
    check(len(stored(data)["bookings"]) == 1, "purge_bookings changed the bookings")

    # 2. Exactly once per request_id: the retries replay.
    for attempt in (2, 3):
        retry = await session.call_tool("create_booking", args)
        check(not retry.is_error, f"retry {attempt} failed: {text_of(retry)}")
        check((retry.meta or {}).get(REPLAYED) is True, f"retry {attempt} lacks _meta {REPLAYED}: {retry.meta}")
        check(retry.structured_content == booking, f"retry {attempt} answered {retry.structured_content!r}")
    check(len(stored(data)["bookings"]) == 1, f"three calls made {len(stored(data)['bookings'])} bookings")
    print("  create_booking x3: one booking, two replays")

    # 3. cancel_booking: a preview, then the confirmation executes it.
    preview = await session.call_tool("cancel_booking", {"id": "bk-1"})
    body = preview.structured_content
    check(isinstance(body, dict) and body.get("status") == "preview", f"cancel_booking preview: {body!r}")
    check(stored(data)["bookings"][0]["status"] == "confirmed", "the preview cancelled the booking")
    done = await session.call_tool(
        "confirm_action", {"confirm_token": body["confirm_token"], "confirm_summary": body["confirm_summary"]}
    )
    check(not done.is_error, f"confirm_action failed: {text_of(done)}")
    cancelled = done.structured_content or {}
    check(cancelled.get("id") == "bk-1" and cancelled.get("status") == "cancelled", f"confirm_action answered {text_of(done)!r}")
    check("payment_token" not in cancelled, f"confirm_action leaked the payment token: {cancelled!r}")
    check(stored(data)["bookings"][0]["status"] == "cancelled", "confirm_action did not cancel")
    print("  cancel_booking: preview, confirm_action -> cancelled")

    # 4. notify_guest: a preview, then the rejection sends nothing.
    second = {"request_id": f"py-{mode}-0002", "guest": "Bob", "date": "2026-09-02", "nights": 1}
    created = await session.call_tool("create_booking", second)
    check(not created.is_error, f"create_booking failed: {text_of(created)}")
    notify = await session.call_tool("notify_guest", {"id": "bk-2", "message": "See you soon"})
    body = notify.structured_content
    check(isinstance(body, dict) and body.get("status") == "preview", f"notify_guest preview: {body!r}")
    rejected = await session.call_tool("reject_action", {"confirm_token": body["confirm_token"]})
    check(not rejected.is_error, f"reject_action failed: {text_of(rejected)}")
    late = await session.call_tool(
        "confirm_action", {"confirm_token": body["confirm_token"], "confirm_summary": body["confirm_summary"]}
    )
    check(late.is_error, f"a rejected token was confirmed: {text_of(late)}")
    check(stored(data)["outbox"] == [], f"a message was sent: {stored(data)['outbox']}")
    print("  notify_guest: preview, reject_action -> not sent")

    # 5. The kill switch, set and lifted by the operator while the server runs.
    halted = await operator(server, ledger, "halt", "--reason", "interop drill", "--by", "interop")
    check("bookings-mcp resume" in halted, f"halt output: {halted!r}")
    third = {"request_id": f"py-{mode}-0003", "guest": "Cy", "date": "2026-09-03", "nights": 3}
    try:
        result = await session.call_tool("create_booking", third)
    except MCPError as err:
        check(err.code == HALTED, f"halted create_booking: expected {HALTED}, got {err.code} {err.message!r}")
        check("bookings-mcp resume" in err.message, f"the refusal does not name the resume command: {err.message!r}")
        print(f"  halted: MCPError {err.code} {err.message!r}")
    else:
        raise CheckFailed(f"create_booking ran while halted: {result!r}")
    await operator(server, ledger, "resume")
    resumed = await session.call_tool("create_booking", third)
    check(not resumed.is_error, f"create_booking after resume failed: {text_of(resumed)}")
    check(len(stored(data)["bookings"]) == 3, f"after resume: {len(stored(data)['bookings'])} bookings")
    # Liveness after everything (tools/list, since ping is -32601 in the 2026-07-28 flow).
    await session.list_tools()
    print("  halt -> refused naming `bookings-mcp resume`; resume -> works")


async def run_mode(server: str, policy: Path, mode: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"toolgate-interop-bookings-py-{mode}-"))
    errlog_path = workdir / "server.stderr"
    ledger, data = workdir / "ledger", workdir / "data"
    try:
        shutil.copyfile(policy, workdir / "policy.json")
        params = StdioServerParameters(
            command=server,
            args=["--policy", str(workdir / "policy.json"), "--ledger", str(ledger)],
            env={"BOOKINGS_DATA": str(data)},
            cwd=str(workdir),
        )
        print(f"python SDK {dist_version('mcp')}, bookings-mcp, {mode} flow:")
        await with_session(params, errlog_path, lambda session: scenario(session, mode, server, ledger, data))
        # 6. The chain the session wrote verifies.
        out = await operator(server, ledger, "verify")
        check(out.startswith("verify: intact:"), f"verify: {out!r}")
        print(f"  {out.strip()}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_client("python SDK client (bookings-mcp)", __doc__.splitlines()[2], run_mode)
