// The console's views but one execution's (execution.js): the executions list, the
// schedules, the replicas. Every value is written with text nodes, never as markup.
"use strict";

import { call, nextCursor } from "./api.js";

export const STATUSES = ["queued", "running", "input_required", "succeeded", "failed", "cancelled", "lost"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "lost"]);
//: How often an open list looks again (a bounded poll of the page it shows: no list stream).
export const POLL_MS = 2000;

export function isTerminal(status) {
  return TERMINAL.has(status);
}

/** An element with attributes and children (strings become text nodes, never markup). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element, the same way. */
export function svg(tag, attrs, ...children) {
  return fill(document.createElementNS("http://www.w3.org/2000/svg", tag), attrs, children);
}

function fill(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined && value !== false) {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

export function statusBadge(status) {
  return h("span", { class: `status status-${STATUSES.includes(status) ? status : "other"}` }, status);
}

export function executionLink(id) {
  return h("a", { href: `#/executions/${encodeURIComponent(id)}`, class: "mono", title: id }, id.slice(0, 8));
}

/** Start `reasoner` with `input` in the background; the new execution. */
export async function start(reasoner, input, sessionId) {
  const answer = await call("POST", `reasoners/${encodeURIComponent(reasoner)}/async`, { body: input });
  return answer.body;
}

function labelled(label, control) {
  return h("div", {}, h("label", { for: control.id }, label), control);
}

// -- the executions list -------------------------------------------------------------------

export async function executionsView(main, query, ctx) {
  const filters = h("form", { class: "filters", "aria-label": "Filters" });
  const status = h("select", { id: "filter-status", name: "status" }, h("option", { value: "" }, "any"));
  for (const name of STATUSES) status.append(h("option", { value: name }, name));
  status.value = query.get("status") || "";
  const reasoner = h("input", { id: "filter-reasoner", name: "reasoner", type: "text", size: 14 });
  reasoner.value = query.get("reasoner") || "";
  const session = h("input", { id: "filter-session", name: "session_id", type: "text", size: 14 });
  session.value = query.get("session_id") || "";
  const schedule = h("input", { id: "filter-schedule", name: "schedule_id", type: "text", size: 14 });
  schedule.value = query.get("schedule_id") || "";
  const since = h("input", { id: "filter-since", name: "since", type: "datetime-local", step: 1 });
  since.value = query.get("since") || "";
  filters.append(
    labelled("Status", status),
    labelled("Reasoner", reasoner),
    labelled("Session", session),
    labelled("Schedule", schedule),
    labelled("Created since (UTC)", since),
    h("button", { type: "submit" }, "Apply"),
  );
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [name, control] of [["status", status], ["reasoner", reasoner], ["session_id", session], ["schedule_id", schedule], ["since", since]]) {
      if (control.value.trim()) next.set(name, control.value.trim());
    }
    location.hash = "#/executions" + (next.toString() ? "?" + next : "");
  });

  const body = h("tbody", { id: "executions-rows" });
  const table = h(
    "table",
    { id: "executions" },
    h("caption", { class: "hint" }, "Newest first; this page updates every 2 s."),
    h("thead", {}, h("tr", {}, ["id", "reasoner", "status", "created", "attempt", "replica", "session", "schedule"].map((name) => h("th", { scope: "col" }, name)))),
    body,
  );
  const paging = h("div", { class: "paging" });
  main.append(h("h2", {}, "Executions"), filters, await startForm(ctx), table, paging);

  const rows = new Map();
  const sinceTime = since.value ? Date.parse(since.value + "Z") : null;
  const cursor = query.get("cursor");
  const refresh = async () => {
    const answer = await call("GET", "executions", {
      query: {
        status: query.get("status"),
        reasoner: query.get("reasoner"),
        session_id: query.get("session_id"),
        schedule_id: query.get("schedule_id"),
        cursor,
        limit: 50,
      },
    });
    if (!ctx.current()) return;
    let shown = answer.body;
    let older = false;
    if (sinceTime !== null) {
      shown = shown.filter((execution) => Date.parse(execution.created_at) >= sinceTime);
      older = shown.length < answer.body.length;
    }
    place(body, rows, shown);
    paging.replaceChildren();
    if (cursor) {
      const first = new URLSearchParams(query);
      first.delete("cursor");
      paging.append(h("a", { href: "#/executions" + (first.toString() ? "?" + first : "") }, "First page"));
    }
    const following = older ? null : nextCursor(answer);
    if (following) {
      const next = new URLSearchParams(query);
      next.set("cursor", following);
      paging.append(h("a", { href: "#/executions?" + next, id: "next-page" }, "Next page"));
    }
    if (!shown.length) {
      paging.append(h("span", { class: "hint" }, "No execution here."));
    }
  };
  await refresh();
  ctx.every(POLL_MS, refresh);
}

/** The rows of `executions`, in order, reusing a row per id (focus stays where it is). */
function place(body, rows, executions) {
  const wanted = new Set(executions.map((execution) => execution.execution_id));
  for (const [id, row] of rows) {
    if (!wanted.has(id)) {
      row.remove();
      rows.delete(id);
    }
  }
  let before = body.firstChild;
  for (const execution of executions) {
    let row = rows.get(execution.execution_id);
    if (!row) {
      row = h("tr", { "data-id": execution.execution_id });
      rows.set(execution.execution_id, row);
    }
    const cells = [
      executionLink(execution.execution_id),
      execution.reasoner,
      statusBadge(execution.status),
      execution.created_at,
      String(execution.attempt),
      execution.replica || "",
      execution.session_id || "",
      execution.schedule_id || "",
    ];
    const text = JSON.stringify([execution.status, execution.attempt, execution.replica]);
    if (row.dataset.shown !== text) {
      const focused = row.contains(document.activeElement);
      row.replaceChildren(...cells.map((cell) => h("td", {}, cell)));
      row.dataset.shown = text;
      if (focused) row.querySelector("a").focus();
    }
    if (row === before) {
      before = row.nextSibling;
    } else {
      body.insertBefore(row, before);
    }
  }
}

