/**
 * A job's page in the main area: what it asked for and its parameters, its owner, why it waits
 * and when it should start, where it runs, its timeline of state changes with their reasons,
 * its GPUs' utilization and memory over its life, its outputs (open or download) and its log.
 *
 * Links to files come from server-set fields only: the executed notebook's path the server
 * recorded when it fetched it, downloads from `GET jobs/{id}/output` and the log route.
 */
import type { Message } from '@lumino/messaging';
import { Panel, Widget } from '@lumino/widgets';
import { cancelJob } from './actions';
import { GpuschedClient } from './api';
import { chartModel, chartSvg } from './charts';
import { GpuschedModel } from './controller';
import { h } from './dom';
import { clockLabel, formatDuration, formatSize, gpuCount, runtimeLabel } from './format';
import { LogView } from './logview';
import { gpusLabel, jobName, queueRow } from './model';
import { splitLog } from './progress';
import { outputNotebook } from './reducer';
import { IEvent, IGpuHistory, IJob, TERMINAL_STATES } from './types';

/** How often a live job's GPU history is fetched again. */
const HISTORY_MS = 5000;

/** One timeline entry in words: `queued → starting: placed on a100-0 GPU 0,1`. */
export function timelineText(
  event: Pick<IEvent, 'kind' | 'from_state' | 'to_state' | 'detail'>
): string {
  const d = (event.detail ?? {}) as Record<string, unknown>;
  const reason = typeof d.reason === 'string' ? d.reason : '';
  switch (event.kind) {
    case 'submitted':
      return 'submitted: queued';
    case 'state': {
      let text = `${event.from_state} → ${event.to_state}`;
      if (typeof d.exit_code === 'number') {
        text += ` (exit code ${d.exit_code})`;
      }
      return reason ? `${text}: ${reason}` : text;
    }
    case 'waiting':
      return reason || 'waiting';
    case 'stopping':
      return `stopping (${d.how ?? 'stop'})${reason ? `: ${reason}` : ''}`;
    case 'notebook_output':
      return `executed notebook copied home: ${d.notebook ?? '?'}`;
    case 'progress':
      return `last cell reported: ${d.cell ?? '?'} of ${d.of ?? '?'}${d.source ? ` (${d.source})` : ''}`;
    case 'retry':
      return `retried as job ${d.retry_job_id} (${d.retry} of ${d.of})`;
    case 'updated':
      return `changed: ${((d.fields as string[]) ?? []).join(', ')}`;
    default:
      return event.kind;
  }
}

/** The request as rows of (label, value), in the vocabulary of the rest of the panel. */
export function specRows(job: IJob): [string, string][] {
  const s = job.spec;
  const rows: [string, string][] = [
    ['owner', job.user],
    ['kind', `${s.kind} (${job.priority_class})`],
    ['GPUs', gpusLabel(s)]
  ];
  if (s.gpu_models?.length) {
    rows.push(['GPU model', s.gpu_models.join(' or ')]);
  }
  if (s.command?.length) {
    rows.push(['command', s.command.join(' ')]);
  }
  if (s.notebook) {
    rows.push(['notebook', s.notebook]);
  }
  rows.push(['CPUs', String(s.cpus ?? 1)], ['host memory', formatSize(s.mem_gb ?? 4)]);
  if (s.max_runtime_s) {
    rows.push(['max runtime', formatDuration(s.max_runtime_s)]);
  }
  if (s.workdir) {
    rows.push(['runs in', s.workdir]);
  }
  if (s.lease_name) {
    rows.push(['lease of', s.lease_name]);
  }
  return rows;
}

export class JobDetails extends Widget {
  private job: IJob | null = null;
  private events: IEvent[] = [];
  private history: IGpuHistory | null = null;
  private timer: ReturnType<typeof setInterval>;
  private sections = {
    head: h('div', { className: 'jp-gpusched-page-head' }),
    why: h('div', { className: 'jp-gpusched-page-why' }),
    spec: h('div', { className: 'jp-gpusched-page-spec' }),
    where: h('div', { className: 'jp-gpusched-page-where' }),
    outputs: h('div', { className: 'jp-gpusched-page-outputs' }),
    history: h('div', { className: 'jp-gpusched-page-history' }),
    timeline: h('div', { className: 'jp-gpusched-page-timeline' })
  };

