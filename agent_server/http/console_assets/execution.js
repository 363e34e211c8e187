// One execution: its record, its attempts as a picture, its events live, the form of a
// pending request for input, Cancel and Run again.
//
// The record keeps the latest attempt only (number, replica, version): the picture is drawn
// from it, from its `input_required` events, and from what this tab saw while the page was
// open (kept for the tab); attempts before those are drawn without a replica ("not
// recorded"). Run again starts from the input the server kept
// (`GET /executions/{id}/input`), in a field that stays editable.
"use strict";

import { Unauthorized, call, followEvents } from "./api.js";
import { requestForm } from "./schema_form.js";
import { h, isTerminal, start, statusBadge, svg } from "./views.js";

const SEEN_KEY = "agent-server-console-attempts";
const RECORD_POLL_MS = 2000;

function seenOf(id) {
  const all = JSON.parse(sessionStorage.getItem(SEEN_KEY) || "{}");
  return all[id] || { attempts: {}, parked: [], answered: {} };
}

function keepSeen(id, seen) {
  const all = JSON.parse(sessionStorage.getItem(SEEN_KEY) || "{}");
  all[id] = seen;
  const ids = Object.keys(all);
  for (const old of ids.slice(0, Math.max(0, ids.length - 50))) delete all[old];
  sessionStorage.setItem(SEEN_KEY, JSON.stringify(all));
}

/** What this tab learns from a read of the record: the attempt it shows, its replica and
 * version, when it was first seen, and whether it is parked (waiting, owned by nobody). */
function observe(seen, record) {
  const now = Date.now();
  const key = String(record.attempt);
  const known = seen.attempts[key] || { first: now };
  if (record.replica) known.replica = record.replica;
  if (record.version !== null && record.version !== undefined) known.version = record.version;
  known.last = now;
  seen.attempts[key] = known;
  if (record.status === "input_required" && !record.replica && !seen.parked.includes(record.attempt)) {
    seen.parked.push(record.attempt);
  }
}

function time(text) {
  return text ? Date.parse(text) : null;
}

/** The attempts as rows: number, replica, version, start, end, and what happened at its end. */
function attemptsOf(record, seen, asks) {
  const rows = [];
  const created = time(record.scheduled_at) || time(record.created_at);
  const finished = time(record.finished_at);
  for (let n = 1; n <= record.attempt; n += 1) {
    const saw = seen.attempts[String(n)];
    const row = { n, replica: null, version: null, start: null, end: null, notes: [] };
    if (saw) {
      row.replica = saw.replica || null;
      row.version = saw.version === undefined ? null : saw.version;
      row.start = n === 1 ? created : saw.first;
    } else if (n === 1) {
      row.start = created;
    }
    if (n === record.attempt) {
      row.replica = record.replica || row.replica;
      row.version = record.version === undefined ? row.version : record.version;
      row.end = finished;
      if (isTerminal(record.status)) row.notes.push(record.status);
    } else {
      row.notes.push(seen.parked.includes(n) ? "parked, then resumed" : "hand-off or retry");
    }
    if (seen.parked.includes(n)) row.notes.push("parked");
    rows.push(row);
  }
  for (let i = 0; i < rows.length - 1; i += 1) {
    if (rows[i].end === null && rows[i + 1].start !== null) rows[i].end = rows[i + 1].start;
  }
  return rows;
}

