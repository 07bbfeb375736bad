#!/usr/bin/env node
// Drive toolgate-server over Streamable HTTP with the official MCP TypeScript SDK's own client
// (StreamableHTTPClientTransport, `Authorization: Bearer <token>` in requestInit.headers).
//
// Usage: node typescript_http_client.mjs SERVER_BINARY POLICY_JSON CONFIRM_POLICY_JSON
//
// One fresh temporary ledger, tokens for alice and bob made by `toolgate-server token create`,
// `serve --http 127.0.0.1:0` servers that must stop with exit status 0 on SIGTERM, the SDK's
// initialize handshake (this SDK version speaks up to 2025-11-25; it has no server/discover), each
// session ended with the SDK's terminateSession() (DELETE). With POLICY_JSON (fixtures/policy.json):
//   1. alice: tools/list has write_note and read_ledger, not rm_rf; write_note twice with one
//      request_id: "committed", then "replay" (the gate's replay, `_meta` io.toolgate/replayed),
//      and exactly one note file in LEDGER/notes; rm_rf called directly rejects with the SDK's
//      McpError -32602 and its target file survives; read_ledger returns the one note;
//   2. bob, with his own token and alice's request_id: the gate runs his call under his own key
//      (no replay of alice's result: no io.toolgate/replayed). The reference server's notes are
//      one directory named by request_id alone, so its handler finds alice's note and answers
//      "replay" (not "committed"): checked as it is, see docs/http.md. His retry is the gate's
//      replay; a request_id of his own is "committed";
//   3. a well-formed token the server never issued: connect() rejects with the SDK's
//      StreamableHTTPError, code 401, after an HTTP 401 whose WWW-Authenticate is a Bearer
//      challenge naming invalid_token;
//   4. the audit log names alice and bob in the `principal` of their write_note records, in
//      order, records the refusal of step 3 (without the token) and no token at all.
// Then, on the same ledger, with CONFIRM_POLICY_JSON (fixtures/policy-http-confirm.json:
// write_note is a `notify` effect, so it needs two-step confirmation):
//   5. alice's write_note is held: a preview with confirm_token and confirm_summary (valid against
//      the outputSchema the gate lists, which this SDK checks), no note file; confirm_action with
//      both executes it: "committed", the note file appears; the same confirm_action again is an
//      isError result `token_used`; the audit log records the preview, the confirmed call and the
//      refused reuse;
//   6. `toolgate-server audit verify` accepts the whole chain (exit 0).
// Exits 0 when every check passes, 1 with a message naming the failed check.

import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';

import {
  CheckFailed,
  EXPECTED_SDK_VERSION,
  check,
  checkedSdkVersion,
  createToken,
  httpTransport,
  operator,
  runClient,
  withHttpServer,
  withHttpSession,
} from './sdk_harness.mjs';

const REPLAYED = 'io.toolgate/replayed';
const UNKNOWN_TOKEN = `tgt_${'0'.repeat(64)}`;
const ids = {
  shared: 'interop-ts-http-0001', // alice's, then bob's too
  bobs: 'interop-ts-http-bob-0002',
  confirmed: 'interop-ts-http-confirm-0003',
  text: `written over Streamable HTTP by the official TypeScript SDK ${EXPECTED_SDK_VERSION}`,
};

async function listToolNames(client) {
  const names = [];
  let cursor;
  do {
    const result = await client.listTools(cursor === undefined ? undefined : { cursor });
    names.push(...result.tools.map((tool) => tool.name));
    cursor = result.nextCursor;
  } while (cursor !== undefined);
  return names;
}

const textOf = (result) => (result.content ?? []).map((block) => block.text ?? '').join(' ');
const replayed = (result) => result._meta?.[REPLAYED] === true;
const noteFile = (requestId) => `${createHash('sha256').update(requestId).digest('hex')}.json`;
const noteFiles = (ledger) => (existsSync(join(ledger, 'notes')) ? readdirSync(join(ledger, 'notes')).sort() : []);
const auditRecords = (ledger) =>
  readFileSync(join(ledger, 'audit.jsonl'), 'utf8')
    .split('\n')
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line));

/** write_note's structuredContent, and whether the gate marked it as its replay. */
async function writeNote(client, requestId, text) {
  const result = await client.callTool({ name: 'write_note', arguments: { request_id: requestId, text } });
  check(!result.isError, `write_note returned isError=true: ${textOf(result)}`);
  return [result.structuredContent, replayed(result)];
}

