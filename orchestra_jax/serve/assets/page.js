// The orchestrator's page: reads GET v1/orchestrator (features, tools, defaults),
// sends POST v1/chat/completions with stream=true and shows the orchestration steps
// as their server-sent events arrive (fetch + ReadableStream: EventSource cannot
// POST), then the answer, its cost and a table of the calls (docs/serving.md).
// Every piece of server text is written with textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const BASE_FEATURES = ["accuracy", "cost", "latency"];
const FEATURE_WORDS = { accuracy: "A correct answer", cost: "Low total cost", latency: "Low total latency" };
const state = { info: null, loadedKey: null, controller: null };

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

// Figures as the page shows them everywhere (tests read them back the same way).
function usd(x) {
  return (x === null || x === undefined) ? "–" : "$" + Number(x).toFixed(6);
}
function seconds(x) {
  return (x === null || x === undefined) ? "–" : Number(x).toFixed(2) + " s";
}
function count(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}
function weight(x) {
  return Number(x).toFixed(2);
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// ---- errors ---------------------------------------------------------------------

function showError(text) {
  const box = $("error");
  box.textContent = text;
  box.hidden = false;
}
function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// An HTTP error response in words: the status, the server's message, what to do.
async function failureText(response, what) {
  let message = "";
  try {
    const body = await response.json();
    message = (body && body.error && body.error.message) || JSON.stringify(body);
  } catch (_) {
    message = response.statusText || "";
  }
  let advice = "";
  if (response.status === 401) {
    advice = $("api-key").value.trim()
      ? "The server refused this API key: check the key field."
      : "The server needs an API key: enter it in the key field above.";
  } else if (response.status === 429) {
    const after = response.headers.get("Retry-After");
    advice = "The server is answering as many requests as it allows at once"
      + (after ? `; try again in ${after} s.` : "; try again shortly.");
  } else if (response.status === 413) {
    advice = "The request is larger than the server accepts.";
  } else if (response.status >= 500) {
    advice = "The server failed; its log says more.";
  }
  return `${what}: HTTP ${response.status}${message ? ": " + message : ""}`
    + (advice ? "\n" + advice : "");
}

function networkText(what, err) {
  return `${what}: the server could not be reached (${err && err.message ? err.message : err}). `
    + "Is it still running, and is this page served by it?";
}

// ---- settings: sliders and budgets from GET v1/orchestrator -----------------------

function featureLabel(feature, info) {
  const label = el("label");
  if (FEATURE_WORDS[feature]) {
    label.textContent = FEATURE_WORDS[feature];
    return label;
  }
  const name = feature.slice("tool:".length);
  label.textContent = `Using ${name}`;
  const alias = (info.aliases || []).find((a) => a.alias === name);
  if (alias) {
    label.append(" ", el("span", "hint", `(${alias.tool}: $${alias.price_in} in, `
      + `$${alias.price_out} out per million tokens, about ${alias.latency_s} s)`));
  }
  return label;
}

function sliderRow(parent, feature, index, info) {
  const id = `pref-${index}`;
  const label = featureLabel(feature, info);
  label.htmlFor = id;
  const input = document.createElement("input");
  input.type = "range";
  input.id = id;
  input.min = "0";
  input.step = "0.05";
  input.dataset.feature = feature;
  const fallback = Number((info.defaults.preference || {})[feature] || 0);
  input.max = String(Math.max(1, Math.ceil(fallback)));
  input.dataset.default = String(fallback);
  input.value = String(fallback);
  const out = el("output", null, weight(fallback));
  out.htmlFor = id;
  input.addEventListener("input", () => { out.textContent = weight(input.value); });
  parent.append(label, input, out);
}

function resetPreferences() {
  for (const input of document.querySelectorAll("#preferences input[type=range]")) {
    input.value = input.dataset.default;
    input.dispatchEvent(new Event("input"));
  }
}

function toolBoxes(info) {
  const box = $("tools");
  box.textContent = "";
  box.append(el("div", "hint", "Tools allowed (answer always stays)"));
  const allowed = new Set(info.defaults.allowed_tools || info.tools);
  for (const tool of info.tools) {
    const row = el("div");
    const label = el("label");
    const check = document.createElement("input");
    check.type = "checkbox";
    check.dataset.tool = tool;
    check.checked = tool === "answer" || allowed.has(tool);
    check.disabled = tool === "answer";
    label.append(check, " " + tool);
    row.append(label);
    const own = (info.aliases || []).filter((a) => a.tool === tool);
    if (own.length) {
      const list = el("div", "aliases");
      for (const a of own) {
        const aliasLabel = el("label");
        const aliasCheck = document.createElement("input");
        aliasCheck.type = "checkbox";
        aliasCheck.dataset.alias = a.alias;
        aliasCheck.dataset.ofTool = tool;
        aliasCheck.checked = check.checked && (allowed.has(tool) || allowed.has(a.alias));
        aliasCheck.addEventListener("change", () => {
          const any = [...list.querySelectorAll("input")].some((c) => c.checked);
          if (tool !== "answer") check.checked = any;
          if (tool === "answer" && !any) aliasCheck.checked = true; // answer keeps one model
          syncPreferenceRows();
        });
        aliasLabel.append(aliasCheck, " " + a.alias);
        list.append(aliasLabel);
      }
      check.addEventListener("change", () => {
        for (const c of list.querySelectorAll("input")) c.checked = check.checked;
        syncPreferenceRows();
      });
      row.append(list);
    } else {
      check.addEventListener("change", syncPreferenceRows);
    }
    box.append(row);
  }
}

// Tool names and aliases allowed now, and whether that is every one of them.
function allowedNames() {
  const names = [];
  let everything = true;
  for (const check of document.querySelectorAll("#tools input[data-tool]")) {
    const tool = check.dataset.tool;
    const aliases = [...document.querySelectorAll("#tools input[data-alias]")]
      .filter((c) => c.dataset.ofTool === tool);
    const picked = aliases.filter((c) => c.checked).map((c) => c.dataset.alias);
    if (!check.checked) { everything = false; continue; }
    if (aliases.length && picked.length < aliases.length) {
      everything = false;
      names.push(...picked);
    } else {
      names.push(tool);
    }
  }
  return { names, everything };
}

// The preference features of tools or models not allowed now cannot be weighted.
function featureAllowed(feature) {
  if (!feature.startsWith("tool:")) return true;
  const name = feature.slice("tool:".length);
  const alias = document.querySelector(`#tools input[data-alias="${CSS.escape(name)}"]`);
  if (alias) return alias.checked;
  const tool = document.querySelector(`#tools input[data-tool="${CSS.escape(name)}"]`);
  return tool ? tool.checked : true;
}

function syncPreferenceRows() {
  for (const input of document.querySelectorAll("#preferences input[type=range]")) {
    input.disabled = !featureAllowed(input.dataset.feature);
  }
}

function applyInfo(info) {
  state.info = info;
  $("served").textContent = `Serving ${info.model}: up to ${count(info.limits.max_turns, "turn")}, `
    + `at most ${count(info.limits.max_concurrent, "request")} at once.`;
  const main = $("pref-main"), tools = $("pref-tools");
  main.textContent = "";
  tools.textContent = "";
  info.features.forEach((feature, i) => {
    sliderRow(BASE_FEATURES.includes(feature) ? main : tools, feature, i, info);
  });
  $("pref-tools-box").hidden = tools.childElementCount === 0;
  const turns = $("max-turns");
  turns.max = String(info.limits.max_turns);
  turns.value = String(info.defaults.max_turns);
  const cost = info.defaults.max_cost_usd;
  $("max-cost").value = cost === null || cost === undefined ? "" : String(cost);
  toolBoxes(info);
  syncPreferenceRows();
  $("preferences").disabled = false;
  $("budgets").disabled = false;
  $("submit").disabled = state.controller !== null; // a run in progress keeps it
}

async function loadInfo() {
  clearError();
  $("submit").disabled = true;
  state.info = null;
  state.loadedKey = $("api-key").value.trim();
  let response;
  try {
    response = await fetch("v1/orchestrator", { headers: headers(false) });
  } catch (err) {
    $("served").textContent = "The orchestrator's settings are not loaded.";
    showError(networkText("Loading the settings", err));
    return;
  }
  if (!response.ok) {
    $("served").textContent = "The orchestrator's settings are not loaded.";
    showError(await failureText(response, "Loading the settings"));
    return;
  }
  applyInfo(await response.json());
}

// ---- the request ---------------------------------------------------------------

function requestBody(question) {
  const body = {
    messages: [{ role: "user", content: question }],
    stream: true,
    stream_options: { include_usage: true },
  };
  const preference = {};
  for (const input of document.querySelectorAll("#preferences input[type=range]")) {
    if (!input.disabled) preference[input.dataset.feature] = Number(input.value);
  }
  body.preference = preference;
  const turns = $("max-turns").value.trim();
  if (turns) body.max_turns = Number(turns);
  const cost = $("max-cost").value.trim();
  if (cost) body.max_cost_usd = Number(cost);
  const allowed = allowedNames();
  if (!allowed.everything) body.allowed_tools = allowed.names;
  return body;
}

function resetRun() {
  $("steps").textContent = "";
  $("answer").textContent = "";
  $("summary").textContent = "";
  $("outcome").hidden = true;
  $("outcome").textContent = "";
  const table = $("calls");
  table.hidden = true;
  table.tBodies[0].textContent = "";
  table.tFoot.textContent = "";
}

function describeCall(step) {
  const what = step.tool === null || step.tool === undefined ? "(a call that did not parse)" : step.tool;
  return step.model ? `${what} → ${step.model}` : what;
}

function addStep(step) {
  const li = el("li", step.type);
  li.dataset.type = step.type;
  if (step.type === "turn") {
    li.textContent = `Turn ${step.turn + 1}: the orchestrator wrote ${count(step.completion_tokens, "token")} `
      + `(read ${step.prompt_tokens}) in ${seconds(step.latency_s)}; spent so far ${usd(step.cost_usd_so_far)}`;
  } else if (step.type === "call") {
    if (step.error) li.classList.add("failed");
    li.append(el("span", "what", describeCall(step)),
      ` ${usd(step.cost_usd)}, ${seconds(step.latency_s)}; spent so far ${usd(step.cost_usd_so_far)}`);
    const args = step.arguments ? JSON.stringify(step.arguments) : "";
    if (args) li.append(el("span", "detail", "arguments: " + args));
    li.append(el("span", "detail", step.error ? "error: " + step.error : "result: " + (step.result || "")));
  } else {
    li.textContent = JSON.stringify(step);
  }
  $("steps").append(li);
}

function cell(row, text, className, value) {
  const td = el("td", className, text);
  if (value !== undefined && value !== null) td.dataset.value = String(value);
  row.append(td);
  return td;
}

function finish(chunk) {
  const usage = chunk.usage || {};
  const orch = chunk.orchestration || {};
  const calls = usage.calls || [];
  const summary = $("summary");
  summary.textContent = "";
  const cost = el("strong", null, `Cost ${usd(usage.cost_usd)}`);
  cost.id = "total-cost";
  cost.dataset.value = String(usage.cost_usd);
  summary.append(cost, ` · latency ${seconds(usage.latency_s)} · ${count(orch.turns ?? 0, "turn")} · `
    + `${count(calls.length, "call")} · orchestrator tokens ${usage.prompt_tokens ?? "?"} read, `
    + `${usage.completion_tokens ?? "?"} written · stopped: ${orch.stop_reason ?? "?"}`);
  if (orch.error) {
    $("outcome").textContent = `A service failed (${orch.error.kind}`
      + (orch.error.endpoint ? `, ${orch.error.endpoint}` : "") + `): ${orch.error.message}`;
    $("outcome").hidden = false;
  } else if (orch.stop_reason && orch.stop_reason !== "answer") {
    $("outcome").textContent = `The episode stopped before an answer (${orch.stop_reason}).`;
    $("outcome").hidden = false;
  }
  const table = $("calls");
  const body = table.tBodies[0];
  calls.forEach((call, i) => {
    const row = el("tr", call.error ? "failed" : null);
    cell(row, i + 1, "num");
    cell(row, call.turn + 1, "num");
    cell(row, call.tool ?? "(unparsed)", "tool");
    cell(row, call.model ?? "–", "model");
    cell(row, usd(call.cost_usd), "num cost", call.cost_usd);
    cell(row, seconds(call.latency_s), "num latency", call.latency_s);
    cell(row, call.error ? "error: " + call.error : (call.result || ""), "result");
    body.append(row);
  });
  const foot = table.tFoot;
  const orchestrator = el("tr");
  cell(orchestrator, "", "");
  cell(orchestrator, "", "");
  cell(orchestrator, "orchestrator tokens", "");
  cell(orchestrator, "", "");
  cell(orchestrator, usd(orch.orchestrator_cost_usd), "num cost", orch.orchestrator_cost_usd);
  cell(orchestrator, "", "");
  cell(orchestrator, "", "");
  const total = el("tr", "total");
  cell(total, "", "");
  cell(total, "", "");
  cell(total, "total", "");
  cell(total, "", "");
  cell(total, usd(usage.cost_usd), "num cost", usage.cost_usd);
  cell(total, seconds(usage.latency_s), "num latency", usage.latency_s);
  cell(total, "", "");
  foot.append(orchestrator, total);
  table.hidden = false;
}

// Server-sent events from a byte stream: `data:` lines up to a blank line make one
// event; `onData` gets each event's data (the lines joined by "\n") until it returns
// false. The stream is read to its end (the server closes it after [DONE]).
async function readEvents(stream, onData) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  let listening = true;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (!listening) continue;
    buffer += value;
    let cut;
    while (listening && (cut = buffer.search(/\r\n|\r(?!$)|\n/)) >= 0) {
      const line = buffer.slice(0, cut);
      buffer = buffer.slice(cut + (buffer.startsWith("\r\n", cut) ? 2 : 1));
      if (line === "") {
        if (data.length && onData(data.join("\n")) === false) listening = false;
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      } // other fields (event:, id:, retry:) and comments (":") carry nothing here
    }
  }
  if (listening && data.length) onData(data.join("\n"));
}

