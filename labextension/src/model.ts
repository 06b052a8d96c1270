/**
 * Pure view models of the panel: what each GPU cell and queue row shows.
 *
 * No DOM, no network, no clock (the time is passed in), so every rule here is unit-tested.
 */
import { GPU_STATE_COLOURS, GPU_STATE_LABELS, GpuState, isGpuState } from './colors';
import {
  clockLabel,
  startLabel,
  gpusLabel as formatGpus,
  memoryLabel,
  percent,
  positionLabel,
  runtimeLabel,
  scheduleLine,
  windowLine as formatWindowLine
} from './format';
import { outputNotebook } from './reducer';
import { IArrayView, ICluster, IDefinition, IGpu, IJob, IJobSpec, INode, JobState } from './types';

/** What one GPU cell of the map shows. */
export interface IGpuCell {
  key: string;
  state: GpuState;
  colour: string;
  /** Used share of the GPU's memory, 0-100 (drawn as a fill from the bottom). */
  memFillPct: number;
  label: string;
  /** Hover text: node, GPU, model, state, memory, utilisation, holders. */
  title: string;
  /** Ids of the jobs holding (part of) it: hovering highlights their GPUs, a click opens one. */
  jobs: number[];
}

/** One node row of the map. */
export interface INodeRow {
  name: string;
  up: boolean;
  summary: string;
  error: string | null;
  cells: IGpuCell[];
}

/**
 * The state a cell is drawn in: a GPU of a node that does not answer is down whatever it last
 * reported, unless a job still holds it (a suspect node's jobs keep their GPUs).
 */
export function gpuState(gpu: IGpu, nodeUp: boolean): GpuState {
  if (!nodeUp && !(gpu.jobs ?? []).length) {
    return 'down';
  }
  return isGpuState(gpu.state) ? gpu.state : 'foreign';
}

/** Used memory as a percentage of the total, clamped to 0-100 (0 when the total is unknown). */
export function memFillPct(gpu: Pick<IGpu, 'mem_used_gb' | 'mem_total_gb'>): number {
  if (!(gpu.mem_total_gb > 0) || !(gpu.mem_used_gb > 0)) {
    return 0;
  }
  return Math.min(100, Math.max(0, Math.round((100 * gpu.mem_used_gb) / gpu.mem_total_gb)));
}

/** The view model of one GPU cell. */
export function gpuCell(node: Pick<INode, 'name' | 'up'>, gpu: IGpu): IGpuCell {
  const state = gpuState(gpu, node.up);
  const lines = [
    `${node.name} GPU ${gpu.index} · ${gpu.model} · ${GPU_STATE_LABELS[state]}`,
    `memory ${memoryLabel(gpu.mem_used_gb, gpu.mem_total_gb)}` +
      (gpu.util_pct !== null && gpu.util_pct !== undefined
        ? ` · util ${percent(gpu.util_pct / 100)}`
        : '')
  ];
  for (const job of gpu.jobs ?? []) {
    const share = job.share < 1 ? ` (${percent(job.share)} share)` : '';
    lines.push(`job #${job.id} · ${job.user} · ${job.kind}${share}`);
  }
  const jobs = (gpu.jobs ?? []).map(j => j.id);
  if (jobs.length) {
    lines.push(`click: open job #${jobs[0]}'s page`);
  }
  return {
    key: `${node.name}/${gpu.index}`,
    state,
    colour: GPU_STATE_COLOURS[state],
    memFillPct: memFillPct(gpu),
    label: String(gpu.index),
    title: lines.join('\n'),
    jobs
  };
}

/** The map's rows, one per node, in the server's order. */
export function nodeRows(cluster: ICluster): INodeRow[] {
  const nowMs = Date.parse(cluster.at);
  return cluster.nodes.map(node => {
    const cells = node.gpus.map(gpu => gpuCell(node, gpu));
    const free = cells.filter(c => c.state === 'free').length;
    const model = node.gpus[0]?.model ?? 'no GPUs';
    return {
      name: node.name,
      up: node.up,
      summary: node.up ? `${free}/${cells.length} free · ${model}` : healthLabel(node, nowMs),
      error: node.error,
      cells
    };
  });
}

/** Why a node that does not answer is drawn so: suspect (jobs kept until when) or down. */
export function healthLabel(
  node: Pick<INode, 'health' | 'unreachable_since' | 'down_at'>,
  nowMs: number
): string {
  if (node.health === 'suspect' && node.unreachable_since && node.down_at) {
    const since = clockLabel(node.unreachable_since, nowMs);
    return `unreachable since ${since} · jobs kept until ${clockLabel(node.down_at, nowMs)}`;
  }
  return 'down';
}

/** Seconds a job has run (until it finished, or until `nowMs`); null if it never started. */
export function runtimeS(
  job: Pick<IJob, 'started_at' | 'finished_at'>,
  nowMs: number
): number | null {
  if (!job.started_at) {
    return null;
  }
  const start = Date.parse(job.started_at);
  const end = job.finished_at ? Date.parse(job.finished_at) : nowMs;
  return Math.max(0, (end - start) / 1000);
}