async function alice(client, workdir) {
  const ledger = join(workdir, 'ledger');
  const server = client.getServerVersion();
  console.log(`  alice initialize: server ${server?.name} ${server?.version}`);

  const names = await listToolNames(client);
  check(names.includes('write_note'), `tools/list lacks write_note: ${JSON.stringify(names)}`);
  check(names.includes('read_ledger'), `tools/list lacks read_ledger: ${JSON.stringify(names)}`);
  check(!names.includes('rm_rf'), `tools/list shows the denied tool rm_rf: ${JSON.stringify(names)}`);
  console.log(`  alice tools/list: ${JSON.stringify([...names].sort())} (rm_rf absent)`);

  const [first, firstReplayed] = await writeNote(client, ids.shared, ids.text);
  check(
    isDeepStrictEqual(first, { request_id: ids.shared, status: 'committed' }) && !firstReplayed,
    `alice's first write_note: expected committed, got ${JSON.stringify(first)} (replayed=${firstReplayed})`,
  );
  const [second, secondReplayed] = await writeNote(client, ids.shared, ids.text);
  check(
    isDeepStrictEqual(second, { request_id: ids.shared, status: 'replay' }) && secondReplayed,
    `alice's repeated write_note: expected the gate's replay, got ${JSON.stringify(second)} (replayed=${secondReplayed})`,
  );
  const files = noteFiles(ledger);
  check(isDeepStrictEqual(files, [noteFile(ids.shared)]), `LEDGER/notes after two writes: expected exactly one note, found ${JSON.stringify(files)}`);
  console.log('  alice write_note x2: committed, then replay; one note file');

  const target = join(workdir, 'precious.txt');
  writeFileSync(target, 'must survive rm_rf\n');
  let refused;
  try {
    const result = await client.callTool({ name: 'rm_rf', arguments: { path: target } });
    throw new CheckFailed(`rm_rf did not reject; the SDK returned ${JSON.stringify(result)}`);
  } catch (error) {
    if (error instanceof CheckFailed) throw error;
    refused = error;
  }
  check(refused instanceof McpError, `rm_rf: expected McpError, got ${refused?.name}: ${refused?.message}`);
  check(refused.code === ErrorCode.InvalidParams, `rm_rf: expected code -32602, got ${refused.code} (${refused.message})`);
  check(/not found/i.test(refused.message), `rm_rf: expected a 'tool not found' message, got ${refused.message}`);
  check(readFileSync(target, 'utf8') === 'must survive rm_rf\n', 'rm_rf changed its target file');
  console.log(`  alice rm_rf: McpError ${refused.code} ${JSON.stringify(refused.message)}`);

  const ledgerResult = await client.callTool({ name: 'read_ledger', arguments: {} });
  check(!ledgerResult.isError, `read_ledger returned isError=true: ${textOf(ledgerResult)}`);
  const notes = ledgerResult.structuredContent?.notes;
  check(Array.isArray(notes), `read_ledger structuredContent: ${JSON.stringify(ledgerResult.structuredContent)}`);
  check(
    isDeepStrictEqual(notes.map((n) => ({ request_id: n.request_id, text: n.text })), [{ request_id: ids.shared, text: ids.text }]),
    `read_ledger: expected exactly the one note ${ids.shared}, got ${JSON.stringify(notes)}`,
  );
  console.log('  alice read_ledger: the one note, text intact');
}

async function bob(client, workdir) {
  const ledger = join(workdir, 'ledger');
  const [same, sameReplayed] = await writeNote(client, ids.shared, ids.text);
  check(!sameReplayed, `bob's write_note with alice's request_id was the gate's replay of alice's result: ${JSON.stringify(same)}`);
  check(
    isDeepStrictEqual(same, { request_id: ids.shared, status: 'replay' }),
    "bob's write_note with alice's request_id: expected the handler's 'replay' (the reference server's notes are keyed by " +
      `request_id alone; if they are per principal now, expect 'committed' here), got ${JSON.stringify(same)}`,
  );
  const [again, againReplayed] = await writeNote(client, ids.shared, ids.text);
  check(
    isDeepStrictEqual(again, { request_id: ids.shared, status: 'replay' }) && againReplayed,
    `bob's retry: expected the gate's replay of his own call, got ${JSON.stringify(again)} (replayed=${againReplayed})`,
  );
  const [own, ownReplayed] = await writeNote(client, ids.bobs, ids.text);
  check(
    isDeepStrictEqual(own, { request_id: ids.bobs, status: 'committed' }) && !ownReplayed,
    `bob's own request_id: expected committed, got ${JSON.stringify(own)} (replayed=${ownReplayed})`,
  );
  const files = noteFiles(ledger);
  const expected = [noteFile(ids.shared), noteFile(ids.bobs)].sort();
  check(isDeepStrictEqual(files, expected), `LEDGER/notes after bob's writes: expected ${JSON.stringify(expected)}, found ${JSON.stringify(files)}`);
  console.log(
    "  bob write_note with alice's request_id: run for bob (no gate replay), handler says replay; retry: gate replay; his own request_id: committed",
  );
}