async function startForm(ctx) {
  const details = h("details", { id: "start" }, h("summary", {}, "Start an execution"));
  const reasoner = h("select", { id: "start-reasoner", name: "reasoner" });
  try {
    const answer = await call("GET", "reasoners");
    for (const found of answer.body) reasoner.append(h("option", { value: found.name }, found.name));
  } catch (error) {
    ctx.report(error);
  }
  const input = h("textarea", { id: "start-input", name: "input" });
  input.value = "{}";
  const form = h("form", { "aria-label": "Start an execution" }, labelled("Reasoner", reasoner), labelled("Input (JSON)", input), h("button", { type: "submit" }, "Start"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const execution = await start(reasoner.value, JSON.parse(input.value));
      location.hash = `#/executions/${encodeURIComponent(execution.execution_id)}`;
    } catch (error) {
      ctx.report(error);
    }
  });
  details.append(form);
  return details;
}

// -- schedules -------------------------------------------------------------------------------

export async function schedulesView(main, ctx) {
  const body = h("tbody", { id: "schedule-rows" });
  main.append(
    h("h2", {}, "Schedules"),
    h(
      "table",
      { id: "schedules" },
      h("thead", {}, h("tr", {}, ["id", "reasoner", "cron", "zone", "enabled", "next fire", "last firing", "actions"].map((name) => h("th", { scope: "col" }, name)))),
      body,
    ),
  );
  const refresh = async () => {
    let answer;
    try {
      answer = await call("GET", "schedules");
    } catch (error) {
      if (error.status === 404) {
        body.replaceChildren(h("tr", {}, h("td", { colspan: 8 }, "This server has no schedules.")));
        return;
      }
      throw error;
    }
    const rows = [];
    for (const schedule of answer.body.slice(0, 100)) {
      const last = await call("GET", "executions", { query: { schedule_id: schedule.schedule_id, limit: 1 } });
      const firing = last.body[0];
      const toggle = h("button", { type: "button" }, schedule.enabled ? "Disable" : "Enable");
      toggle.addEventListener("click", () => ctx.act(() => call("PATCH", `schedules/${encodeURIComponent(schedule.schedule_id)}`, { body: { enabled: !schedule.enabled } }), refresh));
      const trigger = h("button", { type: "button" }, "Trigger");
      trigger.addEventListener("click", () => ctx.act(() => call("POST", `schedules/${encodeURIComponent(schedule.schedule_id)}/trigger`), refresh));
      rows.push(
        h(
          "tr",
          { "data-id": schedule.schedule_id },
          h("td", { class: "mono" }, schedule.schedule_id),
          h("td", {}, schedule.reasoner),
          h("td", { class: "mono" }, schedule.cron),
          h("td", {}, schedule.timezone),
          h("td", {}, schedule.enabled ? "yes" : "no"),
          h("td", {}, schedule.next_fire_at || "none"),
          h("td", {}, firing ? [executionLink(firing.execution_id), " ", statusBadge(firing.status)] : "none yet"),
          h("td", { class: "actions" }, toggle, trigger),
        ),
      );
    }
    if (!ctx.current()) return;
    const focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement.closest("tr").dataset.id + ":" + document.activeElement.textContent : null;
    body.replaceChildren(...rows);
    if (focused) {
      for (const button of body.querySelectorAll("button")) {
        if (button.closest("tr").dataset.id + ":" + button.textContent === focused) button.focus();
      }
    }
  };
  await refresh();
  ctx.every(5000, refresh);
}

// -- replicas --------------------------------------------------------------------------------

export async function replicasView(main, ctx) {
  const body = h("tbody", { id: "replica-rows" });
  main.append(
    h("h2", {}, "Replicas"),
    h(
      "table",
      { id: "replicas" },
      h("caption", { class: "hint" }, "Updated every second; another replica's figures are as of its last renewal."),
      h("thead", {}, h("tr", {}, ["replica", "versions", "state", "in flight", "phase", "deadline in"].map((name) => h("th", { scope: "col" }, name)))),
      body,
    ),
  );
  const refresh = async () => {
    const answer = await call("GET", "replicas");
    if (!ctx.current()) return;
    body.replaceChildren(
      ...answer.body.map((replica) =>
        h(
          "tr",
          { "data-id": replica.replica_id },
          h("td", { class: "mono" }, replica.replica_id, replica.answering ? " (answering)" : ""),
          h("td", {}, (replica.versions || []).map((v) => (v === null ? "unversioned" : v)).join(", ") || "unknown"),
          h("td", { class: "state" }, replica.draining ? "draining" : replica.admitting ? "admitting" : "not admitting"),
          h("td", { class: "in-flight" }, replica.in_flight === null ? "unknown" : String(replica.in_flight)),
          h("td", { class: "phase" }, replica.phase || "unknown"),
          h("td", { class: "deadline" }, replica.deadline_seconds === null || replica.deadline_seconds === undefined ? "" : `${replica.deadline_seconds.toFixed(1)} s`),
        ),
      ),
    );
  };
  await refresh();
  ctx.every(1000, refresh);
}
