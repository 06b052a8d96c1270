/**
 * The request that submits a notebook as a batch job: one small pure function.
 *
 * Until the server runs notebook jobs itself, the notebook is executed as a script job by
 * `jupyter nbconvert --execute` (or papermill, when parameters are given), writing
 * `<name>-<timestamp>.ipynb` beside the input. When notebook jobs land, set
 * {@link NOTEBOOK_JOBS} to true: the same input then becomes `{"kind": "notebook", ...}`.
 */
import { IJobSpec, IWindow } from './types';

/** Whether the server runs `kind: "notebook"` jobs (the batch-notebook backend). */
export const NOTEBOOK_JOBS = false;

/** When the job may start. */
export type When = { kind: 'now' } | { kind: 'tonight' } | { kind: 'cron'; expr: string };

/** What the submit dialog collects. */
export interface ISubmitInput {
  /** Notebook path relative to the server root, as the file browser names it. */
  path: string;
  /** Absolute server root directory ('' if unknown: paths then stay relative). */
  serverRoot: string;
  gpus: number;
  /** GPU memory per GPU in GB, or null for whole GPUs. */
  gpuMemGb: number | null;
  parameters: Record<string, unknown>;
  when: When;
}

/** Thrown for input the request cannot express; the message says what to change. */
export class SubmitInputError extends Error {}

/** `YYYYMMDD-HHMMSS` in UTC: sortable, and safe in a file name. */
export function timestamp(nowMs: number): string {
  return new Date(nowMs)
    .toISOString()
    .replace(/\.\d+Z$/, '')
    .replace(/[-:]/g, '')
    .replace('T', '-');
}

function joinPath(root: string, path: string): string {
  if (!root) {
    return path;
  }
  return `${root.replace(/\/+$/, '')}/${path.replace(/^\/+/, '')}`;
}

function dirname(path: string): string {
  const i = path.lastIndexOf('/');
  return i <= 0 ? (i === 0 ? '/' : '') : path.slice(0, i);
}

/** `tonight`: the start of the next window when the current one is not a night window. */
export function tonightIso(window: IWindow | null, nowMs: number): string | null {
  if (!window || /night/i.test(window.name) || !window.until) {
    return null;
  }
  return Date.parse(window.until) > nowMs ? window.until : null;
}

/**
 * The JobSpec JSON (without `user`: the server sets it) for submitting a notebook.
 *
 * @param input what the user chose
 * @param nowMs the current time (names the output notebook)
 * @param window the policy window in force (for "tonight")
 */
export function buildNotebookJob(
  input: ISubmitInput,
  nowMs: number,
  window: IWindow | null
): IJobSpec {
  if (!input.path.endsWith('.ipynb')) {
    throw new SubmitInputError(`${input.path} is not a notebook (.ipynb)`);
  }
  if (!Number.isInteger(input.gpus) || input.gpus < 0) {
    throw new SubmitInputError('GPUs must be a whole number, 0 or more');
  }
  if (input.gpuMemGb !== null && !(input.gpuMemGb > 0)) {
    throw new SubmitInputError('GPU memory must be more than 0 GB, or left empty for whole GPUs');
  }
  const abs = joinPath(input.serverRoot, input.path);
  const stem = input.path
    .split('/')
    .pop()!
    .replace(/\.ipynb$/, '');
  const outName = `${stem}-${timestamp(nowMs)}.ipynb`;
  const spec: IJobSpec = { kind: 'script', name: `${stem}.ipynb`, gpus: input.gpus };
  if (input.gpuMemGb !== null && input.gpus > 0) {
    spec.gpu_mem_gb = input.gpuMemGb;
  }
  if (input.serverRoot) {
    spec.workdir = dirname(abs);
  }
  if (input.when.kind === 'tonight') {
    const at = tonightIso(window, nowMs);
    if (at) {
      spec.not_before = at;
    }
  }
  if (NOTEBOOK_JOBS) {
    return {
      ...spec,
      kind: 'notebook',
      notebook: abs,
      parameters: input.parameters,
      ...(input.when.kind === 'cron' ? { labels: { cron: input.when.expr } } : {})
    };
  }
  if (input.when.kind === 'cron') {
    throw new SubmitInputError(
      'repeating runs (cron) need the server\'s notebook jobs; choose "now" or "tonight"'
    );
  }
  const hasParams = Object.keys(input.parameters).length > 0;
  spec.command = hasParams
    ? ['papermill', abs, joinPath(dirname(abs), outName), '-y', JSON.stringify(input.parameters)]
    : ['jupyter', 'nbconvert', '--to', 'notebook', '--execute', '--output', outName, abs];
  return spec;
}

/**
 * Read `name=value` lines into parameters; values parse as JSON when they can
 * (`lr=0.1` is a number, `tags=["a"]` a list) and stay strings otherwise.
 */
export function parseParameters(text: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) {
      return;
    }
    const eq = line.indexOf('=');
    const name = eq < 0 ? '' : line.slice(0, eq).trim();
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
      throw new SubmitInputError(`line ${i + 1}: write parameters as name=value, e.g. lr=0.1`);
    }
    const value = line.slice(eq + 1).trim();
    try {
      out[name] = JSON.parse(value);
    } catch {
      out[name] = value;
    }
  });
  return out;
}
