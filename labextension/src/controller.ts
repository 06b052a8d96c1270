/**
 * The panel's live model: loads the cluster and jobs over REST, follows the events websocket,
 * and signals changes and notices. All state changes go through the pure reducer.
 */
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';
import { EventStream, GpuschedApiError, GpuschedClient, StreamStatus } from './api';
import {
  applyEvent,
  awaitsOutput,
  initialState,
  INotice,
  INoticeGate,
  IPanelState,
  noticeFor,
  noticeGate,
  touchesCluster,
  touchesDefinitions,
  unheldJobs,
  withCluster,
  withJob,
  withJobs,
  withOutput
} from './reducer';
import { IArrayView, IDefinition, IEvent, IJob } from './types';

/** How many recent jobs the panel loads. */
export const JOB_LIMIT = 200;
/** The map also refreshes on this period, for memory and utilisation figures. */
const CLUSTER_POLL_MS = 10000;
/**
 * How long a notebook job's notice waits for its executed notebook to be fetched (the
 * `notebook_output` event) before it is shown without one.
 */
export const OUTPUT_WAIT_MS = 20000;

/** Loading, ready, or failed (with the server's advice in `error`). */
export type LoadStatus = 'loading' | 'ready' | 'error';

export class GpuschedModel implements IDisposable {
  state: IPanelState = initialState();
  status: LoadStatus = 'loading';
  error: GpuschedApiError | null = null;
  stream: StreamStatus = 'closed';
  /** Why the events websocket is refused (over the user's streams), or null. */
  streamRefused: string | null = null;
  /** My recurring notebook jobs (null until loaded, or when the server has none to list). */
  definitions: IDefinition[] | null = null;

  private _changed = new Signal<this, void>(this);
  private _notice = new Signal<this, INotice>(this);
  private _events: EventStream | null = null;
  private _gate: INoticeGate | null = null;
  private _poll: ReturnType<typeof setInterval> | null = null;
  private _refreshTimer: ReturnType<typeof setTimeout> | null = null;
  private _disposed = false;
  private _retryMs = 1000;
  private _retryTimer: ReturnType<typeof setTimeout> | null = null;
  private _definitionsTimer: ReturnType<typeof setTimeout> | null = null;
  /** When each job was last refetched because the map did not list it (`resyncUnheld`). */
  private _resynced = new Map<number, number>();
  /** Notices of notebook jobs waiting for their executed notebook, by job id. */
  private _pending = new Map<number, { notice: INotice; timer: ReturnType<typeof setTimeout> }>();

  /** My user name as the scheduler records it (null until I own a job). */
  private _me: string | null = null;
  private _whoamiPending = false;

  constructor(readonly client: GpuschedClient) {}

  /**
   * Arrays with pending tasks, by id, as the last `GET jobs` listed them: a queued task of
   * one shows how many wait behind it (they are not jobs until they can start).
   */
  arrays: ReadonlyMap<number, IArrayView> = new Map();

  /** My user name as the scheduler records it, or null while unknown. */
  me(): string | null {
    return this._me;
  }

  /** Learn my name from a job I just submitted. */
  claim(job: IJob): void {
    if (this._me !== job.user) {
      this._me = job.user;
      this._changed.emit();
    }
  }

