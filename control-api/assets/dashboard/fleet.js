
const cols = ["name","source_type","country","owner","egress_ips","egress_prefixes","observed_egress","egress_verification","state","score","probe_rtt_ms","success","in_flight","bytes_per_sec","last_heartbeat_at"];
let rows = [], sortBy = "state", desc = false;
function fmt(k, v) {
  if (v === null || v === undefined) return "–";
  if (k === "score" || k === "success") return Number(v).toFixed(2);
  if (k === "probe_rtt_ms") return Number(v).toFixed(1) + " ms";
  if (k === "bytes_per_sec") return (v / 1e6).toFixed(2) + " MB/s";
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}
function render() {
  const f = document.getElementById("filter").value.toLowerCase();
  const shown = rows.filter(r => !f || cols.some(k => fmt(k, r[k]).toLowerCase().includes(f)))
    .sort((a, b) => { const x = a[sortBy], y = b[sortBy]; const c = x < y ? -1 : x > y ? 1 : 0; return desc ? -c : c; });
  const body = document.getElementById("exits");
  body.innerHTML = "";
  for (const r of shown) {
    const tr = document.createElement("tr");
    tr.dataset.exitId = r.id; tr.dataset.state = r.state;
    for (const k of cols) {
      const td = document.createElement("td");
      if (k === "name") { const a = document.createElement("a"); a.href = "/dashboard/exits/" + r.id; a.textContent = r.name; td.appendChild(a); }
      else td.textContent = fmt(k, r[k]);
      if (k === "state") { td.className = "state " + r.state; if (r.blocked) td.title = r.blocked; }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
async function refresh() {
  try {
    const r = await fetch("/dashboard/data.json", {credentials: "same-origin"});
    if (!r.ok) return;
    const d = await r.json();
    rows = d.exits;
    document.getElementById("sampled").textContent = d.sampled_at || "not yet";
    for (const [k, v] of Object.entries(d.cards)) { const e = document.getElementById("card-" + k); if (e) e.textContent = v; }
    render();
  } catch (e) {}
}
document.querySelectorAll("th[data-k]").forEach(th => th.onclick = () => { desc = sortBy === th.dataset.k ? !desc : false; sortBy = th.dataset.k; render(); });
document.getElementById("filter").oninput = render;
refresh(); setInterval(refresh, 2000);
