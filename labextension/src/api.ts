/**
 * REST client of `{base_url}gpusched/api/`, through Jupyter's ServerConnection (which adds
 * the token and the XSRF header), and the events websocket with resume-after-reconnect.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import {
  IApiError,
  IArrayView,
  ICluster,
  IDefinition,
  IEvent,
  IGpuHistory,
  IJob,
  IJobEvents,
  IJobPost,
  INotebookSubmission,
  INotebookSubmitted
} from './types';

const API = 'gpusched/api';

/**
 * An API error with the server's advice on what to fix; `retryAfterS` is when to try again
 * (a 429 over one of the user's limits, or a 503), from the `Retry-After` header.
 */
export class GpuschedApiError extends Error {
  constructor(
    readonly status: number,
    readonly error: string,
    message: string,
    readonly field?: string,
    readonly retryAfterS?: number
  ) {
    super(message);
  }
}

/** REST calls the panel makes. */
export class GpuschedClient {
  readonly settings: ServerConnection.ISettings;

  constructor(settings?: ServerConnection.ISettings) {
    this.settings = settings ?? ServerConnection.makeSettings();
  }

  private url(path: string, query: Record<string, string | number> = {}): string {
    const url = URLExt.join(this.settings.baseUrl, API, path);
    const q = URLExt.objectToQueryString(query);
    return url + q;
  }

  private async fetch(path: string, init: RequestInit = {}, query = {}): Promise<Response> {
    const url = this.url(path, query);
    let tries = 1;
    if (init.method === 'POST') {
      // A create carries a key of its own, kept by its repeats: when the answer is lost (the
      // network, a server restart), sending it again makes nothing twice.
      const headers = new Headers(init.headers);
      headers.set('Idempotency-Key', `"${newKey()}"`);
      init = { ...init, headers };
      tries = POST_TRIES;
    }
    let response: Response | undefined;
    for (let attempt = 1; response === undefined; attempt++) {
      try {
        response = await ServerConnection.makeRequest(url, init, this.settings);
      } catch (err) {
        if (attempt >= tries) {
          throw new GpuschedApiError(0, 'NetworkError', `cannot reach the Jupyter server: ${err}`);
        }
        await sleep(500 * 2 ** (attempt - 1));
      }
    }
    if (!response.ok) {
      let body: Partial<IApiError> = {};
      try {
        body = await response.json();
      } catch {
        // not JSON: e.g. a 404 page when the server extension is not enabled
      }
      const retry = Number(response.headers.get('Retry-After') ?? NaN);
      throw new GpuschedApiError(
        response.status,
        body.error ?? response.statusText,
        body.message ?? `HTTP ${response.status} from ${path}`,
        body.field ?? undefined,
        Number.isFinite(retry) ? retry : undefined
      );
    }
    return response;
  }

  private async json<T>(path: string, init: RequestInit = {}, query = {}): Promise<T> {
    return (await (await this.fetch(path, init, query)).json()) as T;
  }

  /** `GET cluster`: nodes, GPUs, metrics, the window in force. */
  cluster(): Promise<ICluster> {
    return this.json<ICluster>('cluster');
  }

  /**
   * Everyone's live jobs and the newest `limit` jobs, newest first (the panel filters "mine"
   * itself). Two pages: with a year of history the newest page alone would leave out a job
   * that still runs after `limit` newer ones, and the oldest-first page would be last year's.
   */
  async jobs(limit = 200): Promise<IJob[]> {
    return (await this.jobsAndArrays(limit)).jobs;
  }

  /**
   * {@link jobs}, with the arrays whose pending tasks are not jobs yet (one record each, as
   * the live page lists them).
   */
  async jobsAndArrays(limit = 200): Promise<{ jobs: IJob[]; arrays: IArrayView[] }> {
    type Page = { jobs: IJob[]; arrays?: IArrayView[] };
    // One after the other, the live page last: a job in both takes its later copy, so a
    // kernel that started between the two answers is never shown waiting again.
    const newest = await this.json<Page>('jobs', {}, { order: '-id', limit });
    const live = await this.json<Page>('jobs', {}, { state: 'queued,starting,running', limit });
    const byId = new Map([...newest.jobs, ...live.jobs].map(j => [j.id, j]));
    return {
      jobs: [...byId.values()].sort((a, b) => b.id - a.id),
      arrays: live.arrays ?? []
    };
  }

