// The API as the console calls it: the tab's bearer token, JSON, and an event stream read
// through fetch (EventSource cannot send an Authorization header).
"use strict";

const TOKEN_KEY = "agent-server-console-token";
// The API's root: the directory the page is served from (`/console` -> `/`), so a server
// mounted under a prefix (root path) is called under it too.
const ROOT = new URL(".", document.baseURI);

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

/** The token kept for this tab (sessionStorage), "" for none given, null before asking. */
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function keepToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra) {
  const all = Object.assign({}, extra || {});
  const kept = token();
  if (kept) {
    all.Authorization = "Bearer " + kept;
  }
  return all;
}

/** A path of the API as an absolute URL on this origin (never carrying the token). */
export function url(path, query) {
  const target = new URL(path.replace(/^\//, ""), ROOT);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") {
      target.searchParams.append(name, String(value));
    }
  }
  return target;
}

/** `{status, body, headers}` of a JSON call; Unauthorized on 401, ApiError on another 4xx/5xx. */
export async function call(method, path, { query, body, signal } = {}) {
  const init = { method, headers: headers({ Accept: "application/json" }), cache: "no-store", signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(url(path, query), init);
  if (response.status === 401) {
    throw new Unauthorized("the token was refused");
  }
  const text = await response.text();
  let parsed = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch (error) {
      parsed = text;
    }
  }
  if (response.status >= 400) {
    throw new ApiError(response.status, parsed && parsed.detail !== undefined ? parsed.detail : parsed);
  }
  return { status: response.status, body: parsed, headers: response.headers };
}

/** The cursor of the next page, from a `Link: <...?cursor=X>; rel="next"` header. */
export function nextCursor(response) {
  const link = response.headers.get("Link");
  if (!link) {
    return null;
  }
  const match = /<([^>]*)>\s*;\s*rel="next"/.exec(link);
  if (!match) {
    return null;
  }
  return new URL(match[1], ROOT).searchParams.get("cursor");
}

/**
 * Follow `GET /executions/{id}/events` until it ends or `signal` aborts: `onEvent({id,
 * event, data})` for each event (data parsed as JSON), `event: end` included. A stream cut
 * with a `retry:` hint (shutdown, a hand-off) is read again after the last event seen,
 * a bounded number of times.
 */
export async function followEvents(executionId, onEvent, signal) {
  let after = 0;
  for (let round = 0; round < 30 && !signal.aborted; round += 1) {
    let ended = false;
    try {
      const response = await fetch(url(`executions/${encodeURIComponent(executionId)}/events`, { after }), {
        headers: headers({ Accept: "text/event-stream" }),
        cache: "no-store",
        signal,
      });
      if (response.status === 401) {
        throw new Unauthorized("the token was refused");
      }
      if (!response.ok || !response.body) {
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          break;
        }
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const event = parseBlock(block);
          if (event === null) {
            continue;
          }
          if (event.id !== null) {
            after = event.id;
          }
          if (event.event === "end") {
            ended = true;
          }
          onEvent(event);
        }
      }
    } catch (error) {
      if (signal.aborted || error instanceof Unauthorized) {
        throw error;
      }
    }
    if (ended) {
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function parseBlock(block) {
  let id = null;
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":") || line === "") {
      continue;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") {
      id = Number(value);
    } else if (field === "event") {
      event = value;
    } else if (field === "data") {
      data.push(value);
    }
  }
  if (!data.length) {
    return null;
  }
  let parsed = data.join("\n");
  try {
    parsed = JSON.parse(parsed);
  } catch (error) {
    // shown as the text it is
  }
  return { id, event, data: parsed };
}
