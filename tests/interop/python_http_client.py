#!/usr/bin/env python3
"""Drive toolgate-server over Streamable HTTP with the official MCP Python SDK's own client.

Usage: python_http_client.py SERVER_BINARY POLICY_JSON CONFIRM_POLICY_JSON

Runs twice, over the 2025-11-25 `initialize` flow and over the stateless 2026-07-28
`server/discover` flow, each time with a fresh temporary ledger, tokens for alice and bob made by
`toolgate-server token create`, and `serve --http 127.0.0.1:0` servers that must stop with exit
status 0 on SIGTERM. Every request carries `Authorization: Bearer <token>`. A 2025-11-25 session
ends with the SDK's DELETE: the server (rmcp) answers 202 and ends the session, and the SDK, which
expects 200 or 204, logs "Session termination failed: 202" on stderr; that warning is expected.
With POLICY_JSON (fixtures/policy.json):

  1. alice: tools/list has write_note and read_ledger, not rm_rf; write_note twice with one
     request_id: "committed", then "replay" (the gate's replay, `_meta` io.toolgate/replayed),
     and exactly one note file in LEDGER/notes; rm_rf called directly is the SDK's MCPError
     -32602 and its target file survives; read_ledger returns the one note;
  2. bob, with his own token and alice's request_id: the gate runs his call under his own key
     (no replay of alice's result: no io.toolgate/replayed). The reference server's notes are
     one directory named by request_id alone, so its handler finds alice's note and answers
     "replay" (not "committed"): checked as it is, see docs/http.md. His retry is the gate's
     replay; a request_id of his own is "committed";
  3. a well-formed token the server never issued: the handshake fails with the SDK's MCPError,
     on an HTTP 401 whose WWW-Authenticate is a Bearer challenge naming invalid_token;
  4. the audit log names alice and bob in the `principal` of their write_note records, in order,
     records the refusal of step 3 (without the token) and no token at all.

Then, on the same ledger, with CONFIRM_POLICY_JSON (fixtures/policy-http-confirm.json: write_note
is a `notify` effect, so it needs two-step confirmation):

  5. alice's write_note is held: a preview with confirm_token and confirm_summary, no note file;
     confirm_action with both executes it: "committed", the note file appears; the same
     confirm_action again is an isError result `token_used`, nothing written twice; the audit
     log records the preview, the confirmed call and the refused reuse;
  6. with POLICY_JSON naming Cedar policies (roles.cedar, written beside it; skipped when the
     binary has no Cedar support): carol's token carries `--attr role=writer`, dave's
     `--attr role=reader`; carol lists only write_note, writes an approved note ("committed") and
     gets an isError refusal (rule `cedar`) for an unapproved one, which writes nothing; dave
     lists only read_ledger and his write_note is the SDK's MCPError -32602 (as unknown); the
     audit records name the determining Cedar policies and the set's digest;
  7. `toolgate-server audit verify` accepts the whole chain (exit 0).

Exits 0 when every check passes, 1 with a message naming the failed check.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from mcp import ClientSession, MCPError
from mcp.types import CallToolResult

from sdk_harness import (
    EXPECTED_SDK_VERSION,
    INVALID_PARAMS,
    CheckFailed,
    Responses,
    check,
    create_token,
    handshake,
    http_server,
    list_tool_names,
    operator,
    run_client,
    with_http_session,
)

REPLAYED = "io.toolgate/replayed"
UNKNOWN_TOKEN = "tgt_" + "0" * 64


def text_of(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def replayed(result: CallToolResult) -> bool:
    return bool((result.meta or {}).get(REPLAYED))


async def write_note(session: ClientSession, request_id: str, text: str) -> tuple[dict[str, Any], bool]:
    """write_note's structuredContent, and whether the gate marked it as its replay."""
    result = await session.call_tool("write_note", {"request_id": request_id, "text": text})
    check(not result.is_error, f"write_note returned isError=true: {text_of(result)}")
    sc = result.structured_content
    check(isinstance(sc, dict), f"write_note structuredContent is not an object: {sc!r}")
    return sc, replayed(result)


