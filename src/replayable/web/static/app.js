// replayable web: payloads fetched on expand, the verify badge, job polling, scroll to a target.
// No inline script anywhere (the Content-Security-Policy forbids it); payload text is
// inserted as server-escaped HTML fragments, never built from strings here.
"use strict";

function csrf() {
  const meta = document.querySelector('meta[name="csrf"]');
  return meta ? meta.content : "";
}

async function fetchFragment(url) {
  const res = await fetch(url, { headers: { "x-fragment": "1" }, credentials: "same-origin" });
  const text = await res.text();
  if (!res.ok) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = "could not load (" + res.status + ")";
    return p;
  }
  const doc = new DOMParser().parseFromString(text, "text/html");
  const view = doc.querySelector(".payload-view");
  return view ? document.importNode(view, true) : document.createTextNode("");
}

function wirePayloads(root) {
  root.querySelectorAll("details.payload").forEach((box) => {
    box.addEventListener("toggle", async () => {
      if (!box.open || box.dataset.loaded) return;
      box.dataset.loaded = "1";
      const body = box.querySelector(".payload-body");
      const node = await fetchFragment(box.dataset.src);
      body.replaceChildren(node);
      wireShowAll(body, box.dataset.src);
    });
  });
}

function wireShowAll(root, src) {
  root.querySelectorAll("a.show-all").forEach((a) => {
    a.addEventListener("click", async (ev) => {
      ev.preventDefault();
      const node = await fetchFragment(src + "?full=true");
      root.replaceChildren(node);
    });
  });
}

async function verifyBadge() {
  const badge = document.getElementById("verify-badge");
  if (!badge) return;
  const res = await fetch("/api/runs/" + encodeURIComponent(badge.dataset.run) + "/verify", { credentials: "same-origin" });
  if (!res.ok) { badge.textContent = "chain not checked (" + res.status + ")"; return; }
  const data = await res.json();
  badge.textContent = data.status;
  badge.title = data.message;
  badge.classList.add("badge-" + data.status);
}

function pollJob() {
  const job = document.getElementById("job");
  if (!job || !["queued", "running"].includes(job.dataset.state)) return;
  setTimeout(async () => {
    const res = await fetch("/api/jobs/" + encodeURIComponent(job.dataset.job), { credentials: "same-origin" });
    if (res.ok) {
      const data = await res.json();
      if (data.state !== job.dataset.state) { window.location.reload(); return; }
      const progress = document.getElementById("job-progress");
      if (progress && data.step !== null) {
        progress.textContent = "step " + data.step.toLocaleString("en") + " of " + data.total_steps.toLocaleString("en");
      }
      const elapsed = document.getElementById("job-elapsed");
      if (elapsed) elapsed.textContent = String(data.elapsed_s);
    }
    pollJob();
  }, 500);
}

function wireForkHere() {
  document.querySelectorAll("button.fork-here").forEach((button) => {
    button.addEventListener("click", async () => {
      const controls = document.getElementById("replay-controls");
      if (!controls) return;
      controls.open = true;
      document.getElementById("replay-mode").value = "fork";
      document.getElementById("replay-step").value = button.dataset.seq;
      const res = await fetch(button.dataset.src, { credentials: "same-origin" });
      if (res.ok) {
        const data = await res.json();
        document.getElementById("replay-override").value = data.response ? data.response.text : "";
      }
      controls.scrollIntoView({ block: "start" });
    });
  });
}

function scrollToTarget() {
  const first = document.getElementById("first-divergence");
  const target = first || (location.hash && document.getElementById(location.hash.slice(1)));
  if (target) target.scrollIntoView({ block: "center" });
}

document.addEventListener("DOMContentLoaded", () => {
  wirePayloads(document);
  wireForkHere();
  verifyBadge();
  pollJob();
  scrollToTarget();
});