  /** Emitted whenever anything the panel draws changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted when one of my jobs finished, failed, was lost or preempted. */
  get notice(): ISignal<this, INotice> {
    return this._notice;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Load, then follow events. Safe to call again (Retry). */
  async start(): Promise<void> {
    if (this._retryTimer !== null) {
      clearTimeout(this._retryTimer);
      this._retryTimer = null;
    }
    if (this._disposed) {
      return;
    }
    this.status = 'loading';
    this.error = null;
    this._changed.emit();
    try {
      const since = this.state.lastEventId;
      const [cluster, page, me] = await Promise.all([
        this.client.cluster(),
        this.client.jobsAndArrays(JOB_LIMIT),
        this._me === null ? this.client.whoami() : Promise.resolve(this._me)
      ]);
      const jobs = page.jobs;
      this._me = me;
      this.arrays = arraysById(page.arrays);
      this.state = withJobs(withCluster(this.state, cluster), jobs, since);
      this._gate ??= noticeGate(jobs, JOB_LIMIT);
      this.status = 'ready';
    } catch (err) {
      this.status = 'error';
      this.error =
        err instanceof GpuschedApiError ? err : new GpuschedApiError(0, 'Error', String(err));
      this._changed.emit();
      // A server still starting (503) or unreachable (0) is worth retrying by itself.
      if (this.error.status === 503 || this.error.status === 0) {
        this._retryMs = Math.min(this._retryMs * 2, 30000);
        this._retryTimer = setTimeout(() => void this.start(), this._retryMs);
      }
      return;
    }
    this._retryMs = 1000;
    this._changed.emit();
    void this.refreshDefinitions();
    if (!this._events) {
      this._events = new EventStream(
        this.client,
        () => this.state.lastEventId,
        event => this.apply(event),
        status => {
          this.stream = status;
          this._changed.emit();
          if (status === 'open' && this.state.lastEventId < 0) {
            // The first connection follows only new events: reload the jobs once it is open,
            // so nothing that happened between the first load and the connection is missed.
            void this.reloadJobs();
          }
        },
        why => {
          this.streamRefused = why?.message ?? null;
          this._changed.emit();
        }
      );
      this._events.open();
    }
    this._poll ??= setInterval(() => void this.refreshCluster(), CLUSTER_POLL_MS);
  }

  /** Reload the job list over REST (the events then keep it current). */
  async reloadJobs(): Promise<void> {
    try {
      const since = this.state.lastEventId;
      const page = await this.client.jobsAndArrays(JOB_LIMIT);
      this.arrays = arraysById(page.arrays);
      this.state = withJobs(this.state, page.jobs, since);
      this._changed.emit();
    } catch (err) {
      console.warn('gpusched: jobs reload failed', err);
    }
  }

  /** Apply one websocket event (public for tests and for local echoes). */
  apply(event: IEvent): void {
    const next = applyEvent(this.state, event);
    if (next === this.state) {
      return;
    }
    this.state = next;
    if (touchesDefinitions(event)) {
      this.scheduleDefinitionsRefresh();
    }
    const waiting = typeof event.job_id === 'number' ? this._pending.get(event.job_id) : null;
    const completed = waiting ? withOutput(waiting.notice, event) : null;
    if (waiting && completed) {
      clearTimeout(waiting.timer);
      this._pending.delete(completed.jobId);
    }
    if (this._me === null && event.kind === 'submitted') {
      // A job from elsewhere (a %gpu magic, the CLI) may be mine: ask once who I am.
      void this.learnMe();
    }
    const notice = this._gate ? noticeFor(event, this.me(), this._gate) : null;
    if (touchesCluster(event)) {
      this.scheduleClusterRefresh();
    }
    if (event.kind === 'cluster') {
      this.resyncUnheld();
    }
    this._changed.emit();
    if (completed) {
      this._notice.emit(completed);
    }
    if (notice && event.job && awaitsOutput(notice, event.job)) {
      const timer = setTimeout(() => {
        this._pending.delete(notice.jobId);
        this._notice.emit(notice);
      }, OUTPUT_WAIT_MS);
      this._pending.set(notice.jobId, { notice, timer });
    } else if (notice) {
      this._notice.emit(notice);
    }
  }

  /** Reload my definitions soon; bursts of `definition` events cost one request. */
  scheduleDefinitionsRefresh(delayMs = 200): void {
    if (this._definitionsTimer !== null) {
      return;
    }
    this._definitionsTimer = setTimeout(() => {
      this._definitionsTimer = null;
      void this.refreshDefinitions();
    }, delayMs);
  }

  /** Reload my definitions now (after loading, on `definition` events, after acting). */
  async refreshDefinitions(): Promise<void> {
    if (this.status !== 'ready') {
      return;
    }
    try {
      this.definitions = await this.client.definitions();
    } catch (err) {
      // A server without notebook jobs has no such route: the section then stays hidden.
      console.warn('gpusched: definitions refresh failed', err);
      this.definitions = null;
    }
    this._changed.emit();
  }

  private async learnMe(): Promise<void> {
    if (this._whoamiPending) {
      return;
    }
    this._whoamiPending = true;
    try {
      const me = await this.client.whoami();
      if (me !== null && this._me === null) {
        this._me = me;
        this._changed.emit();
      }
    } catch (err) {
      console.warn('gpusched: who am I failed', err);
    } finally {
      this._whoamiPending = false;
    }
  }

  /** Refresh the map soon; bursts of events cost one request. */
  scheduleClusterRefresh(delayMs = 250): void {
    if (this._refreshTimer !== null) {
      return;
    }
    this._refreshTimer = setTimeout(() => {
      this._refreshTimer = null;
      void this.refreshCluster();
    }, delayMs);
  }

  /** Fetch the map now. */
  async refreshCluster(): Promise<void> {
    if (this.status !== 'ready') {
      return;
    }
    try {
      this.state = withCluster(this.state, await this.client.cluster());
      this.resyncUnheld();
      this._changed.emit();
    } catch (err) {
      console.warn('gpusched: cluster refresh failed', err);
    }
  }

  /**
   * Refetch the jobs whose rows say they hold GPUs the map says no job of theirs holds: an
   * update about them was missed or came out of order, and a row must not stay stale.
   */
  resyncUnheld(): void {
    const now = Date.now();
    const unheld = unheldJobs(this.state);
    for (const id of this._resynced.keys()) {
      if (!unheld.includes(id)) {
        this._resynced.delete(id);
      }
    }
    for (const id of unheld) {
      // at most once a map poll per job: a map that lags a start, or a node that does not
      // answer, must not cost a request per cluster message
      if (now - (this._resynced.get(id) ?? -Infinity) < CLUSTER_POLL_MS) {
        continue;
      }
      this._resynced.set(id, now);
      void this.refreshJob(id).catch(err => console.warn(`gpusched: job ${id} refresh`, err));
    }
  }

  /**
   * Refresh one job (after acting on it, or when its row looks stale). An event about it
   * that came while the answer was on its way is newer: the answer then does not replace it.
   */
  async refreshJob(id: number): Promise<void> {
    const since = this.state.lastEventId;
    const job = await this.client.job(id);
    const next = withJob(this.state, job, since);
    if (next !== this.state) {
      this.state = next;
      this._changed.emit();
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._events?.close();
    if (this._poll !== null) {
      clearInterval(this._poll);
    }
    if (this._refreshTimer !== null) {
      clearTimeout(this._refreshTimer);
    }
    if (this._retryTimer !== null) {
      clearTimeout(this._retryTimer);
    }
    if (this._definitionsTimer !== null) {
      clearTimeout(this._definitionsTimer);
    }
    for (const { timer } of this._pending.values()) {
      clearTimeout(timer);
    }
    this._pending.clear();
    Signal.clearData(this);
  }
}

/** Arrays by id. */
function arraysById(arrays: IArrayView[]): Map<number, IArrayView> {
  return new Map(arrays.map(a => [a.id, a] as [number, IArrayView]));
}