def note_file(request_id: str) -> str:
    """The reference server's file name for a note: sha256(request_id) in hex, `.json`."""
    return hashlib.sha256(request_id.encode()).hexdigest() + ".json"


def note_files(ledger: Path) -> set[str]:
    notes = ledger / "notes"
    return {entry.name for entry in notes.iterdir()} if notes.is_dir() else set()


def audit_records(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ledger / "audit.jsonl").read_text().splitlines() if line.strip()]


class Ids:
    def __init__(self, mode: str) -> None:
        self.shared = f"interop-py-http-{mode}-0001"  # alice's, then bob's too
        self.bobs = f"interop-py-http-{mode}-bob-0002"
        self.confirmed = f"interop-py-http-{mode}-confirm-0003"
        self.cedar = f"interop-py-http-{mode}-cedar-0004"
        self.text = f"written over Streamable HTTP by the official Python SDK {EXPECTED_SDK_VERSION} ({mode})"


async def alice(session: ClientSession, responses: Responses, mode: str, ids: Ids, workdir: Path) -> None:
    await handshake(session, mode)
    ledger = workdir / "ledger"

    names = await list_tool_names(session)
    check("write_note" in names, f"tools/list lacks write_note: {names}")
    check("read_ledger" in names, f"tools/list lacks read_ledger: {names}")
    check("rm_rf" not in names, f"tools/list shows the denied tool rm_rf: {names}")
    print(f"  alice tools/list: {sorted(names)} (rm_rf absent)")

    first, first_replayed = await write_note(session, ids.shared, ids.text)
    check(
        first == {"request_id": ids.shared, "status": "committed"} and not first_replayed,
        f"alice's first write_note: expected committed for {ids.shared!r}, got {first!r} (replayed={first_replayed})",
    )
    second, second_replayed = await write_note(session, ids.shared, ids.text)
    check(
        second == {"request_id": ids.shared, "status": "replay"} and second_replayed,
        f"alice's repeated write_note: expected the gate's replay, got {second!r} (replayed={second_replayed})",
    )
    files = note_files(ledger)
    check(files == {note_file(ids.shared)}, f"LEDGER/notes after two writes: expected exactly one note, found {sorted(files)}")
    print("  alice write_note x2: committed, then replay; one note file")

    target = workdir / "precious.txt"
    target.write_text("must survive rm_rf\n")
    try:
        result = await session.call_tool("rm_rf", {"path": str(target)})
    except MCPError as err:
        check(err.code == INVALID_PARAMS, f"rm_rf: expected error code {INVALID_PARAMS}, got {err.code} ({err.message!r})")
        check("not found" in err.message.lower(), f"rm_rf: expected a 'tool not found' message, got {err.message!r}")
        print(f"  alice rm_rf: MCPError {err.code} {err.message!r}")
    else:
        raise CheckFailed(f"rm_rf did not raise MCPError; the SDK returned {result!r}")
    check(target.read_text() == "must survive rm_rf\n", "rm_rf changed its target file")

    ledger_result = await session.call_tool("read_ledger", {})
    check(not ledger_result.is_error, f"read_ledger returned isError=true: {text_of(ledger_result)}")
    sc = ledger_result.structured_content
    check(isinstance(sc, dict) and isinstance(sc.get("notes"), list), f"read_ledger structuredContent: {sc!r}")
    notes = [{"request_id": n.get("request_id"), "text": n.get("text")} for n in sc["notes"]]
    check(
        notes == [{"request_id": ids.shared, "text": ids.text}],
        f"read_ledger: expected exactly the one note {ids.shared!r}, got {sc['notes']!r}",
    )
    print("  alice read_ledger: the one note, text intact")


