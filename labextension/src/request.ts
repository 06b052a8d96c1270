/**
 * The `POST notebooks` body that submits a notebook as a batch job: one small pure function.
 * The server runs the notebook (parameters injected after the cell tagged `parameters`) and
 * writes the executed copy beside the input; a cron `at` stores a recurring definition.
 */
import { IJobPost, INotebookSubmission, IWindow } from './types';

/** When the job may start. */
export type When = { kind: 'now' } | { kind: 'tonight' } | { kind: 'cron'; expr: string };

/** What the submit dialog collects. */
export interface ISubmitInput {
  /** Notebook path relative to the server root, as the file browser names it. */
  path: string;
  gpus: number;
  /** GPU memory per GPU in GB, or null for whole GPUs. */
  gpuMemGb: number | null;
  parameters: Record<string, unknown>;
  when: When;
  /** Display name of the job (or schedule); null for the server's default. */
  name?: string | null;
  /** Stop the run after this many seconds; null for no limit. */
  maxRuntimeS?: number | null;
  /** Only GPUs of this model; null for any. */
  gpuModel?: string | null;
}

/** Thrown for input the request cannot express; the message says what to change. */
export class SubmitInputError extends Error {}

/** Five cron fields (`0 22 * * 1-5`) or an @-macro (`@daily`), as the server reads them. */
const CRON = /^(@[a-z]+|\S+(\s+\S+){4})$/;

/**
 * `tonight` for the dialog's label: the end of the window in force when it is not a night
 * window (the server decides the start itself; this only tells the user what to expect).
 */
export function tonightIso(window: IWindow | null, nowMs: number): string | null {
  if (!window || /night/i.test(window.name) || !window.until) {
    return null;
  }
  return Date.parse(window.until) > nowMs ? window.until : null;
}

/** The browser's IANA time zone (`Europe/Berlin`), or null where Intl does not say. */
export function browserTimezone(): string | null {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || null;
  } catch {
    return null;
  }
}

/**
 * The `POST notebooks` body for what the user chose.
 *
 * @param input what the user chose
 * @param timezone IANA zone a cron schedule is read in (the browser's), or null for the
 *   policy's zone; only sent with a cron, where it matters
 */
export function buildNotebookRequest(
  input: ISubmitInput,
  timezone: string | null
): INotebookSubmission {
  if (!input.path.endsWith('.ipynb')) {
    throw new SubmitInputError(`${input.path} is not a notebook (.ipynb)`);
  }
  checkSize(input);
  const body: INotebookSubmission = {
    notebook: input.path.replace(/^\/+/, ''),
    parameters: input.parameters,
    gpus: input.gpus,
    at: input.when.kind
  };
  if (input.gpuMemGb !== null && input.gpus > 0) {
    body.gpu_mem_gb = input.gpuMemGb;
  }
  if (input.name) {
    body.name = input.name;
  }
  if (input.maxRuntimeS) {
    body.max_runtime_s = input.maxRuntimeS;
  }
  if (input.gpuModel) {
    body.gpu_models = [input.gpuModel];
  }
  if (input.when.kind === 'cron') {
    const expr = input.when.expr.trim().replace(/\s+/g, ' ');
    if (!CRON.test(expr)) {
      throw new SubmitInputError(
        'repeat needs a cron expression of five fields (minute hour day month weekday), ' +
          'e.g. 0 22 * * 1-5 for 22:00 on weekdays'
      );
    }
    body.at = expr;
    if (timezone) {
      body.timezone = timezone;
    }
  }
  return body;
}

/** What the "Submit script" dialog collects. */
export interface IScriptInput {
  /** The script, relative to the server root, as the file browser names it. */
  path: string;
  /** The script's own arguments. */
  args: string[];
  env: Record<string, string>;
  gpus: number;
  gpuMemGb: number | null;
  name?: string | null;
  maxRuntimeS?: number | null;
  gpuModel?: string | null;
}

/**
 * The `POST jobs` body that runs a Python script: the server stages the file into the job's
 * own directory on the node (nodes need not share this file system) and runs its copy there.
 */
export function buildScriptRequest(input: IScriptInput): IJobPost {
  const path = input.path.trim().replace(/^\/+/, '');
  if (!path.endsWith('.py')) {
    throw new SubmitInputError(`${path || 'the script'} is not a Python script (.py)`);
  }
  checkSize(input);
  const file = path.split('/').pop()!;
  const body: IJobPost = {
    kind: 'script',
    command: ['python3', file, ...input.args],
    files: [path],
    name: input.name || file,
    gpus: input.gpus
  };
  if (input.gpuMemGb !== null) {
    body.gpu_mem_gb = input.gpuMemGb;
  }
  if (input.maxRuntimeS) {
    body.max_runtime_s = input.maxRuntimeS;
  }
  if (input.gpuModel) {
    body.gpu_models = [input.gpuModel];
  }
  if (Object.keys(input.env).length) {
    body.env = input.env;
  }
  return body;
}

