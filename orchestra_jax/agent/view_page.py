"""The HTML, CSS and script of the trajectory viewer page (see `agent/view.py`).

`__TITLE__` and `__DATA__` (a JSON list of episodes) are filled in by
`view.build_page`. The script builds every element with `textContent`, so model
text can never inject markup.
"""

PAGE_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }
#side { width: 40%; overflow: auto; border-right: 1px solid #ccc; padding: 8px; box-sizing: border-box; }
#main { flex: 1; overflow: auto; padding: 8px 16px; }
#filters { display: flex; gap: 8px; flex-wrap: wrap; margin-bottom: 8px; align-items: center; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #eee; padding: 2px 6px; text-align: left; white-space: nowrap; }
tr.ep { cursor: pointer; } tr.ep:hover { background: #f3f6ff; } tr.sel { background: #dde6ff; }
.good { color: #1a7f37; } .bad { color: #c62828; }
pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; font: 12px/1.35 ui-monospace, monospace; }
.turn { border: 1px solid #ddd; border-radius: 6px; margin: 8px 0; padding: 6px 10px; }
.call { background: #fff8e1; border-left: 3px solid #f0b400; padding: 2px 6px; margin: 4px 0; }
.result { background: #eef7ee; border-left: 3px solid #4caf50; padding: 2px 6px; margin: 4px 0; }
.result.err, .call.err { background: #fdecea; border-left-color: #c62828; }
.seq span { white-space: pre-wrap; font: 12px/1.5 ui-monospace, monospace; }
.trained { background: #d7f5dd; border-bottom: 2px solid #2e7d32; }
.masked { color: #666; background: #f1f1f1; }
.legend span { padding: 0 6px; margin-right: 8px; }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: 0 12px; }
</style></head><body>
<div id="side">
  <h3>__TITLE__</h3>
  <div id="filters">
    <label>source <select id="f-step"><option value="">all</option></select></label>
    <label>task <input id="f-task" size="12" placeholder="id contains"></label>
    <label>reward &ge; <input id="f-reward" size="5" placeholder="any"></label>
    <span id="count"></span>
  </div>
  <table><thead><tr><th>source</th><th>task</th><th>g</th><th>reward</th><th>correct</th>
  <th>finish</th><th>turns</th><th>cost $</th><th>latency s</th></tr></thead>
  <tbody id="rows"></tbody></table>
</div>
<div id="main"><p>Select an episode.</p></div>
<script>
const EPISODES = __DATA__;
const $ = (id) => document.getElementById(id);
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
const fmt = (x, d) => (x === null || x === undefined) ? "–" : Number(x).toFixed(d);
function visible() {
  const step = $("f-step").value, task = $("f-task").value.trim(), r = $("f-reward").value.trim();
  return EPISODES.filter((e) => (step === "" || e.source === step)
    && (task === "" || e.task_id.includes(task))
    && (r === "" || (e.reward !== null && e.reward >= Number(r))));
}
function drawList() {
  const body = $("rows"); body.textContent = "";
  const shown = visible();
  $("count").textContent = shown.length + " / " + EPISODES.length + " episodes";
  for (const e of shown) {
    const tr = el("tr", "ep");
    const cells = [e.source, e.task_id, e.group_index, fmt(e.reward, 3),
      e.correct === null ? "–" : (e.correct ? "yes" : "no"), e.finish_reason,
      e.turns.length, fmt(e.cost_usd, 5), fmt(e.latency_s, 1)];
    cells.forEach((c, i) => {
      const td = el("td", i === 4 ? (e.correct ? "good" : "bad") : "", c);
      tr.appendChild(td);
    });
    tr.onclick = () => { document.querySelectorAll("tr.sel").forEach((x) => x.classList.remove("sel"));
      tr.classList.add("sel"); drawEpisode(e); };
    body.appendChild(tr);
  }
}
function kv(pairs) {
  const d = el("div", "kv");
  for (const [k, v] of pairs) { d.appendChild(el("b", "", k)); d.appendChild(el("span", "", v)); }
  return d;
}
function drawEpisode(e) {
  const m = $("main"); m.textContent = "";
  m.appendChild(el("h3", "", e.task_id + " · sample " + e.group_index + " · " + e.source));
  m.appendChild(kv([
    ["final answer", e.final_answer === null ? "–" : e.final_answer],
    ["correct / reward / advantage", [e.correct, fmt(e.reward, 4), fmt(e.advantage, 4)].join(" / ")],
    ["finish / format valid", e.finish_reason + " / " + e.format_valid],
    ["infrastructure failure (not trained)", e.infra_failure === null ? "–" : e.infra_failure],
    ["cost $ (tools + orchestrator)", fmt(e.cost_usd, 6) + " = " + fmt(e.tool_cost_usd, 6) + " + " + fmt(e.orchestrator_cost_usd, 6)],
    ["latency s", fmt(e.latency_s, 2)],
    ["tokens (trained)", e.num_tokens + " (" + e.num_trained + ")"],
    ["tool calls", JSON.stringify(e.tool_call_counts)],
    ["preference", JSON.stringify(e.preference)],
    ["seed / metadata", e.seed + " " + JSON.stringify(e.metadata)],
  ]));
  m.appendChild(el("h4", "", "Turns"));
  e.turns.forEach((t, i) => {
    const box = el("div", "turn");
    box.appendChild(el("b", "", "turn " + (i + 1) + " · " + t.tokens + " tokens · " + t.finish
      + (t.format_valid ? "" : " · INVALID FORMAT") + " · gen " + fmt(t.generation_latency_s, 2)
      + " s · tools " + fmt(t.tool_latency_s, 2) + " s"));
    box.appendChild(el("pre", "trained", t.text));
    for (const c of t.calls) {
      box.appendChild(el("div", "call" + (c.error ? " err" : ""), c.error ? "invalid call: " + c.error
        : c.name + " " + JSON.stringify(c.arguments) + (c.feature ? "  [" + c.feature + "]" : "")));
    }
    for (const r of t.results) {
      const d = el("div", "result" + (r.error ? " err" : ""));
      d.appendChild(el("small", "", "$" + fmt(r.cost_usd, 6) + " · " + fmt(r.latency_s, 2) + " s"));
      d.appendChild(el("pre", "", r.text));
      box.appendChild(d);
    }
    if (!t.results.length && t.observation) {  // e.g. the "no tool call" error message
      box.appendChild(el("div", "result err", "observation:"));
      box.appendChild(el("pre", "masked", t.observation));
    }
    m.appendChild(box);
  });
  m.appendChild(el("h4", "", "Sequence"));
  const legend = el("div", "legend");
  legend.appendChild(el("span", "trained", "trained (loss mask 1)"));
  legend.appendChild(el("span", "masked", "masked (loss mask 0)"));
  m.appendChild(legend);
  const seq = el("div", "seq");
  for (const s of e.spans) {
    const sp = el("span", s.trained ? "trained" : "masked", s.text);
    sp.title = s.tokens + " tokens, " + (s.trained ? "trained" : "masked");
    seq.appendChild(sp);
  }
  m.appendChild(seq);
}
const sources = [];  // in file order: steps ascending, then other files
for (const e of EPISODES) { if (!sources.includes(e.source)) sources.push(e.source); }
for (const s of sources) { const o = el("option", "", s); o.value = s; $("f-step").appendChild(o); }
["f-step", "f-task", "f-reward"].forEach((id) => $(id).addEventListener("input", drawList));
drawList();
if (EPISODES.length) { document.querySelector("tr.ep").click(); }
</script></body></html>
"""