async def bob(session: ClientSession, responses: Responses, mode: str, ids: Ids, workdir: Path) -> None:
    await handshake(session, mode)
    ledger = workdir / "ledger"

    same, same_replayed = await write_note(session, ids.shared, ids.text)
    check(not same_replayed, f"bob's write_note with alice's request_id was the gate's replay of alice's result: {same!r}")
    check(
        same == {"request_id": ids.shared, "status": "replay"},
        f"bob's write_note with alice's request_id: expected the handler's 'replay' (the reference server's notes "
        f"are keyed by request_id alone; if they are per principal now, expect 'committed' here), got {same!r}",
    )
    again, again_replayed = await write_note(session, ids.shared, ids.text)
    check(
        again == {"request_id": ids.shared, "status": "replay"} and again_replayed,
        f"bob's retry: expected the gate's replay of his own call, got {again!r} (replayed={again_replayed})",
    )
    own, own_replayed = await write_note(session, ids.bobs, ids.text)
    check(
        own == {"request_id": ids.bobs, "status": "committed"} and not own_replayed,
        f"bob's own request_id: expected committed, got {own!r} (replayed={own_replayed})",
    )
    files = note_files(ledger)
    expected = {note_file(ids.shared), note_file(ids.bobs)}
    check(files == expected, f"LEDGER/notes after bob's writes: expected {sorted(expected)}, found {sorted(files)}")
    print("  bob write_note with alice's request_id: run for bob (no gate replay), handler says replay; "
          "retry: gate replay; his own request_id: committed")


async def wrong_token(url: str, mode: str) -> None:
    refused: MCPError | None = None
    seen: Responses = []

    async def body(session: ClientSession, responses: Responses) -> None:
        nonlocal refused, seen
        seen = responses
        try:
            await handshake(session, mode)
        except MCPError as err:
            refused = err

    await with_http_session(url, UNKNOWN_TOKEN, body)
    check(refused is not None, f"a token the server never issued was accepted (responses: {seen})")
    check(len(seen) == 1 and seen[0][1] == 401, f"unknown token: expected one HTTP 401, the SDK got {seen}")
    challenge = seen[0][2] or ""
    check(
        challenge.startswith("Bearer ") and 'resource_metadata="' in challenge and 'error="invalid_token"' in challenge,
        f"unknown token: WWW-Authenticate {challenge!r}",
    )
    print(f"  unknown token: HTTP 401 ({challenge.split(',')[0]}, ...); the SDK raised MCPError {refused.code} {refused.message!r}")


def check_principals(ledger: Path, ids: Ids, tokens: list[str]) -> None:
    text = (ledger / "audit.jsonl").read_text()
    for token in tokens + [UNKNOWN_TOKEN]:
        check(token not in text, "a bearer token reached the audit log")
    records = audit_records(ledger)
    writes = [
        (r.get("principal"), r.get("outcome"), r.get("request_id"))
        for r in records
        if r.get("method") == "tools/call" and r.get("name") == "write_note"
    ]
    expected = [
        ("alice", "committed", ids.shared),
        ("alice", "replay", ids.shared),
        ("bob", "replay", ids.shared),
        ("bob", "replay", ids.shared),
        ("bob", "committed", ids.bobs),
    ]
    check(writes == expected, f"audit write_note records (principal, outcome, request_id): expected {expected}, got {writes}")
    denied = [(r.get("principal"), r.get("decision")) for r in records if r.get("name") == "rm_rf"]
    check(denied == [("alice", "deny")], f"audit rm_rf records: {denied}")
    refusals = [r.get("reason") for r in records if r.get("method") == "http/authenticate"]
    check(refusals == ["invalid_token"], f"audit http/authenticate records: {refusals}")
    print("  audit: alice's and bob's write_note records under their principals, rm_rf denied, "
          "the unknown token refused, no token in the log")


