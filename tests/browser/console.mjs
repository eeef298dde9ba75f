// Drives the dashboard as an operator console in headless Chromium for
// tests/tests/e2e/console.rs. Prints one JSON line with what it saw.
// MODE=operator: log in with the admin KEY; the fleet page's charts carry
//   time labels; the usage page shows sizes with units; EXIT's page shows its
//   source (SOURCE) and consent state; Drain asks for confirmation, then the
//   REST API (API) reports the exit draining; Undrain undoes it; ACCOUNT's
//   page lists its keys with action buttons. Screenshots SHOT_FLEET,
//   SHOT_EXIT, SHOT_ACCOUNT, SHOT_PHONE (390 px wide).
// MODE=account: log in with an account KEY: its own ACCOUNT page (no action
//   buttons), OTHER's page 404, the fleet pages 403.
// MODE=big: log in with KEY; the fleet table shows its first page of 50 of
//   at least TOTAL exits, page controls work, the filter applies before
//   paging. Screenshot SHOT_BIG.
import { launch, need } from "./chromium.mjs";

const base = need("DASHBOARD");
const mode = need("MODE");
const browser = await launch();
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
const deadline = Date.now() + Number(process.env.WAIT_MS || 40000);
const sizeRe = /^\d+(\.\d)? (B|kB|MB|GB|TB|PB)$/;
const timeRe = /^\d\d:\d\d(:\d\d)?$/;

async function login() {
  await page.goto(`${base}/login`);
  await page.fill("#key", need("KEY"));
  await Promise.all([page.waitForNavigation(), page.click("#login")]);
}
async function shot(name) {
  if (process.env[name]) await page.screenshot({ path: process.env[name], fullPage: true });
}
async function exitRest() {
  const r = await fetch(`${need("API")}/v1/exits/${need("EXIT")}`, { headers: { authorization: `Bearer ${need("KEY")}` } });
  return r.json();
}
async function timeLabels() {
  return page.$$eval("svg.chart text.t-label", ts => ts.map(t => t.textContent));
}
// Polls `f` until it answers truthy (the CSP forbids waitForFunction's eval).
async function poll(f, ms = 10000) {
  const end = Date.now() + ms;
  while (true) {
    const v = await f();
    if (v || Date.now() > end) return v;
    await page.waitForTimeout(100);
  }
}
const rowCount = () => page.$$eval("#exits tr[data-exit-id]", rs => rs.length);
// Reloads `url` until `ok(page)` holds or the deadline passes.
async function until(url, ok) {
  let v;
  while (true) {
    await page.goto(url);
    v = await ok();
    if (v || Date.now() > deadline) return v;
    await page.waitForTimeout(500);
  }
}

