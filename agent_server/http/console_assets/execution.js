// One execution: its record, its attempts as a picture, its events live, the form of a
// pending request for input, Cancel and Run again.
//
// The picture is drawn from the record (its creation, latest attempt and end) and its history
// (`GET /executions/{id}/history`: every claim, hand-off, retry, requeue, park and answer
// between, kept by the store), so a page opened at any time draws every attempt. Run again
// starts from the input the server kept (`GET /executions/{id}/input`), in a field that
// stays editable.
"use strict";

import { Unauthorized, call, followEvents } from "./api.js";
import { requestForm } from "./schema_form.js";
import { h, isTerminal, start, statusBadge, svg } from "./views.js";

const RECORD_POLL_MS = 2000;

function time(text) {
  return text ? Date.parse(text) : null;
}

/** What each kept move says of the attempt it leaves (GET /executions/{id}/history). */
const LEFT = {
  retry: "retried",
  hand_off: "handed off",
  requeue: "requeued (its replica stopped)",
  park: "parked",
};
/** The moves drawn as marks across the picture: waits for input and their ends. */
const MARKED = { ask: "asked", park: "parked", answer: "answered", expire: "expired", resume: "resumed" };

/** The attempts as rows (number, replica, version, start, end, and what ended each), from
 * the record (its creation, its latest attempt, its end) and its history (every move
 * between). A history keeps the last moves only: attempts before those show no start. */
function attemptsOf(record, moves) {
  const rows = new Map();
  const row = (n) => {
    if (!rows.has(n)) rows.set(n, { n, replica: null, version: null, start: null, end: null, notes: [] });
    return rows.get(n);
  };
  const first = moves.length ? moves[0] : null;
  const createdQueued = first !== null && first.move === "claim" && first.attempt === 1;
  // A history that still holds attempt 1's first move (or none): attempt 1 began at the
  // creation, unless it was created queued (then at its claim).
  const complete = first === null || first.attempt === 1;
  if (complete && !createdQueued) row(1).start = time(record.created_at);
  for (const move of moves) {
    const at = time(move.at);
    const r = row(move.attempt);
    if (move.move === "claim") {
      r.start = at;
      r.replica = move.replica;
    } else if (move.move in LEFT) {
      r.end = at;
      if (move.replica) r.replica = move.replica;
      r.version = move.version;
      r.notes.push(LEFT[move.move]);
    } else if (move.move === "ask" && move.replica) {
      r.replica = move.replica;
    }
  }
  const last = row(record.attempt);
  last.replica = record.replica || last.replica;
  if (record.version !== null && record.version !== undefined) last.version = record.version;
  last.end = time(record.finished_at);
  if (isTerminal(record.status)) last.notes.push(record.status);
  if (record.status === "queued") last.notes.push("queued");
  if (record.status === "input_required" && !record.replica) last.notes.push("parked");
  return [...rows.values()].sort((a, b) => a.n - b.n);
}

function clock(ms) {
  return ms === null ? "unknown" : new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

/** The picture: one bar per attempt on a time axis, waits for input and their ends marked. */
function timeline(record, rows, moves) {
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
    group.append(svg("text", { x: 4, y: y + 27, class: "small replica" }, row.replica ? `replica ${row.replica}` : "no replica"));
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
  for (const move of moves) {
    const label = MARKED[move.move];
    const at = time(move.at);
    if (label === undefined || at === null || at < t0) continue;
    const mx = x(at);
    picture.append(svg("line", { class: "mark", x1: mx, x2: mx, y1: 20, y2: height - 4 }, svg("title", {}, `${label} at ${clock(at)}`)));
    picture.append(svg("text", { x: mx + 3, y: height - 4, class: "small" }, label));
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
          h("td", { class: "mono" }, row.replica || ""),
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
  let moves = [];
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
    const rows = attemptsOf(record, moves);
    pictureBox.replaceChildren(h("h3", { id: "timeline-heading" }, "Attempts"), timeline(record, rows, moves), attemptsTable(rows));
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
    const [answer, kept] = await Promise.all([
      call("GET", `executions/${encodeURIComponent(id)}`),
      call("GET", `executions/${encodeURIComponent(id)}/history`).catch((error) => {
        if (error instanceof Unauthorized) throw error;
        return { body: [] };  // forgotten between the two reads: the record says so next
      }),
    ]);
    if (!ctx.current()) return;
    record = answer.body;
    moves = Array.isArray(kept.body) ? kept.body : [];
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
      if (event.event === "input_required") refresh().catch(ctx.report);
      const data = typeof event.data === "string" ? event.data : JSON.stringify(event.data);
      events.append(h("li", { "data-event": event.event }, h("span", { class: "mono" }, event.id === null ? "" : `#${event.id} `), h("strong", {}, event.event), " ", h("code", {}, data)));
    },
    ctx.signal,
  );
  reading.catch((error) => {
    if (!ctx.signal.aborted) ctx.report(error);
  });
}
