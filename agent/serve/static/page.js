// sandcell's page. Everything the model, the sandbox or an upload produced is untrusted: it
// is put in the page as text (textContent) only. The two exceptions are HTML the server has
// already cleaned with nh3: a table's (tags of a table, no attributes but spans) and an
// answer's Markdown (no raw HTML, links to http(s) or the session's own files only).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { session: null, running: false, profiles: {} };

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "testid") node.dataset.testid = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// kind: "success", "warning", "error" or "working" (a long operation under way), each
// styled by page.css; none for a plain word.
function say(text, kind = "") {
  const status = $("status");
  status.textContent = text || "";
  status.className = text && kind ? kind : "";
  status.dataset.kind = text ? kind : "";
}

const sessionPath = (id) => `/api/sessions/${encodeURIComponent(id)}`;

async function api(method, path, body, headers = {}) {
  const response = await fetch(path, { method, body, headers, credentials: "same-origin" });
  if (response.status === 401) {
    say("Not signed in: open the URL with ?token= that `sandcell serve` printed.", "error");
    throw new Error("401");
  }
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    say(message, response.status === 409 || response.status === 429 ? "warning" : "error");
    throw new Error(message);
  }
  return response;
}

// -- sessions ------------------------------------------------------------------------------

async function loadSessions() {
  let list;
  try { list = await (await api("GET", "/api/sessions")).json(); } catch (e) { return; }
  const ul = $("sessions");
  ul.replaceChildren();
  list.sort((a, b) => (b.created > a.created ? 1 : -1));
  for (const info of list) ul.append(sessionItem(info));
}

function showSession(id, inputs, profiles = {}) {
  state.session = id;
  $("session-label").textContent = id ? `session ${id}` : "no session yet";
  const link = $("download-notebook");
  link.hidden = !id;
  link.href = id ? `${sessionPath(id)}/notebook` : "#";
  const ul = $("inputs");
  ul.replaceChildren(...(inputs || []).map((name) => inputItem(name, profiles[name])));
  showOutputs(null);
  if (id) loadOutputs(id);
}

function reopenNote(info) {
  if (info.running) {
    return "A question or cell of this session is still running: its answer shows where it " +
      "was asked. Wait for it before you ask the next one.";
  }
  if (info.sandbox === "paused") {
    return "This session's kernel was paused: the next question or cell restores it with " +
      "every variable as it was.";
  }
  if (info.resumed) {
    return "This session is from before the server restarted: its kernel is rebuilt by " +
      "re-running its recorded cells when you ask the next question or run a cell.";
  }
  if (info.sandbox === "released") {
    return "This session was idle, so its sandbox was released: the next question starts a " +
      "fresh kernel (its files are kept).";
  }
  return "Its kernel and variables are as you left them.";
}

function question(content) {
  const q = el("div", { class: "step question" }, el("div", { class: "kind", text: "you" }));
  q.append(el("div", { text: content }));
  $("steps").append(q);
}

async function openSession(info) {
  state.session = info.id;
  const profiles = await profilesOf(info.id);
  if (state.session !== info.id) return; // another session was opened meanwhile
  state.profiles = profiles;
  showSession(info.id, info.inputs, profiles);
  $("steps").replaceChildren();
  say("");
  loadSessions();
  let turns = [];
  try {
    turns = await (await api("GET", `${sessionPath(info.id)}/history`)).json();
  } catch (e) { /* said */ }
  if (state.session !== info.id) return; // another session was opened meanwhile
  // the questions and answers so far (questions as text; answers as the server's clean HTML)
  for (const turn of turns) {
    question(String(turn.question || ""));
    if (turn.answer !== null || turn.stop_reason !== null) {
      answer("answer", { answer: turn.answer, answer_html: turn.answer_html, stop_reason: turn.stop_reason });
    }
  }
  $("steps").append(el("div", { class: "step note", text: reopenNote(info) }));
}

async function ensureSession() {
  if (state.session) return state.session;
  const { id } = await (await api("POST", "/api/sessions")).json();
  state.profiles = {};
  showSession(id, []);
  loadSessions();
  return id;
}

// -- uploads -------------------------------------------------------------------------------