async function ask(event) {
  event.preventDefault();
  if (!state.info) return;
  const question = $("question").value.trim();
  if (!question) {
    showError("Write a question first.");
    return;
  }
  clearError();
  resetRun();
  const controller = new AbortController();
  state.controller = controller;
  $("submit").disabled = true;
  $("stop").disabled = false;
  const started = performance.now();
  const status = $("status");
  status.textContent = "Asking…";
  let response;
  try {
    response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: headers(true),
      body: JSON.stringify(requestBody(question)),
      signal: controller.signal,
    });
  } catch (err) {
    if (controller.signal.aborted) status.textContent = "Stopped.";
    else {
      status.textContent = "";
      showError(networkText("Asking", err));
    }
    return done();
  }
  if (!response.ok) {
    status.textContent = "";
    showError(await failureText(response, "Asking"));
    return done();
  }
  let steps = 0, finished = false, closed = false;
  try {
    await readEvents(response.body, (data) => {
      if (data === "[DONE]") {
        closed = true;
        return false;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) {
        throw new Error(`the server reported an error mid-stream: ${chunk.error.message || JSON.stringify(chunk.error)}`);
      }
      if (chunk.orchestra_step) {
        steps += 1;
        addStep(chunk.orchestra_step);
        status.textContent = `${steps} steps, ${((performance.now() - started) / 1000).toFixed(1)} s…`;
      }
      const choice = (chunk.choices || [])[0];
      if (choice && choice.delta && choice.delta.content) {
        $("answer").append(choice.delta.content);
      }
      if (chunk.usage) {
        finished = true;
        finish(chunk);
      }
      return true;
    });
  } catch (err) {
    status.textContent = "";
    if (controller.signal.aborted) status.textContent = "Stopped.";
    else if (err instanceof TypeError) showError(networkText("Reading the answer", err));
    else showError(`Reading the answer: ${err.message}`);
    return done();
  }
  if (!finished || !closed) {
    status.textContent = "";
    showError("Reading the answer: the stream ended before the answer was complete "
      + "(the connection closed early).");
    return done();
  }
  status.textContent = `Answered in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
  return done();
}

function done() {
  state.controller = null;
  $("submit").disabled = !state.info;
  $("stop").disabled = true;
}

$("ask").addEventListener("submit", ask);
$("question").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !$("submit").disabled) $("ask").requestSubmit();
});
$("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
$("reload").addEventListener("click", loadInfo);
// A new key (Enter, or leaving the field) reloads the settings; the same key keeps
// the sliders as they are.
function keyChanged() {
  if (!state.info || $("api-key").value.trim() !== state.loadedKey) loadInfo();
}
$("api-key").addEventListener("change", keyChanged);
$("api-key").addEventListener("keydown", (e) => { if (e.key === "Enter") keyChanged(); });
$("pref-reset").addEventListener("click", resetPreferences);
loadInfo();
