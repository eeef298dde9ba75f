// Drives /dashboard in headless Chromium for tests/tests/e2e/observability.rs.
// MODE=live:     log in with KEY, wait until every exit in EXITS shows `live`.
// MODE=ejected:  log in with KEY, wait until EXIT shows ejected or down.
// MODE=account:  log in with an account KEY: operator pages answer 403, the
//                usage page lists only ACCOUNT's rows.
// Writes SCREENSHOT (PNG) and prints one JSON line with what it saw.
import { launch, need } from "./chromium.mjs";

const base = need("DASHBOARD");
const mode = need("MODE");
const browser = await launch();
const page = await browser.newPage();
const deadline = Date.now() + Number(process.env.WAIT_MS || 30000);

async function login() {
  await page.goto(`${base}/login`);
  await page.fill("#key", need("KEY"));
  await Promise.all([page.waitForNavigation(), page.click("#login")]);
}

async function states() {
  return page.$$eval("#exits tr", rows => Object.fromEntries(rows.map(r => [r.dataset.exitId, r.dataset.state])));
}

let result = {};
try {
  await login();
  if (mode === "live") {
    const exits = need("EXITS").split(",");
    let seen = {};
    while (Date.now() < deadline) {
      seen = await states();
      if (exits.every(e => seen[e] === "live")) break;
      await page.waitForTimeout(250);
    }
    result = { ok: exits.every(e => seen[e] === "live"), states: seen };
  } else if (mode === "ejected") {
    const exit = need("EXIT");
    let seen = {};
    while (Date.now() < deadline) {
      seen = await states();
      if (["ejected", "down"].includes(seen[exit])) break;
      await page.waitForTimeout(250);
    }
    result = { ok: ["ejected", "down"].includes(seen[exit]), states: seen, elapsed_ms: Date.now() - (deadline - Number(process.env.WAIT_MS || 30000)) };
  } else if (mode === "account") {
    const operatorPage = await page.goto(`${base}`);
    const usageUrl = page.url();
    const exitPage = await page.goto(`${base}/exits/${need("EXIT")}`);
    const data = await page.goto(`${base}/data.json`);
    await page.goto(`${base}/usage`);
    const accounts = await page.$$eval("#usage tr[data-account-id]", rows => rows.map(r => r.dataset.accountId));
    result = {
      ok: exitPage.status() === 403 && data.status() === 403 && usageUrl.endsWith("/usage")
        && accounts.length > 0 && accounts.every(a => a === need("ACCOUNT")),
      landing: usageUrl, exit_page: exitPage.status(), data: data.status(), accounts,
      first: operatorPage.status(),
    };
  }
  if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
} catch (e) {
  result = { ok: false, error: String(e) };
}
console.log(JSON.stringify(result));
await browser.close();
process.exit(result.ok ? 0 : 1);