async function upload(fileList) {
  if (!fileList || !fileList.length) return;
  const id = await ensureSession();
  const form = new FormData();
  for (const file of fileList) form.append("file", file, file.name);
  say(`uploading ${[...fileList].map((f) => f.name).join(", ")}…`, "working");
  try {
    const got = await (await api("POST", `${sessionPath(id)}/files`, form)).json();
    const added = describedInputs(got.profiles, got.summaries);
    state.profiles = { ...(state.session === id ? state.profiles : {}), ...added };
    showSession(id, got.inputs, state.profiles);
    say(`uploaded ${got.names.join(", ")}`, "success");
  } catch (e) { return; }
  loadSessions();
}

// -- a question as a stream of steps ----------------------------------------------------------

function step(kind, title) {
  const node = el("div", { class: `step ${kind}`, testid: "step" });
  node.append(el("div", { class: "kind", text: title || kind }));
  $("steps").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

let live = null; // the model's tokens as they come, until its step arrives
let lastAction = null;

function dropLive() {
  if (live) live.remove();
  live = null;
}

function onEvent(kind, data) {
  if (kind === "token") {
    if (!live) {
      live = el("div", { class: "live" });
      $("steps").append(live);
    }
    live.textContent += data.text || "";
    return;
  }
  if (kind === "output") {
    if (lastAction) {
      let pre = lastAction.querySelector("pre.output");
      if (!pre) pre = lastAction.appendChild(el("pre", { class: "output" }));
      pre.textContent += data.text || "";
    }
    return;
  }
  dropLive();
  if (kind === "thought") {
    if (data.text) step("thought").append(el("div", { text: data.text }));
  } else if (kind === "action") {
    const node = step("action", `action: ${data.tool}`);
    let args = data.args || {};
    if (typeof args === "string") {
      try { args = JSON.parse(args); } catch (e) { args = { code: args }; }
    }
    const code = typeof args.code === "string" ? args.code : JSON.stringify(args, null, 2);
    const details = el("details", { open: "" }, el("summary", { text: "code" }));
    details.append(el("pre", {}, el("code", { text: code })));
    node.append(details);
    lastAction = node;
  } else if (kind === "observation") {
    observation(data);
  } else if (kind === "net") { // a connection through the sandbox's proxy (--allow-net)
    const where = `${data.host}:${data.port}`;
    const text = data.allowed
      ? `connection to ${where}: ${data.sent} bytes sent, ${data.received} received${data.reason ? `; ${data.reason}` : ""}`
      : `connection to ${where} refused: ${data.reason}`;
    step("net").append(el("div", { text }));
  } else if (kind === "warning") {
    step("warning").append(el("div", { text: data.text || "" }));
  } else if (kind === "answer" || kind === "error") {
    answer(kind, data);
  }
}

function observation(data) {
  // Each output once: the output shown live under the code moves here; a result with an HTML
  // table is the table alone; the error once, in the error style.
  const failed = data.ok === false;
  const node = step(failed ? "observation failed" : "observation",
    `observation${failed ? " (error)" : ""}`);
  const streamed = lastAction && lastAction.querySelector("pre.output");
  lastAction = null;
  if (!("output" in data)) { // not a cell (another tool): its text is all there is
    if (data.text) node.append(el("pre", { class: failed ? "error" : "", text: data.text }));
  } else {
    if (streamed) node.append(streamed);
    else if (data.output) node.append(el("pre", { class: "output", text: data.output }));
    for (const text of data.results || []) node.append(el("pre", { class: "result", text }));
  }
  const drawing = window.sandcellCharts; // charts.js: absent if it failed to load
  (data.tables || []).forEach((html, i) => {
    const rows = (data.table_data || [])[i];
    if (rows && drawing) { // a DataFrame: drawn from its data, its columns sortable
      node.append(drawing.dataTable(rows));
      return;
    }
    const box = el("div", { class: "table", testid: "table" });
    box.innerHTML = html; // server-sanitized by nh3 (agent/serve/stream.py table_html)
    node.append(box);
  });
  (data.figures || []).forEach((url, i) => {
    if (typeof url !== "string" || !url.startsWith("/api/")) return; // our own files only
    const chart = (data.charts || [])[i] || null;
    node.append(drawing ? drawing.figure(url, chart)
      : el("img", { class: "chart", testid: "chart", src: url, alt: "figure" }));
  });
  if (data.error) node.append(el("pre", { class: "error", testid: "cell-error", text: data.error }));
  for (const note of data.notes || []) node.append(el("div", { class: "cell-note", text: note }));
}

function answerBody(data) {
  // The answer's Markdown as HTML the server sanitized with nh3 (agent/serve/stream.py
  // answer_html); an error, or an answer without it, as text.
  if (typeof data.answer_html === "string") {
    const box = el("div", { class: "answer-text" });
    box.innerHTML = data.answer_html;
    for (const code of box.querySelectorAll("pre > code")) addCopyButton(code);
    return box;
  }
  const text = data.answer != null ? data.answer : data.error || data.detail || "no answer";
  return el("div", { class: "answer-text plain", text: String(text) });
}

function addCopyButton(code) {
  const button = el("button", { type: "button", class: "copy", testid: "copy", text: "copy" });
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code.textContent);
      button.textContent = "copied";
    } catch (e) {
      button.textContent = "select and copy by hand"; // not a secure context, or refused
    }
  });
  code.parentElement.before(button);
}

