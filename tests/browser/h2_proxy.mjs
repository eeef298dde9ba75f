// HTTP/2 to the HTTPS proxy listener, for tests/tests/e2e/h2_proxy.rs: Node's
// own http2 client (CONNECT streams, an absolute-URI request, the bounds a
// hostile client meets) and headless Chromium loading three origins over one
// proxy connection. Environment: PROXY_HTTPS (https://user:pass@127.0.0.1:PORT),
// PROXY_CA, PROXY_CERT, TARGETS (three host:port whoami origins, comma
// separated), ECHO (host:port of an echo server), LIMITED (user:pass of a user
// allowed two concurrent tunnels). Prints one JSON object of results.
import http2 from "node:http2";
import tls from "node:tls";
import { readFileSync } from "node:fs";
import { createHash, X509Certificate } from "node:crypto";
import { launch, need } from "./chromium.mjs";

const proxy = new URL(need("PROXY_HTTPS"));
const ca = readFileSync(need("PROXY_CA"));
const targets = need("TARGETS").split(",");
const target = targets[0];
const echo = need("ECHO");
const [limitedUser, limitedPass] = need("LIMITED").split(":");
const basic = (u, p) => "Basic " + Buffer.from(`${u}:${p}`).toString("base64");
const user = decodeURIComponent(proxy.username);
const good = { "proxy-authorization": basic(user, decodeURIComponent(proxy.password)) };
const results = {};
const peerOf = text => JSON.parse(text.slice(text.indexOf("{"))).peer.replace(/:\d+$/, "");
const within = (ms, promise, what) => Promise.race([
  promise,
  new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms)),
]);

function connect() {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`https://127.0.0.1:${proxy.port}`, {
      ca, maxSendHeaderBlockLength: 1 << 20,
    });
    session.once("connect", () => resolve(session));
    session.once("error", reject);
  });
}

// One stream; resolves at its response head (or its error).
function request(session, headers) {
  return new Promise(resolve => {
    const stream = session.request(headers, { endStream: headers[":method"] !== "CONNECT" });
    stream.once("response", h => resolve({ stream, status: h[":status"], headers: h }));
    stream.once("error", e => resolve({ stream, error: String(e) }));
  });
}
const connectTo = (session, authority, auth = good) =>
  request(session, { ":method": "CONNECT", ":authority": authority, ...auth });

// Everything a stream sends until it ends.
function readAll(stream) {
  return new Promise((resolve, reject) => {
    let data = "";
    stream.setEncoding("utf8");
    stream.on("data", d => { data += d; });
    stream.once("end", () => resolve(data));
    stream.once("error", reject);
  });
}

