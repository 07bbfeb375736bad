#!/usr/bin/env node
// Drive toolgate-server with the official MCP TypeScript SDK's own stdio client.
//
// Usage: node typescript_client.mjs SERVER_BINARY POLICY_JSON
//
// One fresh server process and temporary ledger, over the SDK's initialize handshake
// (this SDK version speaks up to 2025-11-25; it has no server/discover):
//   1. tools/list: write_note and read_ledger present, rm_rf absent;
//   2. write_note twice with the same request_id and text: "committed", then "replay"
//      (the SDK also validates structuredContent against each tool's outputSchema);
//   3. rm_rf called directly rejects with the SDK's McpError, code -32602, and the file it
//      names still exists;
//   4. read_ledger: exactly the one note written in step 2;
//   5. an argument refusal (write_note with an undeclared argument) reaches the caller as an
//      isError result whose text starts with "Error:" and ends with its JSON details, repeated as
//      structuredContent. This SDK validates structuredContent against the tool's outputSchema
//      even when isError is true: the gate lists write_note's schema extended with its own shapes.
// Exits 0 when every check passes, 1 with a message naming the failed check.

import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';

import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';

import { CheckFailed, EXPECTED_SDK_VERSION, check, checkedSdkVersion, runClient, withSession } from './sdk_harness.mjs';

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

async function writeNote(client, requestId, text) {
  const result = await client.callTool({ name: 'write_note', arguments: { request_id: requestId, text } });
  check(!result.isError, `write_note returned isError=true: ${JSON.stringify(result.content)}`);
  return result.structuredContent;
}

async function scenario(client, workdir) {
  const server = client.getServerVersion();
  console.log(`  initialize: server ${server?.name} ${server?.version}`);

  const names = await listToolNames(client);
  check(names.includes('write_note'), `tools/list lacks write_note: ${JSON.stringify(names)}`);
  check(names.includes('read_ledger'), `tools/list lacks read_ledger: ${JSON.stringify(names)}`);
  check(!names.includes('rm_rf'), `tools/list shows the denied tool rm_rf: ${JSON.stringify(names)}`);
  console.log(`  tools/list: ${JSON.stringify([...names].sort())} (rm_rf absent)`);

  const requestId = 'interop-ts-initialize-0001';
  const text = `written by the official TypeScript SDK ${EXPECTED_SDK_VERSION}`;
  const first = await writeNote(client, requestId, text);
  check(
    isDeepStrictEqual(first, { request_id: requestId, status: 'committed' }),
    `first write_note: expected committed, got ${JSON.stringify(first)}`,
  );
  const second = await writeNote(client, requestId, text);
  check(
    isDeepStrictEqual(second, { request_id: requestId, status: 'replay' }),
    `repeated write_note: expected replay, got ${JSON.stringify(second)}`,
  );
  console.log('  write_note x2: committed, then replay');

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
  console.log(`  rm_rf: McpError ${refused.code} ${JSON.stringify(refused.message)}`);

  const ledger = await client.callTool({ name: 'read_ledger', arguments: {} });
  check(!ledger.isError, `read_ledger returned isError=true: ${JSON.stringify(ledger.content)}`);
  const notes = ledger.structuredContent?.notes;
  check(Array.isArray(notes), `read_ledger structuredContent: ${JSON.stringify(ledger.structuredContent)}`);
  check(
    isDeepStrictEqual(notes.map((n) => ({ request_id: n.request_id, text: n.text })), [{ request_id: requestId, text }]),
    `read_ledger: expected exactly the one note ${requestId}, got ${JSON.stringify(notes)}`,
  );
  console.log('  read_ledger: the one note, text intact');

  const refusal = await client.callTool({
    name: 'write_note',
    arguments: { request_id: 'interop-refused-0001', text: 'x', colour: 'red' },
  });
  check(refusal.isError === true, `a refused write_note must be an isError result: ${JSON.stringify(refusal)}`);
  const refusalText = refusal.content?.[0]?.text ?? '';
  check(refusalText.startsWith('Error:'), `refusal text must start with Error: ${refusalText}`);
  const detailsLine = refusalText.trim().split('\n').pop();
  const details = JSON.parse(detailsLine);
  check(details.rule === 'input_schema.unknown_argument', `refusal details: ${detailsLine}`);
  check(isDeepStrictEqual(refusal.structuredContent, details), `refusal structuredContent: ${JSON.stringify(refusal.structuredContent)}`);
  console.log(`  refusal: isError result, rule ${details.rule}, structuredContent = the details`);
}

async function main(serverPath, policyPath) {
  const installed = checkedSdkVersion();
  console.log(`typescript SDK ${installed} on Node ${process.versions.node}, initialize flow:`);
  const workdir = mkdtempSync(join(tmpdir(), 'toolgate-interop-ts-'));
  try {
    copyFileSync(policyPath, join(workdir, 'policy.json'));
    await withSession(
      {
        command: serverPath,
        args: ['--policy', join(workdir, 'policy.json'), '--ledger', join(workdir, 'ledger')],
        cwd: workdir,
        clientName: 'toolgate-interop-ts',
      },
      (client) => scenario(client, workdir),
    );
  } finally {
    rmSync(workdir, { recursive: true, force: true });
  }
}

await runClient('typescript SDK client', 'node typescript_client.mjs SERVER_BINARY POLICY_JSON', main);