async function wrongToken(url) {
  const responses = [];
  const transport = httpTransport(url, UNKNOWN_TOKEN, responses);
  const client = new Client({ name: 'toolgate-interop-ts-http', version: '0.0.0' });
  let refused;
  try {
    await client.connect(transport);
  } catch (error) {
    refused = error;
  } finally {
    await client.close().catch(() => {});
  }
  check(refused !== undefined, `a token the server never issued was accepted (responses: ${JSON.stringify(responses)})`);
  check(refused instanceof StreamableHTTPError, `unknown token: expected StreamableHTTPError, got ${refused?.name}: ${refused?.message}`);
  check(refused.code === 401, `unknown token: expected code 401, got ${refused.code} (${refused.message})`);
  check(responses.length === 1 && responses[0].status === 401, `unknown token: expected one HTTP 401, the SDK got ${JSON.stringify(responses)}`);
  const challenge = responses[0].wwwAuthenticate ?? '';
  check(
    challenge.startsWith('Bearer ') && challenge.includes('resource_metadata="') && challenge.includes('error="invalid_token"'),
    `unknown token: WWW-Authenticate ${JSON.stringify(challenge)}`,
  );
  console.log(`  unknown token: HTTP 401 (${challenge.split(',')[0]}, ...); the SDK threw StreamableHTTPError ${refused.code}`);
}

function checkPrincipals(ledger, tokens) {
  const text = readFileSync(join(ledger, 'audit.jsonl'), 'utf8');
  for (const token of [...tokens, UNKNOWN_TOKEN]) check(!text.includes(token), 'a bearer token reached the audit log');
  const records = auditRecords(ledger);
  const writes = records
    .filter((r) => r.method === 'tools/call' && r.name === 'write_note')
    .map((r) => [r.principal, r.outcome, r.request_id]);
  const expected = [
    ['alice', 'committed', ids.shared],
    ['alice', 'replay', ids.shared],
    ['bob', 'replay', ids.shared],
    ['bob', 'replay', ids.shared],
    ['bob', 'committed', ids.bobs],
  ];
  check(isDeepStrictEqual(writes, expected), `audit write_note records [principal, outcome, request_id]: expected ${JSON.stringify(expected)}, got ${JSON.stringify(writes)}`);
  const denied = records.filter((r) => r.name === 'rm_rf').map((r) => [r.principal, r.decision]);
  check(isDeepStrictEqual(denied, [['alice', 'deny']]), `audit rm_rf records: ${JSON.stringify(denied)}`);
  const refusals = records.filter((r) => r.method === 'http/authenticate').map((r) => r.reason);
  check(isDeepStrictEqual(refusals, ['invalid_token']), `audit http/authenticate records: ${JSON.stringify(refusals)}`);
  console.log("  audit: alice's and bob's write_note records under their principals, rm_rf denied, the unknown token refused, no token in the log");
}

