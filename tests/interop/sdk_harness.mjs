// What the TypeScript SDK clients share: the checks, the SDK version check, one session against
// a fresh server process under a timeout (its stderr shown when the session fails), and the
// command-line entry point that turns any failure into a one-line message and exit code 1.

import { accessSync, constants, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

export const EXPECTED_SDK_VERSION = '1.32.2';
export const TIMEOUT_MS = 60_000;

export class CheckFailed extends Error {}

export function check(condition, message) {
  if (!condition) throw new CheckFailed(message);
}

/** The installed @modelcontextprotocol/sdk version, checked against the pin. */
export function checkedSdkVersion() {
  const require = createRequire(import.meta.url);
  const pkgPath = join(require.resolve('@modelcontextprotocol/sdk/client/index.js'), '..', '..', '..', '..', 'package.json');
  const installed = JSON.parse(readFileSync(pkgPath, 'utf8')).version;
  check(installed === EXPECTED_SDK_VERSION, `expected @modelcontextprotocol/sdk ${EXPECTED_SDK_VERSION}, found ${installed}`);
  return installed;
}

/**
 * Starts `command args` as a stdio server, connects a client named `clientName` and runs
 * `body(client)`, all within TIMEOUT_MS; on failure prints the server's last stderr lines.
 */
export async function withSession({ command, args, env, cwd, clientName }, body) {
  const stderrLines = [];
  const transport = new StdioClientTransport({ command, args, env, cwd, stderr: 'pipe' });
  transport.stderr?.on('data', (chunk) => stderrLines.push(...chunk.toString().split('\n').filter(Boolean)));
  const client = new Client({ name: clientName, version: '0.0.0' });
  let timer;
  try {
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new CheckFailed(`no answer within ${TIMEOUT_MS / 1000}s`)), TIMEOUT_MS);
    });
    await Promise.race([
      (async () => {
        await client.connect(transport);
        await body(client);
      })(),
      timeout,
    ]);
  } catch (error) {
    const tail = stderrLines.slice(-20);
    if (tail.length > 0) {
      console.error(`  server stderr (last ${tail.length} lines):`);
      for (const line of tail) console.error(`    ${line}`);
    }
    throw error;
  } finally {
    clearTimeout(timer);
    await client.close().catch(() => {});
  }
}

/** `node CLIENT SERVER_BINARY POLICY_JSON`: runs `main`, exits 0, 1 (a failed check) or 2 (usage). */
export async function runClient(label, usage, main) {
  const [serverPath, policyPath] = process.argv.slice(2);
  if (!serverPath || !policyPath) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  try {
    accessSync(serverPath, constants.X_OK);
  } catch {
    console.error(`${label}: server binary ${serverPath} is not executable`);
    process.exit(2);
  }
  try {
    await main(serverPath, policyPath);
    console.log(`${label}: all checks passed`);
  } catch (error) {
    const what = error instanceof CheckFailed ? error.message : `${error?.name}: ${error?.message}`;
    console.error(`FAIL (${label}): ${what}`);
    process.exit(1);
  }
}