let result = {};
try {
  await login();
  if (mode === "operator") {
    const exit = need("EXIT");
    // The fleet: rows in place, charts with time labels once two samples exist.
    const labels = await until(`${base}`, async () => {
      await page.waitForSelector("body[data-loaded]", { timeout: 10000 });
      const l = await timeLabels();
      return l.length >= 2 ? l : null;
    }) || [];
    const cards = await page.$$eval(".state-card", cs => cs.map(c => c.textContent));
    await shot("SHOT_FLEET");
    // Usage with units.
    await page.goto(`${base}/usage?days=7`);
    const sizes = await page.$$eval("#usage td.bytes", tds => tds.map(t => t.textContent));
    const total = await page.textContent("#usage-total");
    const dayBars = await page.$$eval("svg.chart rect.bar title", ts => ts.map(t => t.textContent));
    // The exit: source, consent, charts.
    const exitLabels = await until(`${base}/exits/${exit}`, async () => {
      const l = await timeLabels();
      return l.length >= 2 ? l : null;
    }) || [];
    const source = (await page.textContent("#source-name")).trim();
    const consent = (await page.textContent("#consent-state")).trim();
    const hover = await page.$$eval("svg.chart circle.pt title", ts => ts.length);
    await shot("SHOT_EXIT");
    // Drain: a confirmation first, then the API reports it draining.
    await Promise.all([page.waitForNavigation(), page.click("#drain")]);
    const confirmUrl = page.url();
    const confirmText = await page.textContent(".confirm");
    const beforeConfirm = (await exitRest()).admin_draining;
    await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
    const afterDrain = (await exitRest()).admin_draining;
    const backOnExit = page.url().endsWith(`/exits/${exit}`);
    const undrainShown = (await page.$("#undrain")) !== null;
    await Promise.all([page.waitForNavigation(), page.click("#undrain")]);
    const afterUndrain = (await exitRest()).admin_draining;
    const drainShown = (await page.$("#drain")) !== null;
    // An account page, with its keys' revoke buttons.
    await page.goto(`${base}/accounts/${need("ACCOUNT")}`);
    const keyButtons = await page.$$eval("#keys button", bs => bs.length);
    const quota = await page.$$eval("#users .quota-cell", cs => cs.map(c => c.textContent));
    await shot("SHOT_ACCOUNT");
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(`${base}`);
    await page.waitForSelector("body[data-loaded]", { timeout: 10000 });
    await shot("SHOT_PHONE");
    const phoneOverflow = await page.evaluate(() => document.querySelector("nav").scrollWidth <= window.innerWidth + 1);
    result = {
      ok: labels.length >= 2 && labels.every(l => timeRe.test(l))
        && exitLabels.length >= 2 && exitLabels.every(l => timeRe.test(l)) && hover > 0
        && sizes.length > 0 && sizes.every(s => sizeRe.test(s)) && sizeRe.test(total) && dayBars.length === 7
        && source === need("SOURCE") && consent.length > 0
        && confirmUrl.endsWith(`/exits/${exit}/drain`) && beforeConfirm === false
        && afterDrain === true && backOnExit && undrainShown
        && afterUndrain === false && drainShown && keyButtons > 0 && phoneOverflow,
      labels, exit_labels: exitLabels, hover, sizes, total, day_bars: dayBars.length, cards,
      source, consent, confirm_url: confirmUrl, confirm_text: confirmText,
      before_confirm: beforeConfirm, after_drain: afterDrain, back_on_exit: backOnExit,
      undrain_shown: undrainShown, after_undrain: afterUndrain, key_buttons: keyButtons, quota,
      phone_nav_fits: phoneOverflow,
    };
  } else if (mode === "account") {
    const landing = page.url();
    const own = await page.goto(`${base}/accounts/${need("ACCOUNT")}`);
    const ownButtons = await page.$$eval("main button", bs => bs.map(b => b.textContent));
    const keys = await page.$$eval("#keys tr[data-key-id]", rs => rs.length);
    const navLinks = await page.$$eval("nav a", as => as.map(a => a.getAttribute("href")));
    await shot("SHOT_ACCOUNT");
    const other = await page.goto(`${base}/accounts/${need("OTHER")}`);
    const fleet = await page.goto(`${base}/data.json`);
    const exitPage = await page.goto(`${base}/exits/${need("EXIT")}`);
    const exitButtons = await page.$$eval("main button", bs => bs.length);
    const accounts = await page.goto(`${base}/accounts`);
    await page.goto(`${base}/usage`);
    const rows = await page.$$eval("#usage tr[data-account-id]", rs => rs.map(r => r.dataset.accountId));
    // An action posted from this session is refused (not an operator).
    const action = await page.evaluate(async (exit) => {
      const r = await fetch(`/dashboard/exits/${exit}/drain`, { method: "POST", body: new URLSearchParams({ csrf: "x", confirm: "yes" }), redirect: "manual" });
      return r.status;
    }, need("EXIT"));
    result = {
      ok: landing.endsWith("/usage") && own.status() === 200 && ownButtons.length === 0 && keys > 0
        && other.status() === 404 && fleet.status() === 403 && exitPage.status() === 403 && exitButtons === 0
        && accounts.status() === 403 && rows.every(a => a === need("ACCOUNT")) && action === 403
        && !navLinks.includes("/dashboard/accounts"),
      landing, own: own.status(), own_buttons: ownButtons, keys, other: other.status(), fleet: fleet.status(),
      exit_page: exitPage.status(), accounts: accounts.status(), rows, action, nav: navLinks,
    };
  } else if (mode === "big") {
    const want = Number(need("TOTAL"));
    await page.goto(`${base}`);
    let info = "";
    while (Date.now() < deadline) {
      info = (await page.textContent("#page-info")) || "";
      const m = info.match(/of (\d+)/);
      if (m && Number(m[1]) >= want) break;
      await page.waitForTimeout(500);
    }
    const firstRows = await page.$$eval("#exits tr[data-exit-id]", rs => rs.map(r => r.dataset.exitId));
    const pageNo = await page.textContent("#page-no");
    const prevDisabled = await page.$eval("#prev", b => b.disabled);
    await shot("SHOT_BIG");
    await page.focus("#next");
    await page.keyboard.press("Enter");
    await poll(async () => (await page.textContent("#page-no")).startsWith("page 2 "));
    const secondRows = await page.$$eval("#exits tr[data-exit-id]", rs => rs.map(r => r.dataset.exitId));
    await page.fill("#filter", "bulk-0999");
    await poll(async () => (await rowCount()) === 1);
    const filtered = await page.$$eval("#exits tr[data-exit-id] th a", as => as.map(a => a.textContent));
    const filteredPage = await page.textContent("#page-no");
    await page.fill("#filter", "no-such-exit-anywhere");
    await page.waitForSelector("#empty-row");
    const empty = await page.textContent("#empty-row");
    result = {
      ok: firstRows.length === 50 && pageNo.startsWith("page 1 of ") && prevDisabled
        && secondRows.length === 50 && secondRows.every(r => !firstRows.includes(r))
        && filtered.length === 1 && filtered[0] === "bulk-0999" && filteredPage === "page 1 of 1"
        && empty.includes("No exit matches"),
      info, page_no: pageNo, first: firstRows.length, second: secondRows.length, filtered, filtered_page: filteredPage, empty,
    };
  }
} catch (e) {
  result = { ok: false, error: String(e), url: page.url() };
}
console.log(JSON.stringify(result));
await browser.close();
process.exit(result.ok ? 0 : 1);
