// The chat page. Everything a model, a tool or a user wrote is set as text
// (textContent), never parsed as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const REASONS = {
  restart_requires_confirmation: "The model call was interrupted before it answered (its worker stopped, or no worker took it up in time).",
  tool_state_unknown: "A tool was interrupted while it ran: it may or may not have done its work. It will not be run again by itself.",
  model_failed: "The model could not answer.",
  loop_guard: "The step that was continued was interrupted again.",
  interrupted_with_saved_context: "The turn's run ended unexpectedly; what it had done so far is saved.",
  interrupted_without_checkpoint: "The turn's run ended unexpectedly, and only your message was saved.",
  checkpoint_invalid: "This turn's saved context is damaged, so it cannot be continued.",
  checkpoint_unknown: "This turn's saved context cannot be read, so it cannot be continued.",
  recovery_failed: "Recovering this turn failed.",
  approval_required: "The assistant asks to run a tool that needs your approval first. Approve runs it once; Deny answers it as denied and ends the turn.",
  subagent_waiting: "A subagent this turn waits for needs you.",
};
const STATUS_WORDS = {
  running: "working", resuming: "continuing", awaiting_user: "waiting for you",
  completed: "done", recovered: "closed", failed: "failed",
};
const OPEN = ["running", "resuming", "awaiting_user"];
// A subagent's gate opens and closes in its own chat's event log, not in this
// one's: while this turn waits for a subagent, its state is read this often.
const SUBAGENT_POLL_MS = 2000;

const match = location.pathname.match(/^\/chats\/(.+)$/);
const chatId = match ? decodeURIComponent(match[1]) : null;
const chatPath = chatId ? `/api/chats/${encodeURIComponent(chatId)}` : null;

let shown = null;            // the state the buttons act on
const working = new Map();   // tool call id -> {name, status} of the current turn
const pending = new Map();   // message id -> {text, rejected}: sent, not yet in the thread
const committed = new Set(); // message ids the event stream reported: the stream may beat the 202
const refused = new Map();   // message id -> the reason the workflow gave
let draft = null;            // {id, text}: a retried send reuses its message id
let answer = null;           // {turn, step, attempt, text}: the answer as it streams, until it is recorded
let sending = false;
let stream = null;

class LoginNeeded extends Error {}

async function call(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401) { showLogin(); throw new LoginNeeded(); }
  let data = null;
  try { data = await res.json(); } catch (_) { /* an empty answer */ }
  return { status: res.status, data, headers: res.headers };
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function newMessageId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);  // also where crypto.randomUUID is not offered (plain http)
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function showRefusal(text) {
  const box = $("refusal");
  box.textContent = text;
  box.hidden = !text;
}

// -- the chat list ------------------------------------------------------------

async function refreshList() {
  const res = await call("GET", "/api/chats");
  if (res.status !== 200) return;
  const list = $("chat-list");
  list.replaceChildren();
  for (const chat of res.data) {
    const item = el("li");
    const link = el("a", null, chat.chat_id);
    link.href = `/chats/${encodeURIComponent(chat.chat_id)}`;
    item.append(link, el("span", `badge ${chat.status}`, chat.status));
    if (chat.chat_id === chatId) item.setAttribute("aria-current", "page");
    list.append(item);
  }
  $("list-empty").hidden = res.data.length > 0;
}

// -- the thread -----------------------------------------------------------------

function renderThread(rows) {
  const thread = $("thread");
  thread.replaceChildren();
  for (const row of rows) {
    const item = el("li", row.role);
    if (row.role === "tool") {
      item.append(el("span", "who", `tool ${row.name || ""}`), el("pre", "text", row.content));
    } else {
      item.append(el("span", "who", row.role === "user" ? "you" : "assistant"));
      if (row.content) item.append(el("p", "text", row.content));
      for (const c of row.tool_calls || []) item.append(el("pre", "calls", `→ ${c.name}(${c.arguments})`));
    }
    thread.append(item);
  }
  for (const [id, msg] of pending) {
    const item = el("li", msg.rejected ? "user rejected" : "user pending");
    item.dataset.messageId = id;
    item.append(el("span", "who", msg.rejected ? `you (refused: ${msg.rejected})` : "you (sent)"),
                el("p", "text", msg.text));
    thread.append(item);
  }
}

function renderWorking() {
  const active = shown && ["running", "resuming"].includes(shown.status) && shown.turn > 0;
  const box = $("working");
  box.hidden = !active;
  const list = $("working-tools");
  list.replaceChildren();
  if (!active) return;
  for (const [, t] of working) list.append(el("li", `tool ${t.status}`, `${t.name}: ${t.status}`));
  renderAnswer();
}

function renderAnswer() {
  const box = $("answer");
  box.textContent = answer ? answer.text : "";  // text, never markup
  box.hidden = !answer || !answer.text;
}

