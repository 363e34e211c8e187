// A form made from a request's JSON schema: each property a labelled field of its kind.
// Booleans are checkboxes, numbers and integers number inputs, strings text, enums a
// select, objects a nested fieldset, arrays of scalars a list (one value a line); anything
// else a JSON text area. `read()` gives the value typed as the schema says.
"use strict";

import { h } from "./views.js";

let counter = 0;

function fieldId() {
  counter += 1;
  return `answer-field-${counter}`;
}

/** The schema `$ref` names, resolved against the root's `$defs` (pydantic's form). */
function resolve(schema, root) {
  let found = schema || {};
  for (let depth = 0; depth < 20 && found && typeof found.$ref === "string"; depth += 1) {
    const name = found.$ref.split("/").pop();
    found = (root.$defs || root.definitions || {})[name] || {};
  }
  if (found && Array.isArray(found.allOf) && found.allOf.length === 1) {
    return resolve(found.allOf[0], root);
  }
  return found || {};
}

function kindOf(schema) {
  if (Array.isArray(schema.enum) && schema.enum.length) {
    return "enum";
  }
  if (schema.const !== undefined) {
    return "const";
  }
  const type = Array.isArray(schema.type) ? schema.type.filter((t) => t !== "null") : [schema.type];
  if (type.length !== 1) {
    return "json";
  }
  return type[0] || "json";
}

function scalar(kind) {
  return kind === "string" || kind === "number" || kind === "integer" || kind === "boolean";
}

/** `{element, read}` for `schema` under the label `name`. */
export function build(schema, name, root, depth = 0) {
  const resolved = resolve(schema, root);
  const kind = depth > 8 ? "json" : kindOf(resolved);
  const id = fieldId();
  if (kind === "object" && resolved.properties) {
    const fieldset = h("fieldset", { class: "object" }, h("legend", {}, name));
    const readers = {};
    for (const [property, sub] of Object.entries(resolved.properties)) {
      const part = build(sub, property, root, depth + 1);
      fieldset.append(part.element);
      readers[property] = part.read;
    }
    return {
      element: fieldset,
      read() {
        const value = {};
        for (const [property, read] of Object.entries(readers)) {
          const got = read();
          if (got !== undefined) {
            value[property] = got;
          }
        }
        return value;
      },
    };
  }
  const label = h("label", { for: id }, name);
  const wrap = h("div", { class: "field" }, label);
  if (kind === "boolean") {
    const box = h("input", { id, type: "checkbox", name });
    box.checked = resolved.default === true;
    wrap.append(box);
    return { element: wrap, read: () => box.checked };
  }
  if (kind === "number" || kind === "integer") {
    const input = h("input", { id, type: "number", name, step: kind === "integer" ? "1" : "any" });
    if (typeof resolved.default === "number") {
      input.value = String(resolved.default);
    }
    wrap.append(input);
    return {
      element: wrap,
      read() {
        if (input.value.trim() === "") {
          return undefined;
        }
        return kind === "integer" ? parseInt(input.value, 10) : Number(input.value);
      },
    };
  }
  if (kind === "string") {
    const input = h("input", { id, type: "text", name });
    if (typeof resolved.default === "string") {
      input.value = resolved.default;
    }
    wrap.append(input);
    return { element: wrap, read: () => input.value };
  }
  if (kind === "enum" || kind === "const") {
    const choices = kind === "enum" ? resolved.enum : [resolved.const];
    const select = h("select", { id, name });
    choices.forEach((choice, index) => {
      const option = h("option", { value: String(index) }, JSON.stringify(choice));
      select.append(option);
    });
    wrap.append(select);
    return { element: wrap, read: () => choices[Number(select.value)] };
  }
  if (kind === "array") {
    const items = resolve(resolved.items || {}, root);
    const itemKind = kindOf(items);
    if (scalar(itemKind)) {
      const area = h("textarea", { id, name, "aria-describedby": id + "-hint" });
      wrap.append(area, h("div", { class: "hint", id: id + "-hint" }, `one ${itemKind} a line`));
      return {
        element: wrap,
        read() {
          const lines = area.value.split("\n").filter((line) => line.trim() !== "");
          return lines.map((line) => {
            if (itemKind === "integer") return parseInt(line, 10);
            if (itemKind === "number") return Number(line);
            if (itemKind === "boolean") return line.trim() === "true";
            return line;
          });
        },
      };
    }
  }
  const area = h("textarea", { id, name, "aria-describedby": id + "-hint" });
  area.value = resolved.default !== undefined ? JSON.stringify(resolved.default) : "";
  wrap.append(area, h("div", { class: "hint", id: id + "-hint" }, "JSON"));
  return {
    element: wrap,
    read() {
      const text = area.value.trim();
      return text === "" ? null : JSON.parse(text);
    },
  };
}

/** The form of a pending request: `onAnswer(value)` when Answer is pressed. */
export function requestForm(request, onAnswer) {
  const schema = request.schema;
  const form = h("form", { class: "answer", "aria-label": "Answer the request" });
  let part;
  if (schema && typeof schema === "object") {
    part = build(schema, schema.title || "answer", schema);
  } else {
    part = build({}, "answer (JSON)", {});
  }
  form.append(part.element, h("button", { type: "submit" }, "Answer"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    let value;
    try {
      value = part.read();
    } catch (error) {
      onAnswer(undefined, error);
      return;
    }
    onAnswer(value, null);
  });
  return form;
}
