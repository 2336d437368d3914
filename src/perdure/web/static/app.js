// perdure dashboard: live regions, charts of the last hour, a model call's live stream.
// Plain JS, no dependency, served by the dashboard itself (no CDN).
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawCharts() {
  const source = document.getElementById("hour-data");
  if (!source) return;
  let data;
  try { data = JSON.parse(source.textContent); } catch (e) { return; }
  for (const fig of document.querySelectorAll("figure.chart")) {
    const svg = fig.querySelector("svg");
    const series = data[fig.dataset.series] || [];
    const unit = fig.dataset.unit || "";
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = 600, H = 160, left = 44, bottom = 20, top = 10;
    const max = Math.max(...series, 0);
    const scale = max > 0 ? (H - bottom - top) / max : 0;
    const bar = (W - left) / Math.max(series.length, 1);
    svg.appendChild(el("line", {x1: left, y1: H - bottom, x2: W, y2: H - bottom, class: "axis"}));
    svg.appendChild(el("line", {x1: left, y1: top, x2: left, y2: H - bottom, class: "axis"}));
    const label = unit === "$" ? "$" + max.toFixed(4) : max.toFixed(unit === "s" ? 2 : 0) + unit;
    svg.appendChild(el("text", {x: 2, y: top + 10, class: "tick"}, label));
    svg.appendChild(el("text", {x: left, y: H - 4, class: "tick"}, "-60 min"));
    svg.appendChild(el("text", {x: W - 30, y: H - 4, class: "tick"}, "now"));
    series.forEach((v, i) => {
      const h = v * scale;
      const rect = el("rect", {x: left + i * bar + 1, y: H - bottom - h, width: Math.max(bar - 2, 1),
                                height: h, class: "bar"});
      rect.appendChild(el("title", {}, `${60 - i} min ago: ${v}`));
      svg.appendChild(rect);
    });
  }
}

async function refresh() {
  if (document.hidden) return;
  const regions = document.querySelectorAll("[data-live][id]");
  if (!regions.length) return;
  const url = new URL(location.href);
  url.searchParams.delete("verify");  // verifying again on each refresh would cost a full read
  let response;
  try {
    response = await fetch(url, {headers: {Accept: "text/html"}, credentials: "same-origin"});
  } catch (e) { return; }
  if (!response.ok || response.redirected) return;
  const doc = new DOMParser().parseFromString(await response.text(), "text/html");
  for (const region of regions) {
    const fresh = doc.getElementById(region.id);
    if (fresh && fresh.innerHTML !== region.innerHTML) region.innerHTML = fresh.innerHTML;
  }
  drawCharts();
}

function follow() {
  const out = document.getElementById("stream");
  if (!out || !out.dataset.src || typeof EventSource === "undefined") return;
  const source = new EventSource(out.dataset.src);
  const add = (text) => {
    out.appendChild(document.createTextNode(text));
    out.scrollTop = out.scrollHeight;
  };
  source.onmessage = (msg) => {
    let doc;
    try { doc = JSON.parse(msg.data); } catch (e) { return; }
    if (doc.text !== undefined) add(doc.text);
    else add(`\n[${doc.seq} ${doc.kind}] ${doc.line}\n`);
  };
  source.addEventListener("end", () => { add("\n— the object ended —\n"); source.close(); });
  source.addEventListener("problem", (msg) => { add(`\n${msg.data}\n`); source.close(); });
}

document.addEventListener("DOMContentLoaded", () => {
  drawCharts();
  follow();
  setInterval(refresh, 2000);
});