// A delta is a piece of one attempt's text after `offset` characters. A newer
// attempt of the step (a lost call run again) replaces the older one's text.
function onDelta(p) {
  const same = answer && answer.turn === p.turn && answer.step === p.step;
  if (same && p.attempt < answer.attempt) return;
  if (!same || p.attempt > answer.attempt || (shown && p.turn < shown.turn)) {
    answer = { turn: p.turn, step: p.step, attempt: p.attempt, text: "" };
  }
  if (p.offset > answer.text.length) return;  // a piece went missing: the recorded answer will come
  answer.text = answer.text.slice(0, p.offset) + p.text;
  renderAnswer();
}

function chatLink(id, text) {
  const link = el("a", null, text);
  link.href = `/chats/${encodeURIComponent(id)}`;
  return link;
}

// The turn's subagents: each a chat of its own, opened in this page like any chat.
function renderSubagents(state) {
  const subs = state.subagents || [];
  $("subagents").hidden = subs.length === 0;
  const list = $("subagent-list");
  list.replaceChildren();
  for (const s of subs) {
    const item = el("li");
    const link = chatLink(s.chat_id, s.chat_id);
    link.title = "Open the subagent's chat: its transcript and its turn";
    item.append(link, el("span", `badge ${s.status}`, s.reason ? `${s.status} (${s.reason})` : s.status),
                el("span", "mode", s.mode === "background" ? "in the background" : "waited for"),
                el("p", "task", s.task));
    list.append(item);
  }
}

// The gate of a subagent this turn waits for: decided here, the workflow hands it on.
function subagentNotice(sub) {
  const lead = REASONS.subagent_waiting;
  const outcome = "Dismiss ends this turn, and its subagents with it.";
  if (!sub) return `${lead} Continue lets it go on; ${outcome}`;
  if (sub.reason === "approval_required") {
    return `${lead} It asks to run a tool that needs your approval first (its chat lists the calls). ` +
      `Continue approves them: they run, once. Dismiss denies them and ends this turn, and its subagents with it.`;
  }
  const why = REASONS[sub.reason] || `It waits (${sub.reason}).`;
  return `${lead} ${why} Continue lets it go on from where it stopped; ${outcome}`;
}

function waitsForSubagent() {
  return Boolean(shown) && OPEN.includes(shown.status) &&
    (shown.subagents || []).some((s) => s.mode === "wait" && OPEN.includes(s.status));
}

function renderState(state) {
  shown = state;
  const words = STATUS_WORDS[state.status] || state.status;
  let line = state.turn ? `Turn ${state.turn}: ${state.status}` : "No turn yet";
  if (state.turn && state.reason) line += ` (${state.reason})`;
  if (state.turn) line += ` — ${words}`;
  if (state.store_unavailable) line += "; the session store does not answer, the turn waits for it";
  $("status").textContent = line;
  const waiting = state.status === "awaiting_user" || state.status === "failed";
  $("notice").hidden = !waiting;
  const forSub = waiting && state.reason === "subagent_waiting";
  const sub = forSub
    ? (state.subagents || []).find((s) => s.status === "awaiting_user" && s.recovery_id === state.recovery_id)
    : null;
  if (waiting) {
    $("notice-text").textContent = forSub
      ? subagentNotice(sub)
      : REASONS[state.reason] || `The turn waits for you (${state.reason}).`;
    $("notice-detail").textContent = state.detail ? `Why: ${state.detail}` : "";
    $("notice-detail").hidden = !state.detail;
    $("continue").hidden = !state.can_continue;
  }
  // An approval gate's two answers say what they do: the calls run, or they never do.
  const asks = state.status === "awaiting_user" && state.reason === "approval_required";
  $("continue").textContent = asks ? "Approve" : "Continue";
  $("dismiss").textContent = asks ? "Deny" : "Dismiss";
  const calls = $("notice-calls");
  calls.replaceChildren();
  for (const a of asks ? state.approvals || [] : []) calls.append(el("li", null, `${a.name}(${a.arguments})`));
  calls.hidden = !asks;
  $("notice-sub").hidden = !sub;
  if (sub) $("notice-sub").replaceChildren(chatLink(sub.chat_id, `Open the subagent's chat (${sub.chat_id})`));
  renderSubagents(state);
  $("stop").hidden = !(["running", "resuming"].includes(state.status) && state.turn > 0);
  // The state's tool calls are the truth for its turn; events refine it between reads.
  working.clear();
  for (const c of state.tool_calls || []) working.set(c.id, { name: c.name, status: c.status });
  renderWorking();
}

async function refreshState() {
  const res = await call("GET", chatPath);
  if (res.status === 200) renderState(res.data);
}

async function refreshChat() {
  const [stateRes, rowsRes] = await Promise.all([call("GET", chatPath), call("GET", `${chatPath}/messages`)]);
  if (stateRes.status === 200) renderState(stateRes.data);
  else if (stateRes.status === 404) $("status").textContent = "New chat: send a message to start it.";
  else if (stateRes.data && stateRes.data.detail) $("status").textContent = stateRes.data.detail;
  if (rowsRes.status === 200) renderThread(rowsRes.data);
  return rowsRes.status === 200 ? Number(rowsRes.headers.get("X-Event-Seq") || 0) : 0;
}

let refreshTimer = null;
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => { refreshChat().catch(() => {}); refreshList().catch(() => {}); }, 80);
}