/** A short display name: the given name, else the notebook or the command's script. */
export function jobName(job: Pick<IJob, 'spec'>): string {
  const spec = job.spec;
  if (spec.name) {
    return spec.name;
  }
  if (spec.notebook) {
    return basename(spec.notebook);
  }
  if (spec.command && spec.command.length > 0) {
    // `python train.py` and `jupyter nbconvert ... nb.ipynb` both read best by their file.
    const file = [...spec.command].reverse().find(a => /\.(ipynb|py|sh)$/.test(a));
    return basename(file ?? spec.command.join(' '));
  }
  return spec.kind;
}

function basename(path: string): string {
  const parts = path.split('/');
  return parts[parts.length - 1] || path;
}

/** What one queue row shows. */
export interface IQueueRow {
  id: number;
  name: string;
  user: string;
  kind: string;
  state: JobState;
  /** `3rd in line` while queued, else empty. */
  position: string;
  /** While queued: `starts in 12m (14:05) at the latest`, `starts any moment`, `starts unknown`. */
  eta: string;
  /** What the expected start rests on, in words (the API's `estimate.note`), else empty. */
  etaNote: string;
  /** The note, shown under the row, where a guess or nothing decides the start (the nudge). */
  etaNudge: string;
  /** `a100-0: 0,1` once placed, else `—`. */
  node: string;
  /** `1 GPU`, `2 GPUs × 16G` or `0.5 GPU`. */
  gpus: string;
  runtime: string;
  /** The notebook a lease's `%%gpu` cells come from (its session), else null. */
  notebook: string | null;
  reason: string;
  cancellable: boolean;
  hasLog: boolean;
  /** The executed notebook of a finished notebook job (server-root relative), or null. */
  output: string | null;
  /** A queued array task's pending siblings: `array 12_[3-99999] · 99997 pending`, else ''. */
  arrayPending: string;
}

const CANCELLABLE: readonly JobState[] = ['queued', 'starting', 'running', 'preempted', 'lost'];

/** `1 GPU`, `2 GPUs × 16G` or `0.5 GPU`. */
export function gpusLabel(spec: IJobSpec): string {
  return formatGpus(spec.gpus, spec.gpu_share, spec.gpu_mem_gb);
}

/**
 * The notebook a lease serves: `%%gpu` names leases `<session>:<name>`, the session being the
 * notebook's path (JupyterLab's session name); null for other jobs.
 */
export function leaseNotebook(job: Pick<IJob, 'spec'>): string | null {
  const name = job.spec.lease_name;
  if (job.spec.kind !== 'lease' || !name) {
    return null;
  }
  const cut = name.lastIndexOf(':');
  const session = cut > 0 ? name.slice(0, cut) : name;
  const lease = cut > 0 ? name.slice(cut + 1) : '';
  const label = basename(session);
  return lease && lease !== 'default' ? `${label} (${lease})` : label;
}

/** The view model of one queue row, as seen by user `me` (null: unknown) at `nowMs`. */
export function queueRow(
  job: IJob,
  nowMs: number,
  me: string | null,
  arrays: ReadonlyMap<number, IArrayView> = new Map()
): IQueueRow {
  const p = job.placement;
  const spec = job.spec;
  const gpus = gpusLabel(spec);
  const run = runtimeS(job, nowMs);
  const queued = job.state === 'queued';
  return {
    id: job.id,
    name: jobName(job),
    user: job.user,
    kind: spec.kind,
    state: job.state,
    position: queued && job.position ? positionLabel(job.position) : '',
    eta:
      queued && !job.held ? `starts ${startLabel(job.estimate, job.estimated_start, nowMs)}` : '',
    etaNote: queued && !job.held ? (job.estimate?.note ?? '') : '',
    etaNudge:
      queued && !job.held && ['guess', 'unknown'].includes(job.estimate?.basis ?? '')
        ? (job.estimate?.note ?? '')
        : '',
    node: p ? `${p.node}: ${p.gpu_indices.join(',')}` : '—',
    gpus,
    runtime: run === null ? '' : runtimeLabel(run),
    notebook: leaseNotebook(job),
    reason: job.held ? `held${job.reason ? ` · ${job.reason}` : ''}` : (job.reason ?? ''),
    cancellable: CANCELLABLE.includes(job.state) && job.user === me,
    hasLog: job.started_at !== null || job.state === 'running',
    output: outputNotebook(job),
    arrayPending: arrayPending(job, arrays)
  };
}

/**
 * `array 12_[3-99999] · 99997 pending` for a queued task of an array whose other tasks are
 * not jobs yet (the array is one record until they can start), else ''.
 */
