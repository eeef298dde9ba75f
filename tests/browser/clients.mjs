// Node's undici ProxyAgent and headless Chromium through proxynet, for
// tests/tests/e2e/clients.rs. Environment: PROXY_HTTP, PROXY_HTTPS, PROXY_CA,
// PROXY_HTTP_PLAIN (http://127.0.0.1:PORT, no credentials: allow-listed),
// TARGET, SCREENSHOT_DIR. Prints one JSON object: case -> {status, peer} | {error}.
import { readFileSync } from "node:fs";
import { createHash, X509Certificate } from "node:crypto";
import { ProxyAgent, fetch } from "undici";
import { launch, need } from "./chromium.mjs";

const target = need("TARGET");
const results = {};
const peerOf = body => JSON.parse(body).peer.replace(/:\d+$/, "");

async function viaUndici(name, proxyUrl, tls) {
  try {
    const u = new URL(proxyUrl);
    const token = "Basic " + Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString("base64");
    const agent = new ProxyAgent({ uri: `${u.protocol}//${u.host}`, token, proxyTls: tls });
    const r = await fetch(target, { dispatcher: agent });
    results[name] = { status: r.status, peer: peerOf(await r.text()) };
    await agent.close();
  } catch (e) { results[name] = { error: String(e.cause || e) }; }
}

async function viaChromium(name, proxy, extraArgs) {
  let browser;
  try {
    browser = await launch(extraArgs);
    const context = await browser.newContext({ proxy });
    const page = await context.newPage();
    const r = await page.goto(target);
    const body = await page.innerText("body");
    if (process.env.SCREENSHOT_DIR) await page.screenshot({ path: `${process.env.SCREENSHOT_DIR}/chromium-${name}.png` });
    results[name] = { status: r.status(), peer: peerOf(body) };
  } catch (e) { results[name] = { error: String(e) }; }
  if (browser) await browser.close();
}

const ca = readFileSync(need("PROXY_CA"));
await viaUndici("undici_http_proxy", need("PROXY_HTTP"));
await viaUndici("undici_https_proxy", need("PROXY_HTTPS"), { ca });

// Chromium trusts exactly the HTTPS proxy's certificate (its SPKI pin), not
// every certificate.
const leaf = new X509Certificate(readFileSync(need("PROXY_CERT")));
const spki = createHash("sha256").update(leaf.publicKey.export({ type: "spki", format: "der" })).digest("base64");
const https = new URL(need("PROXY_HTTPS"));
await viaChromium("chromium_https_proxy",
  { server: `https://${https.host}`, username: decodeURIComponent(https.username), password: decodeURIComponent(https.password) },
  [`--ignore-certificate-errors-spki-list=${spki}`]);
await viaChromium("chromium_allowlisted_http_proxy", { server: need("PROXY_HTTP_PLAIN") }, []);
console.log(JSON.stringify(results));
