// An MCP client that knows nothing of meshd: the official TypeScript SDK's Client, over stdio or
// Streamable HTTP, driven by tests/integration/test_mcp_ts.py against real daemons.
//
// Usage: node mcp_client.mjs '<json config>'
//   {"transport": "stdio", "command": "...", "args": [...]}
//   {"transport": "http", "url": "http://127.0.0.1:PORT/mcp", "token": "..."}
//   plus "slow": the mesh agent that answers topics "long" (progress every second), "hang"
//   (waits until cancelled) and "poke" (sends this client's agent a message first),
//   "self": this client's mesh agent name, "client_timeout_ms", "long_ms".
//   {"skills": {"joiner": NAME, "tool": TOOL, "args": {...}}}: only the skills scenario: list the
//   tools, ask agent NAME (topic "join") to bring a typed agent in, wait for
//   notifications/tools/list_changed, list again and call TOOL with args.
// Prints one JSON object (what it saw) on stdout; exits 1 with the error on stderr.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const cfg = JSON.parse(process.argv[2]);
const report = { transport: cfg.transport };

function transportFor(c) {
  if (c.transport === "stdio") {
    return new StdioClientTransport({ command: c.command, args: c.args, stderr: "inherit" });
  }
  return new StreamableHTTPClientTransport(new URL(c.url), {
    requestInit: { headers: { Authorization: `Bearer ${c.token}` } },
  });
}

function text(result) {
  return result.content && result.content[0] ? result.content[0].text : "";
}

// A promise settled by the first notification that matches; wait(ms) rejects ms after it is called.
function waiter(what) {
  let resolve;
  const p = new Promise((res) => { resolve = res; });
  const wait = (ms) => Promise.race([p, new Promise((_, rej) => {
    setTimeout(() => rej(new Error(`no ${what} within ${ms} ms`)), ms).unref();
  })]);
  return { p, resolve, wait };
}

const client = new Client({ name: "meshd-ts-test", version: "1.0.0" });
const updated = waiter("notifications/resources/updated");
const pushed = waiter("notifications/claude/channel");
const listChanged = waiter("notifications/tools/list_changed");
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => updated.resolve(n.params));
client.setNotificationHandler(ToolListChangedNotificationSchema, () => listChanged.resolve(true));
client.fallbackNotificationHandler = async (n) => {
  if (n.method === "notifications/claude/channel") pushed.resolve(n.params);
};

await client.connect(transportFor(cfg));
if (cfg.skills) {
  try {
    report.capabilities = client.getServerCapabilities();
    report.before = (await client.listTools()).tools.map((t) => t.name);
    await client.callTool({ name: "request_agent", arguments: { agent: cfg.skills.joiner, topic: "join" } });
    report.list_changed = await listChanged.wait(15000);
    let tool;
    for (let i = 0; i < 50 && !tool; i++) {  // the notification may come before the last skill is in
      tool = (await client.listTools()).tools.find((t) => t.name === cfg.skills.tool);
      if (!tool) await new Promise((res) => setTimeout(res, 200));
    }
    report.tool = tool || null;
    const result = await client.callTool({ name: cfg.skills.tool, arguments: cfg.skills.args });
    report.call = { is_error: result.isError === true, text: text(result) };
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
}
try {
  report.server = client.getServerVersion();
  report.capabilities = client.getServerCapabilities();

  const tools = (await client.listTools()).tools.map((t) => t.name);
  report.tools = tools;
  const agents = JSON.parse(text(await client.callTool({ name: "list_agents", arguments: {} })));
  report.agents = agents.map((a) => a.name);

  // The unknown agent: NO_SUCH_AGENT at once, not after timeout_s.
  let t0 = performance.now();
  const missing = await client.callTool({
    name: "request_agent",
    arguments: { agent: "nobody-here", topic: "q", timeout_s: 5 },
  });
  report.unknown = { ms: performance.now() - t0, is_error: missing.isError === true, text: text(missing) };

  // A request that lasts 3x the client's own timeout: it is not cut off, because progress
  // notifications arrive and the client resets its timeout on each.
  const notes = [];
  t0 = performance.now();
  const long = await client.callTool(
    { name: "request_agent", arguments: { agent: cfg.slow, topic: "long", payload: cfg.long_ms, timeout_s: 60 } },
    undefined,
    {
      timeout: cfg.client_timeout_ms,
      resetTimeoutOnProgress: true,
      onprogress: (p) => notes.push(p),
    },
  );
  report.long = {
    ms: performance.now() - t0, is_error: long.isError === true, text: text(long), progress: notes,
  };

  // Cancel: abort a call once the first progress arrives; the mesh request is cancelled.
  const abort = new AbortController();
  const first = waiter("progress before cancelling");
  t0 = performance.now();
  const hang = client.callTool(
    { name: "request_agent", arguments: { agent: cfg.slow, topic: "hang", timeout_s: 60 } },
    undefined,
    { signal: abort.signal, onprogress: (p) => first.resolve(p), timeout: 60000 },
  );
  await first.wait(10000);
  abort.abort("the test cancels");
  try {
    await hang;
    report.cancel = { rejected: false };
  } catch (err) {
    report.cancel = { rejected: true, error: String(err), ms: performance.now() - t0 };
  }

  // Inbox: subscribe, then a message arrives (the slow agent sends one before it answers "poke").
  await client.subscribeResource({ uri: "meshd://inbox" });
  await client.callTool({ name: "request_agent", arguments: { agent: cfg.slow, topic: "poke", payload: cfg.self } });
  report.updated = await updated.wait(10000);
  report.pushed = cfg.push ? await pushed.wait(10000) : null;
  const inbox = await client.readResource({ uri: "meshd://inbox" });
  report.inbox = JSON.parse(inbox.contents[0].text);
  report.message = JSON.parse(text(await client.callTool({ name: "wait_message", arguments: { timeout_s: 5 } })));
} finally {
  await client.close();
}
process.stdout.write(JSON.stringify(report) + "\n");
