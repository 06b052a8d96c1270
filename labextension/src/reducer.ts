/**
 * The panel's state and how websocket events change it. Pure: `applyEvent(state, event)`
 * returns a new state and never mutates its input, so replays and reconnects are safe.
 */
import { isKernelLease } from './kernelwait';
import { ICluster, IEvent, IJob, JobState, TERMINAL_STATES } from './types';

/** Everything the panel draws. */
export interface IPanelState {
  cluster: ICluster | null;
  /** Jobs by id (the queue, leases and recently finished jobs). */
  jobs: ReadonlyMap<number, IJob>;
  /**
   * Id of the last event applied; the websocket resumes with `?after=` this. -1 before any:
   * the first connection then asks for new events only (the page loads the jobs by REST).
   */
  lastEventId: number;
  /**
   * For each job, the id of the last event that set it: a REST answer asked for before that
   * event (its `since`) is older than what the row shows and must not replace it.
   */
  jobEventIds: ReadonlyMap<number, number>;
}

/** The state before anything has loaded. */
export function initialState(): IPanelState {
  return { cluster: null, jobs: new Map(), lastEventId: -1, jobEventIds: new Map() };
}

function ended(job: IJob): boolean {
  return TERMINAL_STATES.includes(job.state);
}

/**
 * Which of two snapshots of one job to show: `fetched` (a REST answer asked for when
 * `lastEventId` was `since`) or `shown`. A finished job never moves again, so a live
 * snapshot never replaces a finished one; an event newer than the request wins over it.
 */
function fresher(
  shown: IJob | undefined,
  shownEventId: number | undefined,
  fetched: IJob,
  since: number
): IJob {
  if (!shown || ended(fetched)) {
    return fetched;
  }
  if (ended(shown) || (shownEventId !== undefined && shownEventId > since)) {
    return shown;
  }
  return fetched;
}

/**
 * Replace the job list with a `GET jobs` answer asked for when `lastEventId` was `since`
 * (events since may already be in it, or be newer than it: those rows are kept).
 */
export function withJobs(state: IPanelState, jobs: IJob[], since = -1): IPanelState {
  const next = new Map(
    jobs.map(j => [j.id, fresher(state.jobs.get(j.id), state.jobEventIds.get(j.id), j, since)])
  );
  // A job an event told of after the request went out may be missing from the answer (made
  // after the server read its page): it stays.
  for (const [id, eventId] of state.jobEventIds) {
    const shown = state.jobs.get(id);
    if (eventId > since && shown && !next.has(id)) {
      next.set(id, shown);
    }
  }
  return { ...state, jobs: next };
}

/** Merge one `GET jobs/{id}` answer asked for when `lastEventId` was `since`. */
export function withJob(state: IPanelState, job: IJob, since: number): IPanelState {
  const shown = state.jobs.get(job.id);
  const pick = fresher(shown, state.jobEventIds.get(job.id), job, since);
  if (pick === shown) {
    return state;
  }
  const jobs = new Map(state.jobs);
  jobs.set(job.id, pick);
  return { ...state, jobs };
}

/**
 * Jobs the rows show holding GPUs (starting or running, placed) that no GPU of the map
 * lists: the map is newer than their rows, whose final state was missed. Refetched, a row
 * never stays stale while the map says its GPUs are free.
 */
export function unheldJobs(state: IPanelState): number[] {
  if (!state.cluster) {
    return [];
  }
  const held = new Set<number>();
  for (const n of state.cluster.nodes) {
    for (const g of n.gpus) {
      for (const j of g.jobs ?? []) {
        held.add(j.id);
      }
    }
  }
  const out: number[] = [];
  for (const job of state.jobs.values()) {
    const holds = (job.state === 'running' || job.state === 'starting') && job.placement;
    if (holds && (job.spec.gpus ?? 0) > 0 && !held.has(job.id)) {
      out.push(job.id);
    }
  }
  return out;
}

/** Replace the cluster map with a fresh `GET cluster` answer. */
export function withCluster(state: IPanelState, cluster: ICluster): IPanelState {
  return { ...state, cluster };
}

/**
 * Apply one event. Stored events carry an increasing `id`; one at or below `lastEventId`
 * was already applied (a replay after reconnect) and is ignored. `cluster` messages may
 * carry no id: they replace the map and never move `lastEventId`.
 */
export function applyEvent(state: IPanelState, event: IEvent): IPanelState {
  const id = typeof event.id === 'number' ? event.id : null;
  if (id !== null && id <= state.lastEventId) {
    return state;
  }
  let next: IPanelState = id === null ? state : { ...state, lastEventId: id };
  const cluster = event.cluster ?? (event.detail?.cluster as ICluster | undefined);
  if (event.kind === 'cluster' && cluster && Array.isArray(cluster.nodes)) {
    next = { ...next, cluster };
  }
  if (event.job) {
    next = withEventJob(next, event.job, id);
  } else if (typeof event.job_id === 'number' && event.to_state) {
    const old = next.jobs.get(event.job_id);
    if (old) {
      next = withEventJob(next, { ...old, state: event.to_state, position: null }, id);
    }
  }
  return next;
}