/** The checks both dialogs share: GPUs, runtime and memory the request can express. */
function checkSize(input: Pick<IScriptInput, 'gpus' | 'gpuMemGb' | 'maxRuntimeS'>): void {
  if (!Number.isInteger(input.gpus) || input.gpus < 1 || input.gpus > 64) {
    throw new SubmitInputError('GPUs must be a whole number from 1 to 64');
  }
  if (input.maxRuntimeS !== undefined && input.maxRuntimeS !== null && !(input.maxRuntimeS > 0)) {
    throw new SubmitInputError('max runtime must be more than 0, e.g. 2h or 90m, or left empty');
  }
  if (input.gpuMemGb !== null && !(input.gpuMemGb > 0)) {
    throw new SubmitInputError('GPU memory must be more than 0 GB, or left empty for whole GPUs');
  }
}

/**
 * A command line's arguments as a POSIX shell splits them: by spaces, with '…' and "…"
 * keeping spaces and \ escaping one character. No variables or globs: nothing is expanded.
 */
export function splitArgs(text: string): string[] {
  const out: string[] = [];
  let word: string | null = null;
  let quote: string | null = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote) {
      if (c === quote) {
        quote = null;
      } else if (c === '\\' && quote === '"' && i + 1 < text.length) {
        word += text[++i];
      } else {
        word += c;
      }
    } else if (c === "'" || c === '"') {
      quote = c;
      word = word ?? '';
    } else if (c === '\\' && i + 1 < text.length) {
      word = (word ?? '') + text[++i];
    } else if (/\s/.test(c)) {
      if (word !== null) {
        out.push(word);
      }
      word = null;
    } else {
      word = (word ?? '') + c;
    }
  }
  if (quote) {
    throw new SubmitInputError(`arguments: close the ${quote} you opened`);
  }
  if (word !== null) {
    out.push(word);
  }
  return out;
}

/**
 * `NAME=VALUE` lines as [name, value] pairs (blank and `#` lines skipped); a line
 * without a valid name throws `refusal(lineNumber)`.
 */
function nameValueLines(text: string, refusal: (line: number) => string): [string, string][] {
  const out: [string, string][] = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) {
      return;
    }
    const eq = line.indexOf('=');
    const name = eq < 0 ? '' : line.slice(0, eq).trim();
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
      throw new SubmitInputError(refusal(i + 1));
    }
    out.push([name, line.slice(eq + 1)]);
  });
  return out;
}

/** `NAME=VALUE` lines into the job's environment (values are kept as written). */
export function parseEnv(text: string): Record<string, string> {
  return Object.fromEntries(
    nameValueLines(text, n => `environment line ${n}: write NAME=VALUE, e.g. STEPS=20`)
  );
}

/**
 * Read `name=value` lines into parameters; values parse as JSON when they can
 * (`lr=0.1` is a number, `tags=["a"]` a list) and stay strings otherwise.
 */
export function parseParameters(text: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const refusal = (n: number) => `line ${n}: write parameters as name=value, e.g. lr=0.1`;
  for (const [name, raw] of nameValueLines(text, refusal)) {
    const value = raw.trim();
    try {
      out[name] = JSON.parse(value);
    } catch {
      out[name] = value;
    }
  }
  return out;
}

/** A Python literal as the dialog writes it: strings unquoted, True/False/None as JSON. */
function dialogValue(literal: string): string {
  const quoted = /^(['"])(.*)\1$/.exec(literal);
  if (quoted && !quoted[2].includes(quoted[1])) {
    return quoted[2];
  }
  const words: Record<string, string> = { True: 'true', False: 'false', None: 'null' };
  return words[literal] ?? literal;
}

/**
 * The `name=value` lines of a notebook's `parameters` cell (papermill's convention: the code
 * cell tagged `parameters`), for the dialog to start from; '' when it has none. Only simple
 * assignments are read (`lr = 0.1  # comment`); anything else in the cell is left out.
 */
export function parametersFromNotebook(notebook: unknown): string {
  const cells = (notebook as { cells?: unknown[] } | null)?.cells ?? [];
  for (const raw of cells) {
    const cell = raw as { cell_type?: string; metadata?: { tags?: string[] }; source?: unknown };
    if (cell.cell_type !== 'code' || !cell.metadata?.tags?.includes('parameters')) {
      continue;
    }
    const source = Array.isArray(cell.source) ? cell.source.join('') : String(cell.source ?? '');
    const lines: string[] = [];
    for (const line of source.split(/\r?\n/)) {
      const m = /^([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]+)?=\s*(.+?)\s*(#.*)?$/.exec(line);
      if (m) {
        lines.push(`${m[1]}=${dialogValue(m[2])}`);
      }
    }
    return lines.join('\n');
  }
  return '';
}
