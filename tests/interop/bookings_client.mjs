#!/usr/bin/env node
// Drive the example server bookings-mcp with the official MCP TypeScript SDK's own stdio client.
//
// Usage: node bookings_client.mjs BOOKINGS_MCP_BINARY POLICY_JSON
//
// One fresh server process with fresh temporary ledger and data directories, over the SDK's
// initialize handshake (this SDK version speaks up to 2025-11-25):
//   1. tools/list: the four allowed tools, purge_bookings absent; a direct purge_bookings call
//      rejects with the SDK's McpError, code -32602, and nothing is purged;
//   2. create_booking three times with one request_id: one booking; the retries carry the
//      `_meta` marker io.toolgate/replayed and the first result (the SDK also validates each
//      structuredContent against the tool's outputSchema);
//   3. cancel_booking: a preview (nothing cancelled), then confirm_action with its token and
//      summary: cancelled;
//   4. notify_guest: a preview, then reject_action: nothing sent;
//   5. `bookings-mcp halt` while the server runs: the next create_booking rejects with an
//      McpError naming `bookings-mcp resume`; `bookings-mcp resume`: it works again;
//   6. after the session, `bookings-mcp verify` accepts the audit chain.
// Exits 0 when every check passes, 1 with a message naming the failed check.

import { execFile } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual, promisify } from 'node:util';

import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';

import { CheckFailed, TIMEOUT_MS, check, checkedSdkVersion, runClient, withSession } from './sdk_harness.mjs';

const HALTED = -32001;
const REPLAYED = 'io.toolgate/replayed';
const ALLOWED = ['cancel_booking', 'create_booking', 'list_bookings', 'notify_guest'];

const textOf = (result) => (result.content ?? []).map((block) => block.text ?? '').join('');

function stored(data) {
  return JSON.parse(readFileSync(join(data, 'bookings.json'), 'utf8'));
}

/** `bookings-mcp ARGS --ledger LEDGER`; fails the check unless it exits 0. */
async function operator(server, ledger, ...args) {
  try {
    const { stdout } = await promisify(execFile)(server, [...args, '--ledger', ledger], { timeout: TIMEOUT_MS });
    return stdout;
  } catch (error) {
    throw new CheckFailed(`\`bookings-mcp ${args.join(' ')}\` failed (${error.code}): ${error.stdout}${error.stderr}`);
  }
}

async function rejection(promise) {
  try {
    const result = await promise;
    throw new CheckFailed(`expected a JSON-RPC error, the SDK returned ${JSON.stringify(result)}`);
  } catch (error) {
    if (error instanceof CheckFailed) throw error;
    return error;
  }
}

