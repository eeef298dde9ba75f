// On every dashboard page: relative times ("12 s ago") stay current; the
// RFC 3339 instant stays in each <time>'s title.
function pnRelative(iso) {
  const t = Date.parse(iso);
  if (isNaN(t)) return "–";
  const s = Math.round((Date.now() - t) / 1000), a = Math.abs(s);
  const span = a < 60 ? a + " s" : a < 3600 ? Math.floor(a / 60) + " min" : a < 86400 ? Math.floor(a / 3600) + " h" : Math.floor(a / 86400) + " d";
  return s >= 0 ? span + " ago" : "in " + span;
}
function pnTick() {
  document.querySelectorAll("time[data-rel]").forEach(el => {
    const text = pnRelative(el.getAttribute("datetime"));
    if (el.textContent !== text) el.textContent = text;
  });
}
setInterval(pnTick, 5000);
