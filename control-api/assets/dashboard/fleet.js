// The fleet page: cards, errors and one page of the exit table, refreshed
// every two seconds by updating cells in place (rows are kept by exit id,
// so nothing flickers). The server filters, sorts and pages.
const cols = ["name","source_type","country","owner","egress_ips","egress_prefixes","observed_egress","egress_verification","state","score","probe_rtt_ms","success","in_flight","bytes_per_sec","last_heartbeat_at"];
let sortBy = "state", desc = false, pageNo = 0, pages = 1, seq = 0, timer = null;
function fmtBytes(n) {
  const u = ["B","kB","MB","GB","TB","PB"]; let v = Math.max(0, Number(n) || 0), i = 0;
  while (v >= 999.95 && i < u.length - 1) { v /= 1000; i++; }
  return i === 0 ? v.toFixed(0) + " B" : v.toFixed(1) + " " + u[i];
}
function fmt(k, v) {
  if (v === null || v === undefined) return "–";
  if (k === "score") return Number(v).toFixed(2);
  if (k === "success") return (Number(v) * 100).toFixed(1) + " %";
  if (k === "probe_rtt_ms") return Number(v).toFixed(1) + " ms";
  if (k === "bytes_per_sec") return fmtBytes(v) + "/s";
  if (k === "last_heartbeat_at") return pnRelative(v);
  if (Array.isArray(v)) return v.length ? v.join(", ") : "–";
  return String(v);
}
function setText(el, t) { if (el.textContent !== t) el.textContent = t; }
const body = document.getElementById("exits");
const byId = new Map();
function rowFor(r) {
  let tr = byId.get(r.id);
  if (!tr) {
    tr = document.createElement("tr");
    tr.dataset.exitId = r.id;
    for (const k of cols) {
      const td = document.createElement(k === "name" ? "th" : "td");
      if (k === "name") { td.scope = "row"; const a = document.createElement("a"); a.href = "/dashboard/exits/" + r.id; td.appendChild(a); }
      if (k === "last_heartbeat_at") { const t = document.createElement("time"); t.dataset.rel = ""; td.appendChild(t); }
      if (k === "state") { const dot = document.createElement("span"); dot.setAttribute("aria-hidden", "true"); td.appendChild(dot); td.appendChild(document.createElement("span")); }
      if (["score","probe_rtt_ms","success","in_flight","bytes_per_sec"].includes(k)) td.className = "num";
      tr.appendChild(td);
    }
    byId.set(r.id, tr);
  }
  if (tr.dataset.state !== r.state) tr.dataset.state = r.state;
  cols.forEach((k, i) => {
    const td = tr.children[i];
    if (k === "name") setText(td.firstChild, r.name);
    else if (k === "last_heartbeat_at") {
      const t = td.firstChild;
      if (r[k]) { if (t.getAttribute("datetime") !== r[k]) { t.setAttribute("datetime", r[k]); t.title = r[k]; } setText(t, pnRelative(r[k])); }
      else setText(t, "–");
    } else if (k === "state") {
      const cls = "state " + r.state;
      if (td.className !== cls) { td.className = cls; td.firstChild.className = "dot " + r.state; }
      setText(td.lastChild, r.state);
      const why = r.blocked || "";
      if (td.title !== why) td.title = why;
    } else setText(td, fmt(k, r[k]));
  });
  return tr;
}
function render(d) {
  const want = d.exits.map(rowFor);
  const keep = new Set(d.exits.map(r => r.id));
  for (const [id, tr] of byId) if (!keep.has(id)) { tr.remove(); byId.delete(id); }
  let empty = document.getElementById("empty-row");
  if (want.length === 0) {
    if (!empty) {
      empty = document.createElement("tr"); empty.id = "empty-row";
      const td = document.createElement("td"); td.colSpan = cols.length; empty.appendChild(td); body.appendChild(empty);
    }
    setText(empty.firstChild, d.total === 0 ? "No exits enrolled yet: enroll one with an enrollment token (README)." : "No exit matches the filter.");
  } else if (empty) empty.remove();
  want.forEach((tr, i) => { if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null); });
  pages = d.pages; pageNo = d.page;
  const from = d.filtered ? d.page * d.per_page + 1 : 0, to = d.page * d.per_page + d.exits.length;
  setText(document.getElementById("page-info"), `exits ${from}–${to} of ${d.filtered}` + (d.filtered !== d.total ? ` (filtered from ${d.total})` : ""));
  setText(document.getElementById("page-no"), `page ${d.page + 1} of ${d.pages}`);
  document.getElementById("first").disabled = document.getElementById("prev").disabled = d.page === 0;
  document.getElementById("next").disabled = document.getElementById("last").disabled = d.page >= d.pages - 1;
}
function renderErrors(errors) {
  const tb = document.getElementById("errors");
  const key = JSON.stringify(errors);
  if (tb.dataset.key === key) return;
  tb.dataset.key = key;
  tb.replaceChildren();
  const rows = errors.length ? errors : [["no errors in the latest sample", ""]];
  for (const [token, r] of rows) {
    const tr = document.createElement("tr");
    for (const t of [token, r]) { const td = document.createElement("td"); td.textContent = t; tr.appendChild(td); }
    if (!errors.length) { tr.firstChild.colSpan = 2; tr.lastChild.remove(); }
    tb.appendChild(tr);
  }
}
async function refresh() {
  const mine = ++seq;
  const q = new URLSearchParams({ q: document.getElementById("filter").value, sort: sortBy, desc: desc ? "1" : "0", page: String(pageNo) });
  try {
    const r = await fetch("/dashboard/data.json?" + q, { credentials: "same-origin" });
    if (!r.ok || mine !== seq) return;
    const d = await r.json();
    if (mine !== seq) return;
    const s = document.getElementById("sampled");
    if (d.sampled_at) {
      let t = s.querySelector("time");
      if (!t) { t = document.createElement("time"); t.dataset.rel = ""; s.replaceChildren(t); }
      if (t.getAttribute("datetime") !== d.sampled_at) { t.setAttribute("datetime", d.sampled_at); t.title = d.sampled_at; }
      setText(t, pnRelative(d.sampled_at));
    } else setText(s, "not yet");
    for (const [k, v] of Object.entries(d.cards)) { const e = document.getElementById("card-" + k); if (e) setText(e, String(v)); }
    renderErrors(d.errors || []);
    render(d);
    document.body.dataset.loaded = "1";
  } catch (e) {}
}
function go(p) { pageNo = Math.max(0, Math.min(pages - 1, p)); refresh(); }
document.querySelectorAll("button.sort").forEach(b => b.onclick = () => {
  desc = sortBy === b.dataset.k ? !desc : false; sortBy = b.dataset.k; pageNo = 0;
  document.querySelectorAll("th[data-k]").forEach(th => th.removeAttribute("aria-sort"));
  b.parentElement.setAttribute("aria-sort", desc ? "descending" : "ascending");
  refresh();
});
document.getElementById("filter").oninput = () => { pageNo = 0; clearTimeout(timer); timer = setTimeout(refresh, 150); };
document.getElementById("first").onclick = () => go(0);
document.getElementById("prev").onclick = () => go(pageNo - 1);
document.getElementById("next").onclick = () => go(pageNo + 1);
document.getElementById("last").onclick = () => go(pages - 1);
refresh(); setInterval(refresh, 2000);
