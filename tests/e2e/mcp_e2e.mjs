// End-to-end: the official MCP TypeScript SDK (a real client, the one agents use) drives
// `cordon mcp` over stdio. The SDK validates every structuredContent against the tool's
// outputSchema, so a result that does not match its schema fails here.
//
//   node tests/e2e/mcp_e2e.mjs            (CORDON_BIN: the cordon binary; JUNIT_FILE optional)
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const cordon = process.env.CORDON_BIN ?? path.resolve('build/cordon');
const work = fs.mkdtempSync('/var/tmp/cordon-e2e.');
fs.chmodSync(work, 0o755);
const root = path.join(work, 'root');
const state = path.join(work, 'state');
fs.mkdirSync(root);
const policy = path.join(work, 'policy.json');
fs.writeFileSync(policy, JSON.stringify({
  allowedExecutables: ['/bin/echo', '/usr/bin/echo', '/bin/sh', '/usr/bin/sh', '/bin/sleep',
                       '/usr/bin/sleep', '/bin/cat', '/usr/bin/cat'],
  cwdRoot: root,
  rules: [{ argvContains: '--force', refuse: 'no forcing here; ask the user' }],
}));

async function connect() {
  const transport = new StdioClientTransport({
    command: cordon,
    args: ['mcp', '--policy', policy, '--state-dir', state, '--session', 'e2e'],
    stderr: 'pipe',
  });
  const client = new Client({ name: 'cordon-e2e', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

const text = (r) => (r.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
const results = [];
async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    results.push({ name, ok: true, ms: Date.now() - t0 });
    console.log(`ok   ${name}`);
  } catch (e) {
    results.push({ name, ok: false, ms: Date.now() - t0, error: String(e?.stack ?? e) });
    console.log(`FAIL ${name}\n${e?.stack ?? e}`);
  }
}

let { client, transport } = await connect();
let previousTask;

await test('negotiates a current protocol version and lists every tool with schemas', async () => {
  const version = client.getServerVersion();
  assert.ok(version?.name, 'server reports its name');
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  for (const want of ['run_command', 'run_command_bg', 'command_status', 'command_wait',
                      'command_output', 'command_kill', 'command_write', 'command_list',
                      'command_remove', 'retrieve_context']) {
    assert.ok(names.includes(want), `tool ${want} is listed`);
  }
  for (const t of tools) {
    assert.equal(t.inputSchema?.type, 'object', `${t.name} inputSchema`);
    assert.equal(t.outputSchema?.type, 'object', `${t.name} outputSchema`);
    assert.ok((t.description ?? '').length > 40, `${t.name} has a description`);
  }
});

await test('run_command returns the settled status and the output inline', async () => {
  const r = await client.callTool({ name: 'run_command', arguments: { argv: ['/bin/echo', 'hello e2e'] } });
  assert.ok(!r.isError, text(r));
  assert.equal(r.structuredContent.state, 'exited');
  assert.equal(r.structuredContent.exitCode, 0);
  assert.ok(JSON.stringify(r.structuredContent).includes('hello e2e'));
  assert.equal(typeof r.structuredContent.running, 'number');
  assert.equal(typeof r.structuredContent.finished, 'number');
});

await test('a background command: start, wait, page its output', async () => {
  const start = await client.callTool({ name: 'run_command_bg',
    arguments: { argv: ['/bin/sh', '-c', 'for i in 1 2 3; do echo line $i; done; exit 4'] } });
  assert.ok(!start.isError, text(start));
  const id = start.structuredContent.taskId;
  assert.ok(id);
  previousTask = id;
  const w = await client.callTool({ name: 'command_wait', arguments: { taskIds: [id], timeoutMs: 20000, mode: 'all' } });
  assert.ok(!w.isError, text(w));
  const st = await client.callTool({ name: 'command_status', arguments: { taskId: id } });
  assert.equal(st.structuredContent.state, 'exited');
  assert.equal(st.structuredContent.exitCode, 4);
  const out = await client.callTool({ name: 'command_output', arguments: { taskId: id, unit: 'lines', limit: 2 } });
  assert.ok(!out.isError, text(out));
  assert.equal(out.structuredContent.content, 'line 1\nline 2\n');
  assert.equal(out.structuredContent.hasMore, true);
});

await test('refusals are in-band results that say what to do instead', async () => {
  const shell = await client.callTool({ name: 'run_command_bg', arguments: { argv: ['echo hi && rm -rf /'] } });
  assert.equal(shell.isError, true);
  assert.match(text(shell), /shell/i);
  const rule = await client.callTool({ name: 'run_command_bg', arguments: { argv: ['/bin/echo', '--force'] } });
  assert.equal(rule.isError, true);
  assert.match(text(rule), /no forcing here; ask the user/);
  const unknown = await client.callTool({ name: 'command_status', arguments: { taskId: 'tnope' } });
  assert.equal(unknown.isError, true);
  assert.match(text(unknown), new RegExp(previousTask));
});

await test('an unknown tool is a JSON-RPC error', async () => {
  await assert.rejects(client.callTool({ name: 'no_such_tool', arguments: {} }));
});

await test('a restarted server answers for the previous session\'s job', async () => {
  await client.close();
  ({ client, transport } = await connect());
  const st = await client.callTool({ name: 'command_status', arguments: { taskId: previousTask } });
  assert.ok(!st.isError, text(st));
  assert.equal(st.structuredContent.exitCode, 4);
});

await client.close();

// The daemon: one engine on a socket; `cordon mcp --connect` fronts it, and jobs outlive the
// connection (an agent restart), scoped to the peer's uid and session name.
const { spawn } = await import('node:child_process');
const sock = path.join(work, 'daemon.sock');
const daemon = spawn(cordon, ['serve', '--policy', policy, '--state-dir', path.join(work, 'dstate'),
                              '--socket', sock], { stdio: ['ignore', 'ignore', 'pipe'] });
let daemonLog = '';
daemon.stderr.on('data', (d) => { daemonLog += d; });
for (let i = 0; i < 200 && !fs.existsSync(sock); i++) await new Promise((r) => setTimeout(r, 25));
async function connectDaemon(session) {
  const transport = new StdioClientTransport({ command: cordon, args: ['mcp', '--connect', sock, '--session', session], stderr: 'pipe' });
  const c = new Client({ name: 'cordon-e2e-daemon', version: '1.0.0' });
  await c.connect(transport);
  return c;
}
let longTask;
await test('daemon: a job started through --connect outlives the connection', async () => {
  assert.ok(fs.existsSync(sock), `daemon socket exists (${daemonLog})`);
  const c1 = await connectDaemon('agent');
  const st = await c1.callTool({ name: 'run_command_bg', arguments: { argv: ['/bin/sh', '-c', 'sleep 1; echo survived'] } });
  assert.ok(!st.isError, text(st));
  longTask = st.structuredContent.taskId;
  await c1.close();  // the agent goes away while the job runs
  const c2 = await connectDaemon('agent');
  const w = await c2.callTool({ name: 'command_status', arguments: { taskId: longTask, waitMs: 20000 } });
  assert.ok(!w.isError, text(w));
  assert.equal(w.structuredContent.state, 'exited');
  const out = await c2.callTool({ name: 'command_output', arguments: { taskId: longTask } });
  assert.equal(out.structuredContent.content, 'survived\n');
  await c2.close();
});
await test('daemon: another session name does not see the job', async () => {
  const c3 = await connectDaemon('someone-else');
  const r = await c3.callTool({ name: 'command_status', arguments: { taskId: longTask } });
  assert.equal(r.isError, true);
  await c3.close();
});
daemon.kill('SIGTERM');
await new Promise((r) => daemon.on('exit', r));
await test('daemon: stops on SIGTERM and removes its socket', async () => {
  assert.equal(daemon.exitCode, 0, daemonLog);
  assert.ok(!fs.existsSync(sock));
});
fs.rmSync(work, { recursive: true, force: true });

const failed = results.filter((r) => !r.ok).length;
if (process.env.JUNIT_FILE) {
  const esc = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/"/g, '&quot;');
  const cases = results.map((r) => `<testcase name="${esc(r.name)}" time="${r.ms / 1000}">` +
    (r.ok ? '' : `<failure message="failed">${esc(r.error)}</failure>`) + '</testcase>').join('\n');
  fs.writeFileSync(process.env.JUNIT_FILE,
    `<?xml version="1.0"?>\n<testsuite name="mcp_e2e" tests="${results.length}" failures="${failed}">\n${cases}\n</testsuite>\n`);
}
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