  constructor(
    private readonly model: GpuschedModel,
    readonly jobId: number,
    private readonly openNotebook: (path: string) => void
  ) {
    super();
    this.addClass('jp-gpusched-page-details');
    this.node.append(...Object.values(this.sections));
    model.changed.connect(this.onModel, this);
    this.timer = setInterval(() => void this.refreshHistory(), HISTORY_MS);
    void this.refresh();
  }

  private get client(): GpuschedClient {
    return this.model.client;
  }

  dispose(): void {
    clearInterval(this.timer);
    this.model.changed.disconnect(this.onModel, this);
    super.dispose();
  }

  /** The model heard about this job (an event): reload what may have changed. */
  private onModel(): void {
    const known = this.model.state.jobs.get(this.jobId);
    if (known && this.job && JSON.stringify(known) !== JSON.stringify(this.job)) {
      void this.refresh();
    }
  }

  /** Load the job, its timeline and its GPU history, then draw. */
  async refresh(): Promise<void> {
    try {
      const [job, events] = await Promise.all([
        this.client.job(this.jobId),
        this.client.jobEvents(this.jobId)
      ]);
      this.job = job;
      this.events = events;
    } catch (err) {
      this.sections.head.replaceChildren(
        h('p', { className: 'jp-gpusched-error' }, `Job ${this.jobId}: ${(err as Error).message}`)
      );
      return;
    }
    await this.refreshHistory(true);
    this.render();
  }

  private async refreshHistory(force = false): Promise<void> {
    const live = this.job && !TERMINAL_STATES.includes(this.job.state);
    if (!this.job?.started_at || (!live && !force) || !this.isAttached) {
      return;
    }
    try {
      this.history = await this.client.history({ job: this.jobId, points: 300 });
    } catch (err) {
      console.warn('gpusched: history failed', err);
    }
    this.renderHistory();
  }

  private render(): void {
    const job = this.job!;
    const now = Date.now();
    const row = queueRow(job, now, this.model.me());
    this.title.label = `Job ${job.id}: ${jobName(job)}`;
    this.sections.head.replaceChildren(
      h(
        'h2',
        {},
        h('span', { className: `jp-gpusched-state jp-mod-${job.state}` }, job.state),
        ` job ${job.id} · ${jobName(job)}`,
        row.cancellable
          ? h(
              'button',
              {
                className: 'jp-mod-styled jp-mod-warn jp-gpusched-page-cancel',
                title:
                  job.state === 'queued'
                    ? 'Take it out of the queue'
                    : 'Stop it (its GPUs go back to the queue)',
                onclick: () => void this.cancel()
              },
              'Cancel job'
            )
          : null
      ),
      h(
        'p',
        { className: 'jp-gpusched-page-sub' },
        `by ${job.user} · submitted ${clockLabel(job.submitted_at, now)}` +
          (row.runtime ? ` · ran ${row.runtime}` : '') +
          (job.exit_code !== null && job.exit_code !== undefined
            ? ` · exit code ${job.exit_code}`
            : '')
      )
    );
    this.sections.why.replaceChildren(
      ...(job.state === 'queued'
        ? [
            h('h3', {}, 'Why it waits, and until when'),
            h(
              'p',
              { className: 'jp-gpusched-page-eta' },
              [row.position, row.eta].filter(Boolean).join(' · ')
            ),
            h('p', { className: 'jp-gpusched-reason' }, job.reason ?? 'no reason yet')
          ]
        : [])
    );
    const params = Object.entries(job.spec.parameters ?? {});
    this.sections.spec.replaceChildren(
      h('h3', {}, 'Request'),
      table(specRows(job)),
      ...(params.length
        ? [h('h3', {}, 'Parameters'), table(params.map(([k, v]) => [k, JSON.stringify(v)]))]
        : [])
    );
    const p = job.placement;
    this.sections.where.replaceChildren(
      h('h3', {}, 'Where'),
      p
        ? table([
            ['node', p.node],
            ['GPUs', p.gpu_indices.join(', ') || 'none'],
            [
              'of each GPU',
              p.share_per_gpu < 1
                ? p.gpu_mem_gb
                  ? formatSize(p.gpu_mem_gb)
                  : gpuCount(p.share_per_gpu)
                : 'all of it'
            ]
          ])
        : h('p', { className: 'jp-gpusched-hint' }, 'not placed yet')
    );
    this.renderOutputs(job);
    this.renderHistory();
    this.sections.timeline.replaceChildren(
      h('h3', {}, 'Timeline'),
      h(
        'ol',
        { className: 'jp-gpusched-timeline' },
        this.events.map(e =>
          h(
            'li',
            { 'data-kind': e.kind, 'data-to-state': e.to_state ?? '' },
            h('span', { className: 'jp-gpusched-when' }, clockLabel(e.at, now)),
            ' ',
            timelineText(e)
          )
        )
      )
    );
  }