async function confirmation(client, workdir) {
  const ledger = join(workdir, 'ledger');
  const names = await listToolNames(client);
  for (const name of ['write_note', 'confirm_action', 'reject_action']) {
    check(names.includes(name), `tools/list under the confirmation policy lacks ${name}: ${JSON.stringify(names)}`);
  }
  const before = noteFiles(ledger);

  const held = await client.callTool({ name: 'write_note', arguments: { request_id: ids.confirmed, text: ids.text } });
  check(!held.isError, `write_note under confirmation returned isError=true: ${textOf(held)}`);
  const preview = held.structuredContent;
  check(preview?.status === 'preview', `write_note was not held for confirmation: ${JSON.stringify(preview)}`);
  check(preview.tool === 'write_note', `preview names ${JSON.stringify(preview.tool)}`);
  const { confirm_token: token, confirm_summary: summary } = preview;
  check(typeof token === 'string' && /^[0-9a-f]{64}$/.test(token), `confirm_token: ${JSON.stringify(token)}`);
  check(typeof summary === 'string' && summary.length > 0, `confirm_summary: ${JSON.stringify(summary)}`);
  check(isDeepStrictEqual(noteFiles(ledger), before), 'a preview wrote a note');
  console.log(`  alice write_note: held, preview ${JSON.stringify(summary)}`);

  const done = await client.callTool({ name: 'confirm_action', arguments: { confirm_token: token, confirm_summary: summary } });
  check(!done.isError, `confirm_action failed: ${textOf(done)}`);
  check(
    isDeepStrictEqual(done.structuredContent, { request_id: ids.confirmed, status: 'committed' }),
    `confirm_action: expected write_note's committed, got ${JSON.stringify(done.structuredContent)}`,
  );
  const after = noteFiles(ledger);
  check(isDeepStrictEqual(after, [...before, noteFile(ids.confirmed)].sort()), `LEDGER/notes after confirm_action: ${JSON.stringify(after)}`);
  const again = await client.callTool({ name: 'confirm_action', arguments: { confirm_token: token, confirm_summary: summary } });
  check(again.isError === true && textOf(again).includes('token_used'), `a used confirmation token was accepted: ${textOf(again)}`);
  check(isDeepStrictEqual(noteFiles(ledger), after), 'a second confirm_action wrote a note');
  console.log('  confirm_action: committed, one note; the same token again: token_used');
}

function checkConfirmationAudit(ledger) {
  const flow = auditRecords(ledger)
    .filter((r) => r.method === 'tools/call' && (r.name === 'confirm_action' || (r.name === 'write_note' && r.request_id === ids.confirmed)))
    .map((r) => [r.name, r.principal, r.outcome, r.reason]);
  const expected = [
    ['write_note', 'alice', 'preview', 'confirmation_required'],
    ['write_note', 'alice', 'committed', 'confirmed'],
    ['confirm_action', 'alice', 'not_executed', 'confirm.token_used'],
  ];
  check(isDeepStrictEqual(flow, expected), `audit of the confirmation: expected ${JSON.stringify(expected)}, got ${JSON.stringify(flow)}`);
}

async function main(server, policyPath, confirmPolicyPath) {
  const installed = checkedSdkVersion();
  console.log(`typescript SDK ${installed} on Node ${process.versions.node} over Streamable HTTP, initialize flow:`);
  const workdir = mkdtempSync(join(tmpdir(), 'toolgate-interop-ts-http-'));
  const ledger = join(workdir, 'ledger');
  try {
    copyFileSync(policyPath, join(workdir, 'policy.json'));
    copyFileSync(confirmPolicyPath, join(workdir, 'policy-confirm.json'));
    const aliceToken = createToken(server, ledger, 'alice');
    const bobToken = createToken(server, ledger, 'bob');
    const clientName = 'toolgate-interop-ts-http';

    await withHttpServer({ server, policy: join(workdir, 'policy.json'), ledger }, async (url) => {
      console.log(`  serving at ${url}`);
      const seen = await withHttpSession({ url, token: aliceToken, clientName }, (client) => alice(client, workdir));
      const end = seen.at(-1);
      check(end?.method === 'DELETE' && end.status >= 200 && end.status < 300, `end of session: ${JSON.stringify(end)}`);
      console.log(`  alice's session ended: DELETE answered ${end.status}`);
      await withHttpSession({ url, token: bobToken, clientName }, (client) => bob(client, workdir));
      await wrongToken(url);
    });
    console.log('  SIGTERM: exit 0');
    checkPrincipals(ledger, [aliceToken, bobToken]);

    await withHttpServer({ server, policy: join(workdir, 'policy-confirm.json'), ledger }, async (url) => {
      await withHttpSession({ url, token: aliceToken, clientName }, (client) => confirmation(client, workdir));
    });
    checkConfirmationAudit(ledger);
    console.log(`  ${operator(server, ledger, 'audit', 'verify').trim()}`);
  } finally {
    rmSync(workdir, { recursive: true, force: true });
  }
}

await runClient(
  'typescript SDK client over HTTP',
  'node typescript_http_client.mjs SERVER_BINARY POLICY_JSON CONFIRM_POLICY_JSON',
  main,
  2,
);