function answer(kind, data) {
  const node = el("div", { class: `step ${kind}`, testid: "answer" });
  node.append(el("div", { class: "kind", text: kind === "error" ? "error" : `answer (${data.stop_reason})` }));
  node.append(answerBody(data));  // the files it made: the "Files the code made" list, once
  $("steps").append(node);
  node.scrollIntoView({ block: "end" });
}

function lines(buffer) {
  // Split off complete lines (\r\n, \n or \r); keep the rest (a lone \r may precede \n).
  const out = [];
  let start = 0;
  for (let i = 0; i < buffer.length; i++) {
    const c = buffer[i];
    if (c === "\n" || c === "\r") {
      if (c === "\r" && i + 1 === buffer.length) break;
      out.push(buffer.slice(start, i));
      if (c === "\r" && buffer[i + 1] === "\n") i++;
      start = i + 1;
    }
  }
  return [out, buffer.slice(start)];
}

async function readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", kind = "message", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const [complete, rest] = lines(done ? buffer + "\n" : buffer);
    buffer = rest;
    for (const line of complete) {
      if (line === "") {
        if (data.length) {
          try { onEvent(kind, JSON.parse(data.join("\n"))); } catch (e) { console.error(e); }
        }
        kind = "message"; data = [];
      } else if (line.startsWith(":")) {
        continue;
      } else if (line.startsWith("event:")) {
        kind = line.slice(6).trim();
      } else if (line.startsWith("data:")) {
        data.push(line.slice(5).replace(/^ /, ""));
      }
    }
    if (done) return;
  }
}

function setRunning(running) {
  state.running = running;
  $("stop").hidden = !running;
  $("send").disabled = running;
}

async function send() {
  const content = $("prompt").value;
  if (!content.trim() || state.running) return;
  let id;
  try { id = await ensureSession(); } catch (e) { return; }
  $("prompt").value = "";
  // the request answers once the session has a sandbox (a start, a rebuild): working till then
  say("starting the sandbox…", "working");
  question(content);
  setRunning(true);
  try {
    const response = await api("POST", `${sessionPath(id)}/messages`,
      JSON.stringify({ content }), { "Content-Type": "application/json" });
    say("working…", "working");
    await readEvents(response);
    if ($("status").dataset.kind === "working") say("");
  } catch (e) {
    if (e.message !== "401") say(`the question stopped: ${e.message}`, "error");
  } finally {
    dropLive();
    setRunning(false);
    loadSessions();
    if (state.session === id) loadOutputs(id);
  }
}

async function stop() {
  if (!state.session) return;
  try { await api("POST", `/api/sessions/${state.session}/interrupt`); } catch (e) { /* said */ }
}

// -- wiring ----------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("upload").addEventListener("change", (e) => { upload(e.target.files).then(() => { e.target.value = ""; }); });
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    upload(e.dataTransfer.files);
  });
  $("ask").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-session").addEventListener("click", () => {
    state.profiles = {};
    showSession(null, []);
    $("steps").replaceChildren();
    loadSessions();
  });
  loadSessions();
});
