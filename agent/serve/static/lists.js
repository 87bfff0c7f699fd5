// sandcell's page, its lists: the sessions (rename, delete), an input's profile and the files
// the code made. Loaded after page.js, whose helpers (el, api, say, state) it uses; every
// name, title and profile here is untrusted and goes into the page as text only.
"use strict";

function size(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KB", "MB", "GB"];
  let n = bytes / 1024, i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

function sessionItem(info) {
  const when = new Date(info.created).toLocaleString();
  const meta = `${info.id.slice(0, 8)} · ${info.questions} question(s)` +
    (info.resumed ? " · from before a restart" : "") +
    (info.inputs.length ? ` · ${info.inputs.join(", ")}` : "") + ` · ${when}`;
  const open = el("button", { type: "button", class: "open", testid: "open-session", title: info.id },
    el("span", { class: "title", text: info.title || "untitled session" }),
    el("span", { class: "meta", text: meta }));
  if (state.session === info.id) open.classList.add("current");
  open.addEventListener("click", () => openSession(info));
  const rename = el("button", { type: "button", class: "tool", testid: "rename-session",
    title: "rename", "aria-label": "rename session", text: "✎" });
  rename.addEventListener("click", () => renameSession(li, info));
  const drop = el("button", { type: "button", class: "tool", testid: "delete-session",
    title: "delete", "aria-label": "delete session", text: "✕" });
  drop.addEventListener("click", () => deleteSession(info));
  const li = el("li", {}, open, el("span", { class: "tools" }, rename, drop));
  return li;
}

function renameSession(li, info) {
  // the title edited in place: Enter keeps it, Escape or leaving the box keeps the old one
  const input = el("input", { type: "text", class: "rename", testid: "rename-input",
    maxlength: "200", "aria-label": "new title" });
  input.value = info.title || "";
  li.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = async (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim() && input.value !== info.title) {
      try {
        await api("PATCH", sessionPath(info.id), JSON.stringify({ title: input.value }),
          { "Content-Type": "application/json" });
        say("session renamed", "success");
      } catch (e) { /* said */ }
    }
    loadSessions();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.isComposing) { e.preventDefault(); finish(true); }
    else if (e.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(false));
}

async function deleteSession(info) {
  const name = info.title || info.id;
  if (!window.confirm(`Delete the session "${name}" with its files and history? This cannot be undone.`)) return;
  if (state.running && state.session === info.id) {
    say("this session's question is still running: stop it first", "warning");
    return;
  }
  say("deleting…", "working");
  try { await api("DELETE", sessionPath(info.id)); } catch (e) { return; }
  if (state.session === info.id) {
    showSession(null, []);
    $("steps").replaceChildren();
  }
  say("session deleted", "success");
  loadSessions();
}

function inputItem(name, described) {
  // the input's shape at a glance; below it, folded, its profile (the file_metadata tool's,
  // as the model reads it)
  const li = el("li", { text: `/data/${name}` });
  if (described && typeof described.profile === "string") {
    const glance = typeof described.summary === "string" && described.summary;
    const box = el("details", { class: "input-profile", testid: "input-profile" },
      el("summary", { text: glance ? `profile: ${glance}` : "profile" }),
      el("pre", { text: described.profile }));
    li.append(box);
  }
  return li;
}

function describedInputs(profiles, summaries) {
  // {name: {profile, summary}} from the API's two maps by name
  const out = {};
  for (const [name, profile] of Object.entries(profiles || {})) {
    out[name] = { profile, summary: (summaries || {})[name] };
  }
  return out;
}

// -- the files the code made ---------------------------------------------------------------

async function loadOutputs(id) {
  let got;
  try { got = await (await api("GET", `${sessionPath(id)}/outputs`)).json(); } catch (e) { return; }
  if (state.session === id) showOutputs(got);
}

function showOutputs(got) {
  const box = $("outputs");
  const ul = $("output-files");
  const files = (got && got.files) || [];
  box.hidden = !files.length;
  ul.replaceChildren();
  for (const file of files) {
    if (typeof file.url !== "string" || !file.url.startsWith("/api/")) continue; // ours only
    const name = String(file.path).split("/").pop();
    const link = el("a", { href: file.url, download: name, testid: "output-file", text: file.path });
    const when = new Date(file.modified).toLocaleString();
    ul.append(el("li", {}, link, el("span", { class: "meta", text: ` ${size(file.size)} · ${when}` })));
  }
  const more = got && got.total > files.length ? ` (newest ${files.length} of ${got.total} shown)` : "";
  $("outputs-count").textContent = files.length ? `${got.total} file(s), ${size(got.bytes)}${more}` : "";
  const all = $("download-all");
  all.hidden = !(got && got.zip);
  all.href = got && got.zip ? got.zip : "#";
}

async function profilesOf(id) {
  const get = async (what) => (await api("GET", `${sessionPath(id)}/${what}`)).json();
  try {
    const [profiles, summaries] = await Promise.all([get("profiles"), get("summaries")]);
    return describedInputs(profiles, summaries);
  } catch (e) { return {}; }
}