function clock(ms) {
  return ms === null ? "unknown" : new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

/** The picture: one bar per attempt on a time axis, asks and answers marked. */
function timeline(record, rows, asks) {
  const width = 760;
  const left = 250;
  const rowHeight = 34;
  const height = 30 + rows.length * rowHeight;
  const created = time(record.created_at);
  const end = time(record.finished_at) || Date.now();
  const t0 = Math.min(created, ...rows.map((r) => r.start).filter((t) => t !== null));
  const span = Math.max(1, end - t0);
  const x = (t) => left + ((t - t0) / span) * (width - left - 20);
  const picture = svg("svg", {
    class: "timeline",
    id: "timeline",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-labelledby": "timeline-title",
  });
  picture.append(svg("title", { id: "timeline-title" }, `Attempts of execution ${record.execution_id}`));
  picture.append(svg("text", { x: left, y: 14, class: "small" }, clock(t0)));
  picture.append(svg("text", { x: width - 20, y: 14, class: "small", "text-anchor": "end" }, isTerminal(record.status) ? clock(end) : "now"));
  rows.forEach((row, index) => {
    const y = 24 + index * rowHeight;
    const group = svg("g", { class: "attempt", "data-attempt": row.n });
    group.append(svg("text", { x: 4, y: y + 13 }, `attempt ${row.n}`));
    group.append(svg("text", { x: 4, y: y + 27, class: "small replica" }, row.replica ? `replica ${row.replica}` : "replica not recorded"));
    group.append(svg("text", { x: 150, y: y + 13, class: "small" }, row.version === null || row.version === undefined ? "unversioned" : `version ${row.version}`));
    const from = row.start === null ? (index === 0 ? t0 : null) : row.start;
    const to = row.end === null ? (isTerminal(record.status) ? end : Date.now()) : row.end;
    const start = from === null ? left + ((width - left - 20) * index) / rows.length : x(from);
    const stop = Math.max(start + 3, from === null ? start + (width - left - 20) / rows.length : x(Math.min(to, end)));
    const kind = row.n < record.attempt ? "earlier" : isTerminal(record.status) ? "ended" : "running";
    const bar = svg("rect", { class: `bar ${kind}`, x: start, y: y + 2, width: stop - start, height: 16 });
    bar.append(svg("title", {}, `attempt ${row.n}: ${clock(from)} to ${row.end === null && !isTerminal(record.status) ? "now" : clock(to)}; ${row.notes.join(", ")}`));
    group.append(bar);
    group.append(svg("text", { x: start, y: y + 30, class: "small" }, row.notes.join(", ")));
    picture.append(group);
  });
  for (const ask of asks) {
    const at = time(ask.asked_at);
    if (at === null) continue;
    const mx = x(at);
    picture.append(svg("line", { class: "mark", x1: mx, x2: mx, y1: 20, y2: height - 4 }, svg("title", {}, `asked request ${ask.request_id}`)));
    picture.append(svg("text", { x: mx + 3, y: height - 4, class: "small" }, `asked #${ask.request_id}${ask.answered ? ", answered" : ""}`));
  }
  return picture;
}

function attemptsTable(rows) {
  return h(
    "table",
    { id: "attempts" },
    h("thead", {}, h("tr", {}, ["attempt", "replica", "version", "start", "end", "then"].map((name) => h("th", { scope: "col" }, name)))),
    h(
      "tbody",
      {},
      rows.map((row) =>
        h(
          "tr",
          {},
          h("td", {}, `attempt ${row.n}`),
          h("td", { class: "mono" }, row.replica || "not recorded"),
          h("td", {}, row.version === null || row.version === undefined ? "unversioned" : row.version),
          h("td", {}, clock(row.start)),
          h("td", {}, row.end === null ? "" : clock(row.end)),
          h("td", {}, row.notes.join(", ")),
        ),
      ),
    ),
  );
}

const SHOWN = [
  "reasoner", "session_id", "status_reason", "created_at", "scheduled_at", "finished_at",
  "duration_seconds", "attempt", "replica", "version", "schedule_id", "owner", "tenant",
];

function recordList(record) {
  const list = h("dl", { class: "record", id: "record" });
  list.append(h("dt", {}, "execution_id"), h("dd", { class: "mono" }, record.execution_id));
  list.append(h("dt", {}, "status"), h("dd", { id: "record-status" }, statusBadge(record.status)));
  for (const name of SHOWN) {
    const value = record[name];
    if (value === null || value === undefined) continue;
    list.append(h("dt", {}, name), h("dd", { "data-field": name }, value === null || value === undefined ? "" : String(value)));
  }
  return list;
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

export async function executionView(main, id, ctx) {
  const seen = seenOf(id);
  const asks = new Map();
  const events = h("ol", { id: "events", "aria-live": "polite" });
  const top = h("div");
  const eventsSection = h("section", { "aria-labelledby": "events-title" }, h("h3", { id: "events-title" }, "Events"), events);
  main.append(h("h2", {}, "Execution ", h("span", { class: "mono" }, id)), top, eventsSection);
  let record = null;
  let formFor = null;
  const actions = h("div", { class: "actions" });
  const requestBox = h("section", { id: "request", "aria-labelledby": "request-title" });
  const pictureBox = h("section", { "aria-labelledby": "timeline-heading" });
  const recordBox = h("section");
  const resultBox = h("section");
  top.append(recordBox, pictureBox, actions, requestBox, resultBox);

  const cancel = h("button", { type: "button", id: "cancel" }, "Cancel");
  cancel.addEventListener("click", () => ctx.act(() => call("POST", `executions/${encodeURIComponent(id)}/cancel`), refresh));
  const rerunInput = h("textarea", { id: "rerun-input", name: "rerun-input" });
  const rerun = h("button", { type: "button", id: "run-again" }, "Run again");
  rerun.addEventListener("click", () =>
    ctx.act(async () => {
      const execution = await start(record.reasoner, JSON.parse(rerunInput.value));
      location.hash = `#/executions/${encodeURIComponent(execution.execution_id)}`;
    }),
  );
  const rerunHint = h("div", { class: "hint", id: "rerun-hint" });
  rerunInput.setAttribute("aria-describedby", "rerun-hint");
  actions.append(cancel, h("div", { class: "field" }, h("label", { for: "rerun-input" }, "Input to run again with (JSON)"), rerunInput, rerunHint), rerun);

  const draw = () => {
    recordBox.replaceChildren(recordList(record));
    cancel.hidden = isTerminal(record.status);
    const rows = attemptsOf(record, seen, [...asks.values()]);
    pictureBox.replaceChildren(h("h3", { id: "timeline-heading" }, "Attempts"), timeline(record, rows, [...asks.values()]), attemptsTable(rows));
    resultBox.replaceChildren();
    if (record.result !== null && record.result !== undefined) {
      resultBox.append(h("h3", {}, "Result"), h("pre", { id: "result" }, json(record.result)));
    }
    if (record.error) {
      resultBox.append(h("h3", {}, "Error"), h("pre", { id: "error" }, json(record.error)));
    }
    const pending = record.status === "input_required" ? record.input_request : null;
    if (!pending) {
      requestBox.replaceChildren();
      formFor = null;
    } else if (formFor !== pending.request_id) {
      formFor = pending.request_id;
      const form = requestForm(pending, (value, error) => {
        if (error) {
          ctx.report(error);
          return;
        }
        ctx.act(() => call("POST", `executions/${encodeURIComponent(id)}/input`, { body: { request_id: pending.request_id, value } }), refresh);
      });
      requestBox.replaceChildren(
        h("h3", { id: "request-title" }, `Request ${pending.request_id} waits for an answer`),
        h("pre", { id: "prompt" }, json(pending.prompt)),
        h("p", { class: "hint" }, pending.expires_at ? `expires at ${pending.expires_at}` : "no time limit"),
        form,
      );
    }
  };

  const refresh = async () => {
    const answer = await call("GET", `executions/${encodeURIComponent(id)}`);
    if (!ctx.current()) return;
    record = answer.body;
    observe(seen, record);
    for (const ask of asks.values()) {
      if (!record.input_request || record.input_request.request_id !== ask.request_id || record.status !== "input_required") {
        ask.answered = true;
      }
    }
    keepSeen(id, seen);
    draw();
  };

  await refresh();
  try {
    const kept = await call("GET", `executions/${encodeURIComponent(id)}/input`);
    rerunInput.value = JSON.stringify(kept.body);
    rerunHint.textContent = kept.body === null ? "It was started with no input." : "The input it was started with.";
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    rerunInput.value = "{}";
    rerunHint.textContent = `Its input could not be read (${error.message}): give it.`;
  }
  ctx.every(RECORD_POLL_MS, async () => {
    if (!isTerminal(record.status)) await refresh();
  });
  const reading = followEvents(
    id,
    (event) => {
      if (!ctx.current()) return;
      if (event.event === "end") {
        refresh().catch(ctx.report);
        return;
      }
      if (event.event === "input_required" && event.data && typeof event.data === "object") {
        asks.set(event.data.request_id, { request_id: event.data.request_id, asked_at: event.data.asked_at, answered: false });
        refresh().catch(ctx.report);
      }
      const data = typeof event.data === "string" ? event.data : JSON.stringify(event.data);
      events.append(h("li", { "data-event": event.event }, h("span", { class: "mono" }, event.id === null ? "" : `#${event.id} `), h("strong", {}, event.event), " ", h("code", {}, data)));
    },
    ctx.signal,
  );
  reading.catch((error) => {
    if (!ctx.signal.aborted) ctx.report(error);
  });
}