async def confirmation(session: ClientSession, responses: Responses, mode: str, ids: Ids, workdir: Path) -> None:
    await handshake(session, mode)
    ledger = workdir / "ledger"
    names = await list_tool_names(session)
    for name in ("write_note", "confirm_action", "reject_action"):
        check(name in names, f"tools/list under the confirmation policy lacks {name}: {names}")
    before = note_files(ledger)

    held = await session.call_tool("write_note", {"request_id": ids.confirmed, "text": ids.text})
    check(not held.is_error, f"write_note under confirmation returned isError=true: {text_of(held)}")
    preview = held.structured_content
    check(isinstance(preview, dict) and preview.get("status") == "preview", f"write_note was not held for confirmation: {preview!r}")
    check(preview.get("tool") == "write_note", f"preview names {preview.get('tool')!r}")
    token, summary = preview.get("confirm_token"), preview.get("confirm_summary")
    check(isinstance(token, str) and re.fullmatch(r"[0-9a-f]{64}", token) is not None, f"confirm_token: {token!r}")
    check(isinstance(summary, str) and summary, f"confirm_summary: {summary!r}")
    check(note_files(ledger) == before, "a preview wrote a note")
    print(f"  alice write_note: held, preview {summary!r}")

    done = await session.call_tool("confirm_action", {"confirm_token": token, "confirm_summary": summary})
    check(not done.is_error, f"confirm_action failed: {text_of(done)}")
    check(
        done.structured_content == {"request_id": ids.confirmed, "status": "committed"},
        f"confirm_action: expected write_note's committed, got {done.structured_content!r}",
    )
    after = note_files(ledger)
    check(after == before | {note_file(ids.confirmed)}, f"LEDGER/notes after confirm_action: {sorted(after)}")
    again = await session.call_tool("confirm_action", {"confirm_token": token, "confirm_summary": summary})
    check(again.is_error and "token_used" in text_of(again), f"a used confirmation token was accepted: {text_of(again)}")
    check(note_files(ledger) == after, "a second confirm_action wrote a note")
    print("  confirm_action: committed, one note; the same token again: token_used")


def check_confirmation_audit(ledger: Path, ids: Ids) -> None:
    records = audit_records(ledger)
    flow = [
        (r.get("name"), r.get("principal"), r.get("outcome"), r.get("reason"))
        for r in records
        if r.get("method") == "tools/call" and r.get("name") in ("write_note", "confirm_action")
        and (r.get("name") == "confirm_action" or r.get("request_id") == ids.confirmed)
    ]
    expected = [
        ("write_note", "alice", "preview", "confirmation_required"),
        ("write_note", "alice", "committed", "confirmed"),
        ("confirm_action", "alice", "not_executed", "confirm.token_used"),
    ]
    check(flow == expected, f"audit of the confirmation: expected {expected}, got {flow}")


CEDAR_POLICIES = """
@id("everyone-lists")
permit(principal, action == Toolgate::Action::"tools/list", resource);

@id("readers-read")
permit(principal in Toolgate::Role::"reader", action == Toolgate::Action::"read_ledger", resource);

@id("writers-write-approved")
permit(principal in Toolgate::Role::"writer", action == Toolgate::Action::"write_note", resource)
when { context.arguments.text like "approved*" };
"""


async def cedar_writer(session: ClientSession, responses: Responses, mode: str, ids: Ids, workdir: Path) -> None:
    await handshake(session, mode)
    names = sorted(await list_tool_names(session))
    check(names == ["write_note"], f"the writer's tools/list under Cedar: {names}")
    written, _ = await write_note(session, ids.cedar, "approved by the Python SDK")
    check(written == {"request_id": ids.cedar, "status": "committed"}, f"the writer's approved note: {written!r}")
    refused = await session.call_tool("write_note", {"request_id": ids.cedar + "-x", "text": "unapproved"})
    check(refused.is_error, f"an unapproved note was written: {refused!r}")
    details = refused.structured_content or {}
    check(details.get("rule") == "cedar" and details.get("policies") == [], f"the refusal's details: {details!r}")
    check(note_file(ids.cedar + "-x") not in note_files(workdir / "ledger"), "the refused note was written")
    print("  writer (role from token create --attr): lists write_note only; approved: committed; "
          "unapproved: isError rule cedar")


async def cedar_reader(session: ClientSession, responses: Responses, mode: str, ids: Ids, workdir: Path) -> None:
    await handshake(session, mode)
    names = sorted(await list_tool_names(session))
    check(names == ["read_ledger"], f"the reader's tools/list under Cedar: {names}")
    try:
        result = await session.call_tool("write_note", {"request_id": ids.cedar + "-r", "text": "approved"})
    except MCPError as err:
        check(err.code == INVALID_PARAMS, f"the reader's write_note: expected {INVALID_PARAMS}, got {err.code}")
    else:
        raise CheckFailed(f"the reader's write_note was not refused as unknown: {result!r}")
    print("  reader: lists read_ledger only; write_note refused as an unknown tool")