// -- the event stream ---------------------------------------------------------------

function follow(after) {
  stream = new EventSource(`${chatPath}/events?after=${after}`);
  const on = (type, fn) => stream.addEventListener(type, (e) => fn(JSON.parse(e.data)));
  on("tool_started", (p) => {
    working.set(p.tool_call_id, { name: p.name, status: "running" });
    renderWorking();
    if (p.name === "delegate") refreshSoon();  // the state lists the subagent it starts
  });
  const finished = (p) => {
    working.set(p.tool_call_id, { name: p.name, status: p.status || "interrupted" });
    renderWorking();
    if (p.name === "delegate") refreshSoon();
  };
  on("tool_finished", finished);
  on("tool_interrupted", finished);
  on("assistant_delta", onDelta);
  on("assistant_message", (p) => {
    if (answer && answer.turn === p.turn && answer.step === p.step) { answer = null; renderAnswer(); }
  });
  on("turn_end", () => { answer = null; renderAnswer(); });
  on("user_message", (p) => { committed.add(p.message_id); pending.delete(p.message_id); refreshSoon(); });
  on("message_rejected", (p) => {
    refused.set(p.message_id, p.reason || "refused");
    const msg = pending.get(p.message_id);
    if (msg) msg.rejected = refused.get(p.message_id);
    showRefusal(`Message refused: ${p.reason || "no reason given"}`);
    refreshSoon();
  });
  for (const type of ["turn_started", "assistant_message", "recovery_state", "session_updated",
                      "recovery_action_rejected", "turn_end"]) {
    on(type, refreshSoon);
  }
}

// -- actions ------------------------------------------------------------------------

async function send() {
  const box = $("message");
  const text = box.value;
  if (!text.trim() || sending) return;
  if (!draft || draft.text !== text) draft = { id: newMessageId(), text };
  sending = true;
  $("send").disabled = true;
  try {
    const res = await call("POST", `${chatPath}/messages`, { text, message_id: draft.id });
    if (res.status === 202) {
      const reason = refused.get(draft.id);
      if (!committed.has(draft.id)) pending.set(draft.id, { text, rejected: reason || null });
      draft = null;
      box.value = "";
      showRefusal(reason ? `Message refused: ${reason}` : "");
      refreshSoon();
    } else {
      showRefusal(`Not sent: ${(res.data && res.data.detail) || `HTTP ${res.status}`}`);
    }
  } catch (err) {
    if (!(err instanceof LoginNeeded)) showRefusal("Not sent (no connection); Send again retries the same message.");
  } finally {
    sending = false;
    $("send").disabled = false;
  }
}

async function decide(action) {
  if (!shown || !shown.recovery_id) return;
  const buttons = [$("continue"), $("dismiss")];
  const label = $(action).textContent;
  buttons.forEach((b) => { b.disabled = true; });
  try {
    const res = await call("POST", `${chatPath}/${action}`, { recovery_id: shown.recovery_id });
    if (res.status === 200) {
      showRefusal("");
      renderState(res.data);
    } else {
      // e.g. another tab acted first: say so, then show what is true now.
      const why = (res.data && res.data.detail) || `HTTP ${res.status}`;
      const hint = res.status === 409 ? " The turn changed meanwhile (another tab or the CLI may have acted first); it is shown as it is now." : "";
      showRefusal(`${label} was refused: ${why}.${hint}`);
    }
    refreshSoon();
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

async function stop() {
  const res = await call("POST", `${chatPath}/stop`, {});
  if (res.status !== 202) showRefusal(`Stop was refused: ${(res.data && res.data.detail) || `HTTP ${res.status}`}`);
  refreshSoon();
}

// -- login and start -------------------------------------------------------------------

function showLogin() {
  for (const id of ["chat", "welcome"]) $(id).hidden = true;
  document.querySelector("nav").hidden = true;
  $("login").hidden = false;
  $("token").focus();
}

async function login(event) {
  event.preventDefault();
  const res = await fetch("/login", { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token: $("token").value }) });
  if (res.status === 204) { location.reload(); return; }
  $("login-error").textContent = "Wrong token.";
  $("login-error").hidden = false;
}

function openNewChat() {
  const bytes = new Uint8Array(4);
  crypto.getRandomValues(bytes);
  location.href = `/chats/chat-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

async function start() {
  $("login").addEventListener("submit", login);
  $("new-chat").addEventListener("click", openNewChat);
  try {
    await refreshList();
    if (!chatId) return;
    $("welcome").hidden = true;
    $("chat").hidden = false;
    $("chat-title").textContent = chatId;
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
    $("message").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    });
    $("continue").addEventListener("click", () => decide("continue"));
    $("dismiss").addEventListener("click", () => decide("dismiss"));
    $("stop").addEventListener("click", stop);
    follow(await refreshChat());
    setInterval(() => refreshList().catch(() => {}), 5000);
    setInterval(() => { if (waitsForSubagent()) refreshState().catch(() => {}); }, SUBAGENT_POLL_MS);
  } catch (err) {
    if (!(err instanceof LoginNeeded)) throw err;
  }
}

start();