export function arrayPending(job: IJob, arrays: ReadonlyMap<number, IArrayView>): string {
  const id = Number(job.spec.labels?.array_id);
  const array = job.state === 'queued' && Number.isInteger(id) ? arrays.get(id) : undefined;
  if (!array || array.pending === 0) {
    return '';
  }
  return `array ${array.id}_[${array.pending_range}] · ${array.pending} pending`;
}

const STATE_ORDER: Record<JobState, number> = {
  running: 0,
  starting: 1,
  queued: 2,
  preempted: 3,
  lost: 3,
  failed: 4,
  succeeded: 4,
  cancelled: 4
};

/** Running first, then the queue in position order, then finished jobs newest first. */
export function sortJobs(jobs: IJob[]): IJob[] {
  return [...jobs].sort((a, b) => {
    const byState = STATE_ORDER[a.state] - STATE_ORDER[b.state];
    if (byState !== 0) {
      return byState;
    }
    if (a.state === 'queued') {
      return (a.position ?? 1e9) - (b.position ?? 1e9) || a.id - b.id;
    }
    return b.id - a.id;
  });
}

/**
 * Jobs of the queue tab: `mine` keeps `me`'s jobs (none while `me` is unknown: the server
 * names its users, see GpuschedModel.me); leases are listed apart.
 */
export function queueJobs(jobs: Iterable<IJob>, scope: 'mine' | 'all', me: string | null): IJob[] {
  const rows = [...jobs].filter(j => j.spec.kind !== 'lease' && (scope === 'all' || j.user === me));
  return sortJobs(rows);
}

const FINISHED: readonly JobState[] = ['succeeded', 'failed', 'cancelled'];
/** Cleared job ids kept at most (the newest). */
const MAX_CLEARED = 1000;

/**
 * Jobs of the queue as the filter shows them: `live` (waiting or running), `finished`, or
 * `all`; finished jobs the user cleared are never shown.
 */
export function filterJobs(
  jobs: IJob[],
  filter: 'live' | 'finished' | 'all',
  cleared: ReadonlySet<number>
): IJob[] {
  return jobs.filter(j => {
    const finished = FINISHED.includes(j.state);
    if (finished && cleared.has(j.id)) {
      return false;
    }
    return filter === 'all' || (filter === 'finished') === finished;
  });
}

/** The cleared ids after "clear finished": every job finished now, the newest kept. */
export function clearFinished(jobs: Iterable<IJob>, cleared: ReadonlySet<number>): Set<number> {
  const ids = [...cleared];
  for (const j of jobs) {
    if (FINISHED.includes(j.state)) {
      ids.push(j.id);
    }
  }
  return new Set([...new Set(ids)].sort((a, b) => b - a).slice(0, MAX_CLEARED));
}

/** `me`'s live leases, newest first. */
export function myLeases(jobs: Iterable<IJob>, me: string | null): IJob[] {
  return [...jobs]
    .filter(
      j =>
        j.spec.kind === 'lease' &&
        j.user === me &&
        (j.state === 'queued' || j.state === 'starting' || j.state === 'running')
    )
    .sort((a, b) => b.id - a.id);
}

/** One line on the window in force: `day window until 20:00, then night`. */
export function windowLine(window: ICluster['window'] | null, nowMs: number): string {
  return window ? formatWindowLine(window, nowMs) : 'no policy window';
}

/** What one row of "Schedules" (my recurring notebook jobs) shows. */
export interface IDefinitionRow {
  id: number;
  /** The definition's name, else the notebook's file name. */
  name: string;
  notebook: string;
  schedule: string;
  /** The schedule in words: `weekdays at 22:00`. */
  words: string;
  timezone: string;
  /** `weekdays at 22:00, next Tue 22:00`, `paused`, or `..., no next run`. */
  next: string;
  paused: boolean;
  /** `1 GPU`, `2 GPUs × 16 GB`. */
  gpus: string;
  /** `3 runs, last #12`, or `no runs yet`. */
  runs: string;
}

/** The view model of one definition at `nowMs`. */
export function definitionRow(d: IDefinition, nowMs: number): IDefinitionRow {
  const notebook = d.spec.notebook ?? '';
  const words = d.schedule_words || `cron '${d.schedule}'`;
  // in the schedule's own zone, as its words and the zone shown beside it say
  const next = d.paused ? 'paused' : scheduleLine(words, d.next_fire_at, nowMs, d.timezone);
  let runs = 'no runs yet';
  if (d.fire_count > 0) {
    runs = `${d.fire_count} run${d.fire_count === 1 ? '' : 's'}`;
    if (d.last_job_id) {
      runs += `, last #${d.last_job_id}`;
    }
  }
  return {
    id: d.id,
    name: d.name || basename(notebook) || `schedule ${d.id}`,
    notebook,
    schedule: d.schedule,
    words,
    timezone: d.timezone,
    next,
    paused: d.paused,
    gpus: gpusLabel(d.spec),
    runs
  };
}