async function scenario(client, server, ledger, data) {
  const info = client.getServerVersion();
  console.log(`  initialize: server ${info?.name} ${info?.version}`);
  const call = (name, args) => client.callTool({ name, arguments: args });

  // 1. The admin tool is hidden, and refused when called anyway.
  const names = (await client.listTools()).tools.map((tool) => tool.name).sort();
  for (const name of ALLOWED) check(names.includes(name), `tools/list lacks ${name}: ${JSON.stringify(names)}`);
  check(!names.includes('purge_bookings'), `tools/list shows the denied purge_bookings: ${JSON.stringify(names)}`);
  console.log(`  tools/list: ${JSON.stringify(names)} (purge_bookings absent)`);

  const args = { request_id: 'ts-initialize-0001', guest: 'Ada', date: '2026-09-01', nights: 2 };
  const first = await call('create_booking', args);
  check(!first.isError, `create_booking failed: ${textOf(first)}`);
  check(first._meta?.[REPLAYED] !== true, `the first create_booking is marked replayed: ${JSON.stringify(first._meta)}`);
  const booking = first.structuredContent;
  check(booking?.id === 'bk-1', `create_booking: ${JSON.stringify(booking)}`);
  // The policy's result allow-list: the stored payment token never leaves the server, and the SDK
  // (which validates structuredContent against the listed outputSchema) accepts the rest.
  const token = stored(data).bookings[0].payment_token;
  const listed = await call('list_bookings', {});
  for (const result of [first, listed]) {
    const dumped = JSON.stringify(result);
    check(!dumped.includes(token) && !dumped.includes('payment_token'), `the payment token left the server: ${dumped}`);
  }
  console.log('  results: payment_token dropped from create_booking and list_bookings');
  // An argument refusal of a tool with an output schema: isError, its details as the text's last
  // line and as structuredContent, which the SDK validates against the listed schema.
  const malformed = await call('create_booking', { ...args, request_id: 'ts-initialize-bad1', date: 'soon' });
  check(malformed.isError === true, `a malformed date was accepted: ${textOf(malformed)}`);
  const details = JSON.parse(textOf(malformed).trim().split('\n').pop());
  check(details.error === 'argument_rejected', `refusal details: ${JSON.stringify(details)}`);
  check(isDeepStrictEqual(malformed.structuredContent, details), `refusal structuredContent: ${JSON.stringify(malformed.structuredContent)}`);
  console.log(`  refusal: isError result, rule ${details.rule}, structuredContent = the details`);

  const refused = await rejection(call('purge_bookings', {}));
  check(refused instanceof McpError, `purge_bookings: expected McpError, got ${refused?.name}: ${refused?.message}`);
  check(refused.code === ErrorCode.InvalidParams, `purge_bookings: expected -32602, got ${refused.code} (${refused.message})`);
  check(stored(data).bookings.length === 1, 'purge_bookings changed the bookings');
  console.log(`  purge_bookings: McpError ${refused.code} ${JSON.stringify(refused.message)}`);

  // 2. Exactly once per request_id: the retries replay.
  for (const attempt of [2, 3]) {
    const retry = await call('create_booking', args);
    check(!retry.isError, `retry ${attempt} failed: ${textOf(retry)}`);
    check(retry._meta?.[REPLAYED] === true, `retry ${attempt} lacks _meta ${REPLAYED}: ${JSON.stringify(retry._meta)}`);
    check(isDeepStrictEqual(retry.structuredContent, booking), `retry ${attempt}: ${JSON.stringify(retry.structuredContent)}`);
  }
  check(stored(data).bookings.length === 1, `three calls made ${stored(data).bookings.length} bookings`);
  console.log('  create_booking x3: one booking, two replays');

  // 3. cancel_booking: a preview, then the confirmation executes it.
  const preview = (await call('cancel_booking', { id: 'bk-1' })).structuredContent;
  check(preview?.status === 'preview', `cancel_booking preview: ${JSON.stringify(preview)}`);
  check(stored(data).bookings[0].status === 'confirmed', 'the preview cancelled the booking');
  const done = await call('confirm_action', { confirm_token: preview.confirm_token, confirm_summary: preview.confirm_summary });
  check(!done.isError && done.structuredContent?.id === 'bk-1' && done.structuredContent?.status === 'cancelled', `confirm_action answered ${textOf(done)}`);
  check(!('payment_token' in (done.structuredContent ?? {})), `confirm_action leaked the payment token: ${textOf(done)}`);
  check(stored(data).bookings[0].status === 'cancelled', 'confirm_action did not cancel');
  console.log('  cancel_booking: preview, confirm_action -> cancelled');

  // 4. notify_guest: a preview, then the rejection sends nothing.
  const created = await call('create_booking', { request_id: 'ts-initialize-0002', guest: 'Bob', date: '2026-09-02', nights: 1 });
  check(!created.isError, `create_booking failed: ${textOf(created)}`);
  const notify = (await call('notify_guest', { id: 'bk-2', message: 'See you soon' })).structuredContent;
  check(notify?.status === 'preview', `notify_guest preview: ${JSON.stringify(notify)}`);
  const rejected = await call('reject_action', { confirm_token: notify.confirm_token });
  check(!rejected.isError, `reject_action failed: ${textOf(rejected)}`);
  const late = await call('confirm_action', { confirm_token: notify.confirm_token, confirm_summary: notify.confirm_summary });
  check(late.isError === true, `a rejected token was confirmed: ${textOf(late)}`);
  check(stored(data).outbox.length === 0, `a message was sent: ${JSON.stringify(stored(data).outbox)}`);
  console.log('  notify_guest: preview, reject_action -> not sent');

  // 5. The kill switch, set and lifted by the operator while the server runs.
  const halted = await operator(server, ledger, 'halt', '--reason', 'interop drill', '--by', 'interop');
  check(halted.includes('bookings-mcp resume'), `halt output: ${halted}`);
  const third = { request_id: 'ts-initialize-0003', guest: 'Cy', date: '2026-09-03', nights: 3 };
  const stopped = await rejection(call('create_booking', third));
  check(stopped instanceof McpError && stopped.code === HALTED, `halted create_booking: ${stopped?.code} ${stopped?.message}`);
  check(stopped.message.includes('bookings-mcp resume'), `the refusal does not name the resume command: ${stopped.message}`);
  console.log(`  halted: McpError ${stopped.code} ${JSON.stringify(stopped.message)}`);
  await operator(server, ledger, 'resume');
  const resumed = await call('create_booking', third);
  check(!resumed.isError, `create_booking after resume failed: ${textOf(resumed)}`);
  check(stored(data).bookings.length === 3, `after resume: ${stored(data).bookings.length} bookings`);
  await client.listTools(); // liveness
  console.log('  halt -> refused naming `bookings-mcp resume`; resume -> works');
}

async function main(serverPath, policyPath) {
  const installed = checkedSdkVersion();
  console.log(`typescript SDK ${installed} on Node ${process.versions.node}, bookings-mcp, initialize flow:`);
  const workdir = mkdtempSync(join(tmpdir(), 'toolgate-interop-bookings-ts-'));
  const ledger = join(workdir, 'ledger');
  const data = join(workdir, 'data');
  try {
    copyFileSync(policyPath, join(workdir, 'policy.json'));
    await withSession(
      {
        command: serverPath,
        args: ['--policy', join(workdir, 'policy.json'), '--ledger', ledger],
        env: { BOOKINGS_DATA: data },
        cwd: workdir,
        clientName: 'toolgate-interop-bookings-ts',
      },
      (client) => scenario(client, serverPath, ledger, data),
    );
    // 6. The chain the session wrote verifies.
    const verified = await operator(serverPath, ledger, 'verify');
    check(verified.startsWith('verify: intact:'), `verify: ${verified}`);
    console.log(`  ${verified.trim()}`);
  } finally {
    rmSync(workdir, { recursive: true, force: true });
  }
}

await runClient('typescript SDK client (bookings-mcp)', 'node bookings_client.mjs BOOKINGS_MCP_BINARY POLICY_JSON', main);