  /**
   * The user name the scheduler records for me: the owner of my newest job (`?user=me`),
   * or null while I have none. It can differ from Jupyter's identity (a token-only server
   * records its owner's login name, not the random anonymous identity).
   */
  async whoami(): Promise<string | null> {
    const mine = await this.json<{ jobs: IJob[] }>('jobs', {}, { user: 'me', limit: 1 });
    return mine.jobs[0]?.user ?? null;
  }

  /** `GET jobs/{id}`. */
  job(id: number): Promise<IJob> {
    return this.json<IJob>(`jobs/${id}`);
  }

  /** `GET jobs/{id}/events`: the job's timeline (state changes with reasons), oldest first. */
  async jobEvents(id: number): Promise<IJobEvents['events']> {
    return (await this.json<IJobEvents>(`jobs/${id}/events`)).events;
  }

  /** `GET cluster/history`: GPUs' samples; `job` keeps its GPUs over its life. */
  history(query: { node?: string; job?: number; points?: number } = {}): Promise<IGpuHistory> {
    const q: Record<string, string | number> = {};
    for (const [k, v] of Object.entries(query)) {
      if (v !== undefined) {
        q[k] = v;
      }
    }
    return this.json<IGpuHistory>('cluster/history', {}, q);
  }

  /** A notebook job's executed notebook or log, as a file (`GET jobs/{id}/output`). */
  async output(id: number, part: 'notebook' | 'log'): Promise<Blob> {
    return (await this.fetch(`jobs/${id}/output`, {}, { part })).blob();
  }

  /** The whole log of a job, as text (for a download). */
  async logText(id: number): Promise<string> {
    let text = '';
    let offset = 0;
    for (;;) {
      const chunk = await this.log(id, offset);
      text += chunk.text;
      if (chunk.next === offset || chunk.text.length === 0) {
        return text;
      }
      offset = chunk.next;
    }
  }

  /** `POST notebooks`: run a notebook as the logged-in user, now, later or on a cron. */
  submitNotebook(body: INotebookSubmission): Promise<INotebookSubmitted> {
    return this.json<INotebookSubmitted>('notebooks', {
      method: 'POST',
      body: JSON.stringify(body)
    });
  }

  /** `POST jobs`: queue one job (a script from the submit dialog) as the logged-in user. */
  submitJob(body: IJobPost): Promise<IJob> {
    return this.json<IJob>('jobs', { method: 'POST', body: JSON.stringify(body) });
  }

  /** `GET definitions?user=me`: my recurring notebook jobs, oldest first. */
  async definitions(limit = 100): Promise<IDefinition[]> {
    const page = await this.json<{ definitions: IDefinition[] }>(
      'definitions',
      {},
      { user: 'me', limit }
    );
    return page.definitions;
  }

  /** `PATCH definitions/{id}`: pause or resume. */
  setPaused(id: number, paused: boolean): Promise<IDefinition> {
    return this.json<IDefinition>(`definitions/${id}`, {
      method: 'PATCH',
      body: JSON.stringify({ paused })
    });
  }

  /** `DELETE definitions/{id}` (the jobs it made stay). */
  deleteDefinition(id: number): Promise<IDefinition> {
    return this.json<IDefinition>(`definitions/${id}`, { method: 'DELETE' });
  }

  /** `DELETE jobs/{id}`: cancel. */
  cancel(id: number): Promise<IJob> {
    return this.json<IJob>(`jobs/${id}`, { method: 'DELETE' });
  }

  /** `DELETE leases/{id}`: release a lease. */
  release(id: number): Promise<IJob> {
    return this.json<IJob>(`leases/${id}`, { method: 'DELETE' });
  }

  /** `GET jobs/{id}/log` slice from `offset`; returns the text and the next offset. */
  async log(id: number, offset: number): Promise<{ text: string; next: number }> {
    const r = await this.fetch(`jobs/${id}/log`, {}, { offset, limit: 262144 });
    const text = await r.text();
    const next = Number(r.headers.get('X-Log-Offset') ?? offset + text.length);
    return { text, next };
  }

