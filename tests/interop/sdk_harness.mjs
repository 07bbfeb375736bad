// What the TypeScript SDK clients share: the checks, the SDK version check, one session against
// a fresh server process under a timeout (its stderr shown when the session fails), a server over
// Streamable HTTP with its bearer tokens and one session against it, and the command-line entry
// point that turns any failure into a one-line message and exit code 1.

import { execFileSync, spawn } from 'node:child_process';
import { accessSync, constants, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

export const EXPECTED_SDK_VERSION = '1.32.2';
export const TIMEOUT_MS = 60_000;
// A server over HTTP: how long it may take to say where it listens, and to stop on SIGTERM.
export const START_TIMEOUT_MS = 60_000;
export const STOP_TIMEOUT_MS = 30_000;
const LISTENING = 'toolgate-server: serving Streamable HTTP at ';

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

/** Runs `promise` against a deadline: a CheckFailed saying `what` when `ms` pass first. */
async function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailed(`${what} within ${ms / 1000}s`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Runs `SERVER --ledger LEDGER ARGS...` (a token or audit command) and returns its stdout; a
 * non-zero exit is a failed check naming the command and its stderr.
 */
export function operator(server, ledger, ...args) {
  try {
    return execFileSync(server, ['--ledger', ledger, ...args], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: TIMEOUT_MS,
    });
  } catch (error) {
    throw new CheckFailed(`\`toolgate-server ${args.join(' ')}\` failed (${error.status ?? error.signal ?? error.code}): ${String(error.stderr ?? '').trim()}`);
  }
}

/** `token create --principal P`: the token is its only line on stdout. */
export function createToken(server, ledger, principal) {
  const lines = operator(server, ledger, 'token', 'create', '--principal', principal).split('\n').filter(Boolean);
  check(lines.length === 1 && lines[0].startsWith('tgt_'), `token create for ${principal}: expected one tgt_ line on stdout, got ${lines.length} lines`);
  return lines[0];
}

/**
 * Starts `SERVER --policy P --ledger L serve --http 127.0.0.1:0`, waits for the line that names its
 * URL and runs `body(url)`; then stops it with SIGTERM and checks that it exits 0 (a clean stop).
 * On any failure prints the last lines of its stderr. The process never outlives the call.
 */
export async function withHttpServer({ server, policy, ledger }, body) {
  const stderrLines = [];
  const child = spawn(server, ['--policy', policy, '--ledger', ledger, 'serve', '--http', '127.0.0.1:0'], {
    cwd: dirname(ledger),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  let exit;
  exited.then((status) => {
    exit = status;
  });
  const listening = new Promise((resolve, reject) => {
    let partial = '';
    child.stderr.on('data', (chunk) => {
      const lines = (partial + chunk.toString()).split('\n');
      partial = lines.pop();
      for (const line of lines) {
        stderrLines.push(line);
        if (line.startsWith(LISTENING)) resolve(line.slice(LISTENING.length).trim());
      }
    });
    child.on('error', (error) => reject(new CheckFailed(`cannot start the HTTP server: ${error.message}`)));
    exited.then(({ code, signal }) => reject(new CheckFailed(`the HTTP server exited (${code ?? signal}) before listening`)));
  });
  try {
    const url = await within(START_TIMEOUT_MS, 'the HTTP server did not say where it listens', listening);
    await body(url);
    child.kill('SIGTERM');
    const { code, signal } = await within(STOP_TIMEOUT_MS, 'the HTTP server did not stop after SIGTERM', exited);
    check(code === 0, `the HTTP server exited ${code ?? signal} on SIGTERM, expected 0`);
  } catch (error) {
    const tail = stderrLines.slice(-20);
    if (tail.length > 0) {
      console.error(`  server stderr (last ${tail.length} lines):`);
      for (const line of tail) console.error(`    ${line}`);
    }
    throw error;
  } finally {
    if (exit === undefined && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await exited;
    }
  }
}

/**
 * The SDK's Streamable HTTP transport to `url` with `Authorization: Bearer TOKEN` on every request
 * (`requestInit.headers`); `responses` collects {method, status, wwwAuthenticate} of each HTTP
 * response the SDK receives (through the transport's `fetch` option).
 */
export function httpTransport(url, token, responses = []) {
  return new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
    fetch: async (input, init) => {
      const response = await fetch(input, init);
      responses.push({ method: init?.method ?? 'GET', status: response.status, wwwAuthenticate: response.headers.get('www-authenticate') });
      return response;
    },
  });
}

/**
 * Connects a client named `clientName` to `url` with `token` and runs `body(client, responses)`,
 * then ends the session with the SDK's `terminateSession()` (HTTP DELETE; the SDK throws unless
 * the server accepts it or answers 405), all within TIMEOUT_MS.
 */
export async function withHttpSession({ url, token, clientName }, body) {
  const responses = [];
  const transport = httpTransport(url, token, responses);
  const client = new Client({ name: clientName, version: '0.0.0' });
  try {
    await within(
      TIMEOUT_MS,
      'no answer',
      (async () => {
        await client.connect(transport);
        await body(client, responses);
        await transport.terminateSession();
      })(),
    );
  } finally {
    await client.close().catch(() => {});
  }
  return responses;
}

/**
 * `node CLIENT SERVER_BINARY FILE...` (`files` paths, the policy first): runs
 * `main(server, ...files)`, exits 0, 1 (a failed check) or 2 (usage).
 */
export async function runClient(label, usage, main, files = 1) {
  const [serverPath, ...paths] = process.argv.slice(2);
  if (!serverPath || paths.length !== files) {
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
    await main(serverPath, ...paths);
    console.log(`${label}: all checks passed`);
  } catch (error) {
    const what = error instanceof CheckFailed ? error.message : `${error?.name}: ${error?.message}`;
    console.error(`FAIL (${label}): ${what}`);
    process.exit(1);
  }
}