async def cedar_phase(server: str, policy: Path, workdir: Path, mode: str, ids: Ids) -> None:
    """Cedar policies over HTTP: roles from `token create --attr role=...`."""
    probe = subprocess.run([server, "policy", "schema"], capture_output=True, stdin=subprocess.DEVNULL)
    if probe.returncode != 0:
        print("  this build has no Cedar support: the Cedar phase is skipped")
        return
    ledger = workdir / "ledger"
    cedar_policy = json.loads(policy.read_text())
    cedar_policy["cedar"] = "roles.cedar"
    (workdir / "roles.cedar").write_text(CEDAR_POLICIES)
    (workdir / "policy-cedar.json").write_text(json.dumps(cedar_policy))

    def token(principal: str, role: str) -> str:
        lines = operator(server, ledger, "token", "create", "--principal", principal, "--attr", f"role={role}").splitlines()
        check(len(lines) == 1 and lines[0].startswith("tgt_"), f"token create --attr for {principal}")
        return lines[0]

    writer, reader = token("carol", "writer"), token("dave", "reader")
    async with http_server(server, workdir / "policy-cedar.json", ledger, workdir / "server-cedar.stderr") as url:
        await with_http_session(url, writer, lambda s, r: cedar_writer(s, r, mode, ids, workdir))
        await with_http_session(url, reader, lambda s, r: cedar_reader(s, r, mode, ids, workdir))
    records = [r for r in audit_records(ledger) if r.get("principal") in ("carol", "dave") and r.get("method") == "tools/call"]
    seen = [(r.get("principal"), r.get("reason"), r.get("cedar_policies")) for r in records]
    expected = [
        ("carol", "allow", ["writers-write-approved"]),
        ("carol", "cedar", []),
        ("dave", "cedar.list", []),
    ]
    check(seen == expected, f"audit under Cedar (principal, reason, cedar_policies): expected {expected}, got {seen}")
    digest = hashlib.sha256(CEDAR_POLICIES.encode()).hexdigest()
    check(all(r.get("cedar_digest") == digest for r in records), "a record under Cedar lacks the set's digest")
    print("  audit: the determining Cedar policies and the set's digest on every call record")


async def run_mode(server: str, policy: Path, confirm_policy: Path, mode: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"toolgate-interop-py-http-{mode}-"))
    ledger = workdir / "ledger"
    ids = Ids(mode)
    try:
        shutil.copyfile(policy, workdir / "policy.json")
        shutil.copyfile(confirm_policy, workdir / "policy-confirm.json")
        print(f"python SDK {dist_version('mcp')} over Streamable HTTP, {mode} flow:")
        alice_token = create_token(server, ledger, "alice")
        bob_token = create_token(server, ledger, "bob")

        async with http_server(server, workdir / "policy.json", ledger, workdir / "server.stderr") as url:
            print(f"  serving at {url}")
            seen = await with_http_session(url, alice_token, lambda s, r: alice(s, r, mode, ids, workdir))
            if mode == "initialize":
                # The SDK ends its session with DELETE and expects 200 or 204: on rmcp's 202 it logs
                # "Session termination failed: 202" (a warning; the session is ended all the same).
                check(seen[-1][0] == "DELETE" and seen[-1][1] in (200, 202, 204), f"end of session: {seen[-1]}")
                print(f"  alice's session ended: DELETE answered {seen[-1][1]}")
            await with_http_session(url, bob_token, lambda s, r: bob(s, r, mode, ids, workdir))
            await wrong_token(url, mode)
        print("  SIGTERM: exit 0")
        check_principals(ledger, ids, [alice_token, bob_token])

        async with http_server(server, workdir / "policy-confirm.json", ledger, workdir / "server-confirm.stderr") as url:
            await with_http_session(url, alice_token, lambda s, r: confirmation(s, r, mode, ids, workdir))
        check_confirmation_audit(ledger, ids)
        await cedar_phase(server, policy, workdir, mode, ids)
        verified = operator(server, ledger, "audit", "verify").strip()
        print(f"  {verified}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_client("python SDK client over HTTP", __doc__.splitlines()[2], run_mode, files=2)
