// The console's entry: the token, kept for the tab, and the views by the URL's hash
// (`#/executions`, `#/executions/{id}`, `#/schedules`, `#/replicas`), so a reload keeps both.
"use strict";

import { ApiError, Unauthorized, forgetToken, keepToken, token } from "./api.js";
import { executionView } from "./execution.js";
import { executionsView, replicasView, schedulesView } from "./views.js";

const main = document.getElementById("view");
const form = document.getElementById("token-form");
const notice = document.getElementById("notice");
let generation = 0;
let running = null;

function say(text, error) {
  notice.textContent = text;
  notice.className = error ? "error" : "";
}

function report(error) {
  if (error instanceof Unauthorized) {
    ask("The server refused the token: give another.");
  } else if (error instanceof ApiError) {
    say(`${error.status}: ${error.message}`, true);
  } else if (error && error.name !== "AbortError") {
    say(String(error && error.message ? error.message : error), true);
  }
}

function ask(text) {
  stop();
  forgetToken();
  main.replaceChildren();
  form.hidden = false;
  say(text || "", Boolean(text));
  document.getElementById("token").focus();
}

function stop() {
  generation += 1;
  if (running) {
    running.abort();
    running = null;
  }
}

/** What a view gets: whether it is still the one shown, timers and streams that stop with
 * it, and how to run an action and show its refusal. */
function context() {
  const mine = generation;
  const controller = new AbortController();
  running = controller;
  const current = () => mine === generation;
  return {
    signal: controller.signal,
    current,
    report,
    every(ms, work) {
      const tick = async () => {
        if (!current()) return;
        try {
          await work();
        } catch (error) {
          report(error);
        }
        if (current()) setTimeout(tick, ms);
      };
      setTimeout(tick, ms);
    },
    async act(work, then) {
      say("");
      try {
        await work();
        if (then && current()) await then();
      } catch (error) {
        report(error);
      }
    },
  };
}

async function route() {
  stop();
  if (token() === null) {
    ask("");
    return;
  }
  form.hidden = true;
  say("");
  const hash = location.hash.replace(/^#/, "") || "/executions";
  const [path, query] = hash.split("?");
  const parts = path.split("/").filter(Boolean);
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.getAttribute("href") === "#/" + (parts[0] || "executions")) {
      link.setAttribute("aria-current", "page");
    } else {
      link.removeAttribute("aria-current");
    }
  }
  main.replaceChildren();
  const ctx = context();
  try {
    if (parts[0] === "executions" && parts[1]) {
      await executionView(main, decodeURIComponent(parts[1]), ctx);
    } else if (parts[0] === "schedules") {
      await schedulesView(main, ctx);
    } else if (parts[0] === "replicas") {
      await replicasView(main, ctx);
    } else {
      await executionsView(main, new URLSearchParams(query || ""), ctx);
    }
  } catch (error) {
    report(error);
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const field = document.getElementById("token");
  keepToken(field.value.trim());
  field.value = "";
  route();
});
document.getElementById("forget-token").addEventListener("click", () => ask("Token forgotten."));
window.addEventListener("hashchange", route);
route();