  private async cancel(): Promise<void> {
    if (this.job && (await cancelJob(this.model, this.job.id, jobName(this.job)))) {
      await this.refresh();
    }
  }

  private renderOutputs(job: IJob): void {
    const output = outputNotebook(job);
    const buttons: Node[] = [];
    if (output) {
      buttons.push(
        button('jp-gpusched-open-output', `open ${output}`, () => this.openNotebook(output)),
        button(
          'jp-gpusched-download-notebook',
          'download notebook',
          () => void this.download(() => this.client.output(job.id, 'notebook'), basename(output))
        )
      );
    }
    if (job.started_at) {
      const logName = `job-${job.id}.log`;
      buttons.push(
        button(
          'jp-gpusched-download-log',
          'download log',
          () =>
            void this.download(
              async () =>
                new Blob([stripProgress(await this.client.logText(job.id))], {
                  type: 'text/plain'
                }),
              logName
            )
        )
      );
    }
    this.sections.outputs.replaceChildren(
      h('h3', {}, 'Outputs'),
      buttons.length
        ? h('div', { className: 'jp-gpusched-page-buttons' }, buttons)
        : h('p', { className: 'jp-gpusched-hint' }, 'none yet')
    );
  }

  private renderHistory(): void {
    const series = this.history?.series ?? [];
    const interval = this.history?.interval_s;
    const note = this.history
      ? `one sample per probe (every ${runtimeLabel(this.history.interval_s)}); the last ` +
        `${this.history.kept_samples} per GPU are kept, until the server restarts`
      : '';
    this.sections.history.replaceChildren(
      h('h3', {}, 'Its GPUs over its life'),
      series.length
        ? h(
            'div',
            { className: 'jp-gpusched-charts' },
            chartSvg(chartModel(series, 'util', { intervalS: interval })),
            chartSvg(chartModel(series, 'memory', { intervalS: interval }))
          )
        : h(
            'p',
            { className: 'jp-gpusched-hint' },
            this.job?.started_at ? 'no samples of its GPUs (yet)' : 'it has not started yet'
          ),
      ...(note ? [h('p', { className: 'jp-gpusched-hint' }, note)] : [])
    );
  }

  private async download(blob: () => Promise<Blob>, name: string): Promise<void> {
    const url = URL.createObjectURL(await blob());
    const a = h('a', { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }
}

/** The page: details, then the job's log streaming below. */
export class JobPage extends Panel {
  constructor(model: GpuschedModel, jobId: number, openNotebook: (path: string) => void) {
    super();
    this.id = `gpusched-job-${jobId}`;
    this.addClass('jp-gpusched-page');
    this.title.label = `Job ${jobId}`;
    this.title.closable = true;
    const details = new JobDetails(model, jobId, openNotebook);
    details.title.changed.connect(() => (this.title.label = details.title.label));
    this.addWidget(details);
    const log = new LogView(model.client, jobId);
    log.id = `gpusched-page-log-${jobId}`;
    this.addWidget(log);
  }

  /** Closing the tab ends the page (its timers, its log stream); opening makes a new one. */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }
}

function table(rows: [string, string][]): HTMLElement {
  return h(
    'table',
    { className: 'jp-gpusched-kv' },
    rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v)))
  );
}

function button(className: string, label: string, onclick: () => void): HTMLElement {
  return h('button', { className: `jp-mod-styled ${className}`, onclick }, label);
}

function basename(path: string): string {
  return path.split('/').pop() || path;
}

/** A log without the notebook runner's progress lines (they are for the status line). */
function stripProgress(log: string): string {
  const { text, rest } = splitLog('', log);
  return text + rest;
}
