// The YAML editor: CodeMirror 6 with YAML highlighting, server-side validation as a linter, and
// each problem's message written at the end of its line (not only in a hover tooltip).

import { yaml } from "@codemirror/lang-yaml";
import { type Diagnostic, lintGutter, linter, setDiagnosticsEffect } from "@codemirror/lint";
import { EditorState, type Extension, RangeSetBuilder, StateField, type Text } from "@codemirror/state";
import { Decoration, type DecorationSet, EditorView, WidgetType } from "@codemirror/view";
import { basicSetup } from "codemirror";

import type { SpecIssue } from "../api";

/** The New job page's document, kept across visits; "Edit a copy" of a job writes it too. */
export const DRAFT_KEY = "trainyard.draft";

/** Where a located issue sits in the document: its column to the end of its line. */
export function issueToDiagnostic(doc: Text, issue: SpecIssue): Diagnostic {
  const lineNumber = Math.min(Math.max(issue.line ?? 1, 1), doc.lines);
  const line = doc.line(lineNumber);
  const column = Math.max((issue.column ?? 1) - 1, 0);
  let from = Math.min(line.from + column, line.to);
  // An issue at the end of a line (or an empty one) still needs something to underline.
  if (from === line.to && line.length > 0) from = line.from;
  const where = issue.line === null ? `${issue.path}: ` : "";
  const hint = issue.hint ? `\nhint: ${issue.hint}` : "";
  return {
    from,
    to: line.to,
    severity: "error",
    source: issue.path,
    message: `${where}${issue.message}${hint}`,
  };
}

class LineMessage extends WidgetType {
  constructor(
    readonly text: string,
    readonly className = "cm-line-message",
  ) {
    super();
  }

  eq(other: LineMessage): boolean {
    return other.text === this.text && other.className === this.className;
  }

  toDOM(): HTMLElement {
    const span = document.createElement("span");
    span.className = this.className;
    span.textContent = this.text;
    return span;
  }
}

/** A line of a read-only document marked with a note at its end (a job's overrides). */
export interface LineMark {
  line: number;
  note: string;
}

function markedLines(doc: Text, marks: readonly LineMark[]): DecorationSet {
  const builder = new RangeSetBuilder<Decoration>();
  const byLine = new Map<number, string[]>();
  for (const mark of marks) {
    if (mark.line < 1 || mark.line > doc.lines) continue;
    byLine.set(mark.line, [...(byLine.get(mark.line) ?? []), mark.note]);
  }
  for (const number of [...byLine.keys()].sort((a, b) => a - b)) {
    const line = doc.line(number);
    builder.add(line.from, line.from, Decoration.line({ class: "cm-marked-line" }));
    const note = new LineMessage((byLine.get(number) ?? []).join(" · "), "cm-line-mark");
    builder.add(line.to, line.to, Decoration.widget({ widget: note, side: 1 }));
  }
  return builder.finish();
}

function lineMessages(doc: Text, diagnostics: readonly Diagnostic[]): DecorationSet {
  const byLine = new Map<number, string[]>();
  for (const d of diagnostics) {
    const line = doc.lineAt(Math.min(d.from, doc.length)).number;
    const first = d.message.split("\n")[0];
    byLine.set(line, [...(byLine.get(line) ?? []), first]);
  }
  const builder = new RangeSetBuilder<Decoration>();
  for (const number of [...byLine.keys()].sort((a, b) => a - b)) {
    const line = doc.line(number);
    builder.add(line.from, line.from, Decoration.line({ class: "cm-error-line" }));
    const text = (byLine.get(number) ?? []).join(" · ");
    builder.add(line.to, line.to, Decoration.widget({ widget: new LineMessage(text), side: 1 }));
  }
  return builder.finish();
}

// Follows the lint results: rebuilt when new diagnostics arrive, moved along with edits between.
const lineMessageField = StateField.define<DecorationSet>({
  create: () => Decoration.none,
  update(decorations, tr) {
    for (const effect of tr.effects) {
      if (effect.is(setDiagnosticsEffect)) return lineMessages(tr.state.doc, effect.value);
    }
    return decorations.map(tr.changes);
  },
  provide: (field) => EditorView.decorations.from(field),
});

export interface EditorOptions {
  doc: string;
  readOnly?: boolean;
  onChange?: (text: string) => void;
  /** Checks the document; its located issues become error markers. */
  check?: (text: string) => Promise<SpecIssue[]>;
  /** Lines of a read-only document to mark, each with its note. */
  marks?: readonly LineMark[];
}

export function yamlEditor(parent: HTMLElement, options: EditorOptions): EditorView {
  const extensions: Extension[] = [basicSetup, yaml(), EditorView.lineWrapping];
  if (options.readOnly) {
    extensions.push(EditorState.readOnly.of(true), EditorView.editable.of(false));
    const marks = options.marks ?? [];
    if (marks.length > 0) {
      extensions.push(EditorView.decorations.of((view) => markedLines(view.state.doc, marks)));
    }
  }
  if (options.onChange) {
    const onChange = options.onChange;
    extensions.push(
      EditorView.updateListener.of((update) => {
        if (update.docChanged) onChange(update.state.doc.toString());
      }),
    );
  }
  if (options.check) {
    const check = options.check;
    extensions.push(
      linter(
        async (view) => {
          const doc = view.state.doc;
          const issues = await check(doc.toString());
          return issues.map((issue) => issueToDiagnostic(doc, issue));
        },
        { delay: 500 },
      ),
      lintGutter(),
      lineMessageField,
    );
  }
  return new EditorView({ parent, doc: options.doc, extensions });
}

/** Replaces the whole document (an example picked from the list). */
export function setText(view: EditorView, text: string): void {
  view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
}

/** Puts the cursor on a line and scrolls it into view. */
export function goToLine(view: EditorView, lineNumber: number): void {
  const line = view.state.doc.line(Math.min(Math.max(lineNumber, 1), view.state.doc.lines));
  view.dispatch({ selection: { anchor: line.from }, scrollIntoView: true });
  view.focus();
}
