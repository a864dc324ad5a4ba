// An HTTP agent written with nothing but Node's fetch: what an agent in any language does.
// Usage: node gateway_client.mjs URL TOKEN NAME PEER
// Prints one JSON line per step on stdout; reads one line ("go") on stdin when told to wait.
// Flow: register, open the SSE stream, subscribe "news", say ready; answer a request from a
// Python agent; send a prompt to PEER and print its response; print a publication; drop the
// stream, wait for "go", reconnect with Last-Event-ID and print what was published meanwhile.

import readline from "node:readline";

const [url, token, name, peer] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${token}`, "Content-Type": "application/json" };
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const lines = readline.createInterface({ input: process.stdin });
const stdinLines = lines[Symbol.asyncIterator]();

async function post(path, body) {
  const r = await fetch(url + path, { method: "POST", headers: auth, body: JSON.stringify(body) });
  const text = await r.text();
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${text}`);
  return JSON.parse(text);
}

// A minimal SSE reader over fetch: yields {id, event, data}.
async function* sse(sseUrl, lastId, signal) {
  const headers = { Authorization: `Bearer ${token}` };
  if (lastId) headers["Last-Event-ID"] = String(lastId);
  const r = await fetch(sseUrl, { headers, signal });
  if (r.status !== 200) throw new Error(`stream: HTTP ${r.status}`);
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const ev = { id: null, event: "message", data: "" };
      for (const line of block.split("\n")) {
        if (line.startsWith("id: ")) ev.id = Number(line.slice(4));
        else if (line.startsWith("event: ")) ev.event = line.slice(7);
        else if (line.startsWith("data: ")) ev.data += line.slice(6);
      }
      if (ev.data) yield { ...ev, data: JSON.parse(ev.data) };
    }
  }
}

const reg = await post("v1/agents/register", { name, model: "node-fetch", colour: "#33aa55",
  project: "demo", capabilities: ["answer"] });
const sid = reg.session_id;
const beat = setInterval(() => {
  post(`v1/agents/${sid}/heartbeat`, { context_used_pct: 12, queue_depth: 0, tasks_summary: "idle" })
    .catch((e) => say({ step: "heartbeat_failed", error: String(e) }));
}, 200);

let lastId = 0;
let ctrl = new AbortController();
let events = sse(reg.sse_url, 0, ctrl.signal);
await post("v1/subscribe", { session_id: sid, topic: "news" });
say({ step: "ready", session_id: sid });

let sent = null;
let gotResponse = false, gotPublication = false, answered = false;
for await (const ev of events) {
  if (ev.id) lastId = ev.id;
  if (ev.event === "prompt" && ev.data.expects_response) {
    await post(`v1/messages/${ev.data.msg_id}/response`,
      { session_id: sid, payload: { answer: ev.data.payload.q + 1, by: name } });
    answered = true;
    say({ step: "answered", from: ev.data.from });
    sent = await post("v1/messages", { sender_session: sid, target: peer, topic: "ask", prompt: "hello from node" });
  } else if (ev.event === "response" && sent && ev.data.msg_id === sent.msg_id) {
    gotResponse = true;
    say({ step: "response", ok: ev.data.ok, payload: ev.data.payload });
  } else if (ev.event === "publication") {
    gotPublication = true;
    say({ step: "publication", payload: ev.data.payload });
  }
  if (answered && gotResponse && gotPublication) break;
}
ctrl.abort();
say({ step: "disconnected", last_id: lastId });
await stdinLines.next(); // "go": something was published while we were away

ctrl = new AbortController();
for await (const ev of sse(reg.sse_url, lastId, ctrl.signal)) {
  if (ev.event === "gap") say({ step: "gap", missed: ev.data.missed });
  if (ev.event === "publication") {
    say({ step: "resumed", id: ev.id, payload: ev.data.payload });
    break;
  }
}
ctrl.abort();
clearInterval(beat);
await fetch(url + `v1/agents/${sid}`, { method: "DELETE", headers: auth });
say({ step: "done" });
lines.close();
process.exit(0);