  /**
   * Stream a job's log (`?follow=1`) from `offset` until the job ends or `signal` aborts;
   * `onText` gets each decoded chunk. Resolves with the number of bytes received.
   */
  async followLog(
    id: number,
    offset: number,
    onText: (text: string) => void,
    signal: AbortSignal
  ): Promise<number> {
    const r = await this.fetch(`jobs/${id}/log`, { signal }, { offset, follow: 1 });
    if (!r.body) {
      const text = await r.text();
      onText(text);
      return new TextEncoder().encode(text).length;
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let bytes = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        break;
      }
      bytes += value.length;
      onText(decoder.decode(value, { stream: true }));
    }
    onText(decoder.decode());
    return bytes;
  }

  /**
   * Why the events websocket was refused, or null: a browser never sees the answer to a
   * refused upgrade, so the same URL is asked over plain HTTP, which says it (a 429 over
   * the user's streams, with the message naming the limit).
   */
  async eventsRefusal(): Promise<GpuschedApiError | null> {
    try {
      await this.fetch('events', {}, { after: -1 });
    } catch (err) {
      if (err instanceof GpuschedApiError && err.status === 429) {
        return err;
      }
    }
    return null;
  }

  /** Websocket URL of `events`, resuming after `afterId`, with the token as Jupyter does. */
  eventsUrl(afterId: number): string {
    let url = URLExt.join(this.settings.wsUrl, API, 'events') + `?after=${afterId}`;
    if (this.settings.token && this.settings.appendToken) {
      url += `&token=${encodeURIComponent(this.settings.token)}`;
    }
    return url;
  }
}

/** Connection state of the events websocket. */
export type StreamStatus = 'connecting' | 'open' | 'retrying' | 'closed';

/**
 * The events websocket, reconnecting with backoff and resuming after the last event seen.
 */
export class EventStream {
  private socket: WebSocket | null = null;
  private retryMs = 500;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private closed = false;

  constructor(
    private readonly client: GpuschedClient,
    private readonly lastId: () => number,
    private readonly onEvent: (event: IEvent) => void,
    private readonly onStatus: (status: StreamStatus) => void,
    private readonly onRefused: (why: GpuschedApiError | null) => void = () => undefined
  ) {}

  /** Connect (again). */
  open(): void {
    this.closed = false;
    this.onStatus('connecting');
    const WS = this.client.settings.WebSocket ?? WebSocket;
    const socket = new WS(this.client.eventsUrl(this.lastId()));
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.retryMs = 500;
      this.onRefused(null);
      this.onStatus('open');
    };
    socket.onmessage = msg => {
      try {
        this.onEvent(JSON.parse(String(msg.data)) as IEvent);
      } catch (err) {
        console.warn('gpusched: bad event message', err);
      }
    };
    socket.onclose = () => {
      if (this.socket !== socket || this.closed) {
        return;
      }
      this.onStatus('retrying');
      if (!opened) {
        // Refused before it opened: over the user's streams? Say so, and wait as told.
        void this.client.eventsRefusal().then(why => {
          this.onRefused(why);
          if (why?.retryAfterS) {
            this.retryMs = Math.max(this.retryMs, why.retryAfterS * 1000);
          }
          this.retry(socket);
        });
        return;
      }
      this.retry(socket);
    };
  }

  private retry(socket: WebSocket): void {
    if (this.socket !== socket || this.closed) {
      return;
    }
    this.timer = setTimeout(() => this.open(), this.retryMs);
    this.retryMs = Math.min(this.retryMs * 2, 15000);
  }

  /** Disconnect for good. */
  close(): void {
    this.closed = true;
    if (this.timer !== null) {
      clearTimeout(this.timer);
    }
    this.socket?.close();
    this.socket = null;
    this.onStatus('closed');
  }
}

/** How often a create is sent when no answer comes (with one `Idempotency-Key`). */
const POST_TRIES = 4;

/** A fresh idempotency key: a random UUID (any unique string would do). */
function newKey(): string {
  if (typeof crypto !== 'undefined' && typeof crypto.randomUUID === 'function') {
    return crypto.randomUUID();
  }
  const hex = (n: number) =>
    Array.from({ length: n }, () => Math.floor(Math.random() * 16).toString(16)).join('');
  return `${hex(8)}-${hex(4)}-${hex(4)}-${hex(4)}-${hex(12)}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, ms));
}
