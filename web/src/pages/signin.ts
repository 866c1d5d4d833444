// Sign in by pasting an API token; it is checked against the server before it is stored.

import { ApiError, api, setToken } from "../api";
import { h } from "../dom";
import { type Scope, errorText } from "../scope";

export function renderSignIn(root: HTMLElement, _scope: Scope): void {
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "paste your API token",
  });
  const message = h("p", { class: "form-error", role: "alert" });
  const button = h("button", { class: "primary", type: "submit" }, "Sign in");

  const form = h(
    "form",
    { class: "signin-card card" },
    h("h1", {}, h("span", { class: "logo" }), "Trainyard"),
    h("p", { class: "muted" }, "Training as a service. Sign in with an API token."),
    h("label", { for: "token" }, "API token"),
    input,
    message,
    button,
    h(
      "p",
      { class: "hint" },
      "On your own machine, ",
      h("code", {}, "make run"),
      " (or ",
      h("code", {}, "trainyard up"),
      ") prints the dashboard address and the local admin token; it is also in ",
      h("code", {}, "stack.json"),
      " in the data directory.",
    ),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) {
      message.textContent = "Paste a token first.";
      return;
    }
    button.disabled = true;
    message.textContent = "";
    try {
      await api.probe(token);
      setToken(token);
      const next = sessionStorage.getItem("trainyard.after-signin");
      sessionStorage.removeItem("trainyard.after-signin");
      location.hash = next && !next.startsWith("#/signin") ? next : "#/jobs";
    } catch (error) {
      message.textContent =
        error instanceof ApiError && error.status === 401
          ? "This token was not accepted."
          : `Could not reach the server: ${errorText(error)}`;
    } finally {
      button.disabled = false;
    }
  });
  root.classList.add("signin");
  root.append(form);
  input.focus();
}