// An HTTP/1.1 request through a CONNECT stream to a whoami origin.
async function whoamiThrough(opened, host) {
  if (opened.status !== 200) return { status: opened.status, error: opened.error };
  opened.stream.write(`GET / HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
  return { status: 200, peer: peerOf(await within(10000, readAll(opened.stream), "whoami")) };
}

try {
  const session = await connect();
  results.alpn = session.alpnProtocol;
  results.max_concurrent_streams = session.remoteSettings.maxConcurrentStreams;

  const [a, b] = await Promise.all([connectTo(session, target), connectTo(session, target)]);
  console.error("h2: connected");
  results.concurrent = await Promise.all([whoamiThrough(a, target), whoamiThrough(b, target)]);

  console.error("h2: concurrent done");
  const wrong = await connectTo(session, target, { "proxy-authorization": basic(user, "wrong-password") });
  results.wrong_password = { status: wrong.status, proxy_status: wrong.headers?.["proxy-status"] };
  results.after_refusal = await whoamiThrough(await connectTo(session, target), target);

  const fwd = await request(session, { ":method": "GET", ":scheme": "http", ":authority": target, ":path": "/", ...good });
  results.forward = { status: fwd.status, peer: fwd.status === 200 ? peerOf(await readAll(fwd.stream)) : null };

  console.error("h2: forward done");
  // A user allowed two tunnels: the third stream is refused, the others keep going.
  const limitedAuth = { "proxy-authorization": basic(limitedUser, limitedPass) };
  const held = [];
  for (let i = 0; i < 3; i++) held.push(await connectTo(session, echo, limitedAuth));
  results.limited = held.map(h => h.status);
  for (const h of held) h.stream.close();

  console.error("h2: limited done");
  // A header list beyond the advertised limit: 431 on that stream alone.
  const big = {};
  for (let i = 0; i < 10; i++) big[`x-big-${i}`] = "a".repeat(8000);
  const oversized = await request(session, { ":method": "GET", ":scheme": "http", ":authority": target, ":path": "/", ...good, ...big });
  results.oversized_headers = { status: oversized.status, error: oversized.error };
  results.after_oversized = await whoamiThrough(await connectTo(session, target), target);

  console.error("h2: oversized done");
  // A stream whose client stops reading holds its own window, not the others'.
  const stalled = await connectTo(session, echo);
  stalled.stream.pause();
  const chunk = Buffer.alloc(64 * 1024, 7);
  let blocked = false;
  for (let i = 0; i < 512 && !blocked; i++) {
    if (!stalled.stream.write(chunk)) {
      blocked = await within(20000, new Promise(resolve => {
        // Still blocked a while after the write filled the window: the
        // stall reached us; stop writing.
        const t = setTimeout(() => resolve(true), 500);
        stalled.stream.once("drain", () => { clearTimeout(t); resolve(false); });
      }), "stall");
    }
  }
  results.stalled_stream_blocked = blocked;
  results.beside_stalled = await within(10000, whoamiThrough(await connectTo(session, target), target), "beside stalled");
  stalled.stream.close();
  session.close();
} catch (e) { results.error = String(e.stack || e); }

console.error("h2: first session done");
// Rapid reset (CVE-2023-44487), as the attack sends it: raw frames, each
// stream's HEADERS followed at once by its RST_STREAM (Node's own client
// would cancel a stream before its HEADERS ever left).
try {
  const frame = (type, flags, id, payload) => {
    const head = Buffer.alloc(9);
    head.writeUIntBE(payload.length, 0, 3);
    head[3] = type; head[4] = flags; head.writeUInt32BE(id, 5);
    return Buffer.concat([head, payload]);
  };
  // HPACK literal fields without indexing, names and values as plain strings.
  const literal = (name, value) => {
    const v = Buffer.from(value);
    if (v.length > 126) throw new Error("keep header values short");
    return Buffer.concat([Buffer.from([0, name.length]), Buffer.from(name), Buffer.from([v.length]), v]);
  };
  const block = Buffer.concat([
    literal(":method", "CONNECT"), literal(":authority", target),
    literal("proxy-authorization", good["proxy-authorization"]),
  ]);
  const cancel = Buffer.alloc(4); cancel.writeUInt32BE(8);
  const socket = tls.connect({ host: "127.0.0.1", port: Number(proxy.port), ca, ALPNProtocols: ["h2"] });
  await new Promise((resolve, reject) => { socket.once("secureConnect", resolve); socket.once("error", reject); });
  let received = Buffer.alloc(0);
  let goaway = null;
  const ended = new Promise(resolve => {
    socket.on("data", d => {
      received = Buffer.concat([received, d]);
      while (received.length >= 9) {
        const len = received.readUIntBE(0, 3);
        if (received.length < 9 + len) break;
        if (received[3] === 7) { goaway = received.readUInt32BE(9 + 4); resolve({ goaway }); }
        received = received.subarray(9 + len);
      }
    });
    socket.once("close", () => resolve(goaway === null ? { closed: true } : { goaway }));
    socket.on("error", () => {});
  });
  socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(4, 0, 0, Buffer.alloc(0))]));
  let stop = false;
  ended.then(() => { stop = true; });
  let sent = 0;
  for (let id = 1; sent < 5000 && !stop; id += 2, sent++) {
    socket.write(Buffer.concat([frame(1, 4, id, block), frame(3, 0, id, cancel)]));
    if (sent % 20 === 19) await new Promise(r => setTimeout(r, 1));
  }
  results.rapid_reset = { ...(await within(15000, ended, "rapid reset")), sent };
  socket.destroy();
} catch (e) { results.rapid_reset = { error: String(e) }; }

console.error("h2: rapid reset done");
// Chromium speaks HTTP/2 to an HTTPS proxy that offers it: three origins,
// one proxy connection (the test checks the access log).
let browser;
try {
  const leaf = new X509Certificate(readFileSync(need("PROXY_CERT")));
  const spki = createHash("sha256").update(leaf.publicKey.export({ type: "spki", format: "der" })).digest("base64");
  browser = await launch([`--ignore-certificate-errors-spki-list=${spki}`]);
  const context = await browser.newContext({
    proxy: { server: `https://127.0.0.1:${proxy.port}`, username: user, password: decodeURIComponent(proxy.password) },
  });
  const page = await context.newPage();
  results.chromium = [];
  for (const origin of targets.slice(1)) {
    const r = await page.goto(`http://${origin}/`);
    results.chromium.push({ status: r.status(), peer: peerOf(await page.innerText("body")) });
  }
} catch (e) { results.chromium_error = String(e); }
if (browser) await browser.close();

console.log(JSON.stringify(results));
// Sessions a case left open must not keep the process alive.
process.exit(0);