function withEventJob(state: IPanelState, job: IJob, id: number | null): IPanelState {
  const jobs = new Map(state.jobs);
  jobs.set(job.id, job);
  if (id === null) {
    return { ...state, jobs };
  }
  const jobEventIds = new Map(state.jobEventIds);
  jobEventIds.set(job.id, id);
  return { ...state, jobs, jobEventIds };
}

/** True when an event may have changed which GPUs are held (the map should be refreshed). */
export function touchesCluster(event: IEvent): boolean {
  return event.kind === 'state' || event.kind === 'node' || event.kind === 'submitted';
}

/**
 * True when an event may have changed a recurring definition: created, paused, resumed,
 * deleted, skipped, or fired (its job's `submitted` event names the definition).
 */
export function touchesDefinitions(event: IEvent): boolean {
  return (
    event.kind === 'definition' ||
    (event.kind === 'submitted' && event.detail?.definition_id !== undefined)
  );
}

/** A notification to show the user about one of their jobs. */
export interface INotice {
  jobId: number;
  level: 'success' | 'error' | 'warning';
  message: string;
  /** The executed notebook of a notebook job (server-root relative), once fetched. */
  output?: string;
}

/**
 * The executed notebook a finished notebook job left beside its input, if any yet: the
 * server-set `outputs`, never a label (labels are whatever the submitter wrote).
 */
export function outputNotebook(job: Pick<IJob, 'outputs'>): string | null {
  return job.outputs?.notebook ?? null;
}

/**
 * Whether a notice should wait for the job's executed notebook: a notebook job that ran to
 * an end the server collects results for, with no output named yet. The server fetches it
 * after the state change and announces it with a `notebook_output` event.
 */
export function awaitsOutput(notice: INotice, job: Pick<IJob, 'spec' | 'state'>): boolean {
  return (
    notice.output === undefined &&
    job.spec.kind === 'notebook' &&
    (job.state === 'succeeded' || job.state === 'failed')
  );
}

/** The notice completed by a `notebook_output` event about its job, or null if unrelated. */
export function withOutput(notice: INotice, event: IEvent): INotice | null {
  if (event.kind !== 'notebook_output' || event.job_id !== notice.jobId) {
    return null;
  }
  const output =
    (event.job ? outputNotebook(event.job) : null) ??
    (typeof event.detail?.notebook === 'string' ? event.detail.notebook : null);
  return output ? { ...notice, output } : notice;
}

/** What the panel knew when it loaded, so history replayed on connect stays quiet. */
export interface INoticeGate {
  /** State of each job in the first `GET jobs` answer. */
  atLoad: ReadonlyMap<number, JobState>;
  /** Jobs older than this were not loaded at all (history): never notify about them. */
  oldestLoadedId: number;
}

const NOTICE_LEVEL: Partial<Record<JobState, INotice['level']>> = {
  succeeded: 'success',
  failed: 'error',
  lost: 'error',
  preempted: 'warning'
};

/**
 * The notice for an event, if it tells `me` that one of their jobs finished, failed, was
 * lost or preempted since the panel loaded. On connect the server replays old events, each
 * with the job as it is now: those about a job already in that state at load are history.
 */
export function noticeFor(event: IEvent, me: string | null, gate: INoticeGate): INotice | null {
  if (event.kind !== 'state' || !event.to_state || typeof event.job_id !== 'number') {
    return null;
  }
  const level = NOTICE_LEVEL[event.to_state];
  const job = event.job;
  if (!level || !job || job.user !== me) {
    return null;
  }
  if (isKernelLease(job) && event.to_state !== 'failed') {
    // a GPU kernel's lease "succeeds" when the kernel is shut down: nothing to say; a lost or
    // preempted one is told by the kernel's own notification (./kernelnotify.ts)
    return null;
  }
  const loaded = gate.atLoad.get(job.id);
  if ((job.id < gate.oldestLoadedId && loaded === undefined) || loaded === event.to_state) {
    return null;
  }
  const name =
    job.spec.name || job.spec.notebook || (job.spec.command ?? []).slice(-1)[0] || job.spec.kind;
  let message = `GPU job #${job.id} (${name.split('/').pop()}) ${event.to_state}`;
  if (event.to_state === 'failed' || event.to_state === 'lost') {
    if (job.reason) {
      message += `: ${job.reason}`;
    } else if (job.exit_code !== null) {
      message += `: exit code ${job.exit_code}`;
    }
  }
  const output = outputNotebook(job);
  return output ? { jobId: job.id, level, message, output } : { jobId: job.id, level, message };
}

/**
 * The notice gate for a first load of the newest `limit` jobs (and the live ones, which may
 * be older): below the `limit`-th newest id only the jobs loaded were seen.
 */
export function noticeGate(jobs: IJob[], limit: number): INoticeGate {
  const atLoad = new Map(jobs.map(j => [j.id, j.state] as [number, JobState]));
  const ids = jobs.map(j => j.id).sort((a, b) => b - a);
  const oldest = ids.length >= limit ? ids[limit - 1] : 0;
  return { atLoad, oldestLoadedId: oldest };
}
