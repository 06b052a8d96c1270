/**
 * The sidebar panel: cluster map, queue (mine / all) with cancel, logs and executed notebooks,
 * the window in force, my schedules (recurring notebooks) with pause/resume/delete, my leases
 * with release. Plain DOM; each section is redrawn only when what it shows
 * changed, so hover details stay put while events stream in.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { notebookIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import { GpuschedApiError } from './api';
import { GPU_STATE_COLOURS, GPU_STATE_LABELS, GPU_STATES, MEM_FILL_COLOUR } from './colors';
import { GpuschedModel } from './controller';
import { h } from './dom';
import {
  definitionRow,
  IDefinitionRow,
  myLeases,
  nodeRows,
  queueJobs,
  queueRow,
  windowLine
} from './model';
import { ICluster } from './types';

/** Rows of the queue shown at most (the newest finished ones drop off first). */
const MAX_ROWS = 50;

export class GpuschedPanel extends Widget {
  private scope: 'mine' | 'all' = 'mine';
  private keys = new Map<string, string>();
  private sections: Record<'status' | 'map' | 'queue' | 'schedules' | 'leases', HTMLElement>;
  private ticker: ReturnType<typeof setInterval>;

  constructor(
    private readonly model: GpuschedModel,
    private readonly openLog: (jobId: number) => void,
    private readonly openNotebook: (path: string) => void
  ) {
    super();
    this.id = 'gpusched-panel';
    this.addClass('jp-gpusched-panel');
    this.title.caption = 'GPU cluster';
    this.sections = {
      status: h('div', { className: 'jp-gpusched-status' }),
      map: h('div', { className: 'jp-gpusched-map' }),
      queue: h('div', { className: 'jp-gpusched-queue' }),
      schedules: h('div', { className: 'jp-gpusched-schedules' }),
      leases: h('div', { className: 'jp-gpusched-leases' })
    };
    this.node.append(
      h('h2', { className: 'jp-gpusched-title' }, 'GPU cluster'),
      this.sections.status,
      this.sections.map,
      this.sections.queue,
      this.sections.schedules,
      this.sections.leases
    );
    model.changed.connect(() => this.render(), this);
    // Runtimes tick while the panel is open.
    this.ticker = setInterval(() => this.isVisible && this.render(), 1000);
    this.render();
  }

  dispose(): void {
    clearInterval(this.ticker);
    super.dispose();
  }

  /** Redraw the sections whose content changed. */
  render(): void {
    const m = this.model;
    const now = Date.now();
    if (m.status !== 'ready') {
      this.update1('status', `${m.status}:${m.error?.message}`, () => this.renderProblem());
      for (const k of ['map', 'queue', 'schedules', 'leases'] as const) {
        this.update1(k, 'empty', () => []);
      }
      return;
    }
    const cluster = m.state.cluster!;
    const me = m.me();
    const jobs = [...m.state.jobs.values()];
    const rows = queueJobs(jobs, this.scope, me)
      .slice(0, MAX_ROWS)
      .map(j => queueRow(j, now, me));
    const leases = myLeases(jobs, me).map(j => queueRow(j, now, me));
    this.update1(
      'status',
      JSON.stringify([windowLine(cluster.window, now), cluster.metrics, cluster.queue, m.stream]),
      () => this.renderStatus(cluster, now)
    );
    this.update1('map', JSON.stringify(cluster.nodes), () => this.renderMap(cluster));
    this.update1('queue', JSON.stringify([this.scope, rows]), () => this.renderQueue(rows));
    const schedules = m.definitions?.map(d => definitionRow(d, now)) ?? null;
    this.update1('schedules', JSON.stringify(schedules), () => this.renderSchedules(schedules));
    this.update1('leases', JSON.stringify(leases), () => this.renderLeases(leases));
  }

  private update1(name: keyof GpuschedPanel['sections'], key: string, build: () => Node[]): void {
    if (this.keys.get(name) === key) {
      return;
    }
    this.keys.set(name, key);
    this.sections[name].replaceChildren(...build());
  }

  private renderProblem(): Node[] {
    const m = this.model;
    if (m.status === 'loading') {
      return [h('p', { className: 'jp-gpusched-hint' }, 'Loading the cluster…')];
    }
    const err = m.error ?? new GpuschedApiError(0, 'Error', 'unknown error');
    let advice: (Node | string)[];
    if (err.status === 404) {
      advice = [
        'The gpusched server extension is not running on this Jupyter server. Enable it with ',
        h('code', {}, 'jupyter server extension enable jupyter_gpusched'),
        ' and restart Jupyter.'
      ];
    } else if (err.status === 0) {
      advice = ['Cannot reach the Jupyter server. Check that it is still running, then retry.'];
    } else {
      advice = [`${err.message} (HTTP ${err.status}).`];
    }
    return [
      h('div', { className: 'jp-gpusched-error' }, h('p', {}, ...advice)),
      h(
        'button',
        { className: 'jp-mod-styled jp-gpusched-retry', onclick: () => void m.start() },
        'Retry'
      )
    ];
  }

  private renderStatus(cluster: ICluster, now: number): Node[] {
    const mt = cluster.metrics ?? {};
    const live = this.model.stream === 'open';
    const figures = [
      `${mt.gpus_free ?? '?'}/${mt.gpus_total ?? '?'} GPUs free`,
      mt.largest_placeable_gpus !== undefined
        ? `largest job ${mt.largest_placeable_gpus} GPUs`
        : '',
      mt.frag_ratio !== undefined ? `fragmentation ${mt.frag_ratio.toFixed(2)}` : '',
      `${cluster.queue?.queued ?? 0} waiting, ${cluster.queue?.running ?? 0} running`
    ].filter(Boolean);
    return [
      h(
        'div',
        { className: 'jp-gpusched-window', title: cluster.window?.applies ?? '' },
        h('span', {
          className: `jp-gpusched-live ${live ? 'jp-mod-live' : ''}`,
          title: live
            ? 'live: following scheduler events'
            : `events: ${this.model.stream}, reconnecting`
        }),
        windowLine(cluster.window, now)
      ),
      h('div', { className: 'jp-gpusched-figures' }, figures.join(' · '))
    ];
  }

  private renderMap(cluster: ICluster): Node[] {
    if (cluster.nodes.length === 0) {
      return [
        h(
          'div',
          { className: 'jp-gpusched-empty' },
          h(
            'p',
            {},
            'The scheduler knows no GPU nodes yet (the first probe can take a few seconds).'
          ),
          h(
            'p',
            {},
            'To add your GPU servers, list them in jupyter_server_config.py and restart Jupyter: ',
            h(
              'code',
              {},
              'c.GpuSchedApp.nodes = [{"name": "gpu1", "host": "gpu1.lab", "username": "me", "key_file": "~/.ssh/id_ed25519"}]'
            ),
            '. With no nodes listed, the embedded simulated cluster runs.'
          )
        )
      ];
    }
    const rows = nodeRows(cluster).map(row =>
      h(
        'div',
        { className: 'jp-gpusched-node', 'data-node': row.name, 'data-up': String(row.up) },
        h('div', { className: 'jp-gpusched-node-name', title: row.error ?? row.summary }, row.name),
        h(
          'div',
          { className: 'jp-gpusched-gpus' },
          row.cells.map(cell =>
            h(
              'div',
              {
                className: 'jp-gpusched-gpu',
                'data-gpu': cell.key,
                'data-state': cell.state,
                title: cell.title,
                style: `background:${cell.colour}`
              },
              h('div', {
                className: 'jp-gpusched-mem',
                style: `height:${cell.memFillPct}%;background:${MEM_FILL_COLOUR}`
              }),
              h('span', { className: `jp-gpusched-gpu-label jp-mod-${cell.state}` }, cell.label)
            )
          )
        ),
        h('div', { className: 'jp-gpusched-node-summary' }, row.summary),
        row.error ? h('div', { className: 'jp-gpusched-node-error' }, row.error) : null
      )
    );
    const legend = h(
      'div',
      { className: 'jp-gpusched-legend' },
      GPU_STATES.map(s =>
        h(
          'span',
          { className: 'jp-gpusched-legend-item' },
          h('span', {
            className: 'jp-gpusched-swatch',
            style: `background:${GPU_STATE_COLOURS[s]}`
          }),
          GPU_STATE_LABELS[s]
        )
      ),
      h('span', { className: 'jp-gpusched-legend-item' }, '▮ shade = memory used')
    );
    return [...rows, legend];
  }

  private renderQueue(rows: ReturnType<typeof queueRow>[]): Node[] {
    const tab = (scope: 'mine' | 'all', label: string) =>
      h(
        'button',
        {
          className: `jp-gpusched-tab ${this.scope === scope ? 'jp-mod-active' : ''}`,
          'data-scope': scope,
          onclick: () => {
            this.scope = scope;
            this.render();
          }
        },
        label
      );
    const head = h(
      'div',
      { className: 'jp-gpusched-section-head' },
      h('h3', {}, 'Queue'),
      tab('mine', 'Mine'),
      tab('all', 'All')
    );
    if (rows.length === 0) {
      return [
        head,
        h(
          'p',
          { className: 'jp-gpusched-hint' },
          this.scope === 'mine' ? 'You have no jobs. ' : 'The queue is empty. ',
          'Right-click a notebook in the file browser and choose “Submit to GPU queue…”, or run ',
          h('code', {}, '%gpu submit train.py --gpus 1'),
          ' in a notebook.'
        )
      ];
    }
    const list = h(
      'div',
      { className: 'jp-gpusched-jobs' },
      rows.map(r =>
        h(
          'div',
          {
            className: 'jp-gpusched-job-row',
            'data-job-id': String(r.id),
            'data-state': r.state,
            title: r.reason
          },
          h(
            'div',
            { className: 'jp-gpusched-job-line' },
            h('span', { className: `jp-gpusched-state jp-mod-${r.state}` }, r.state),
            h('span', { className: 'jp-gpusched-job' }, `#${r.id} ${r.name}`),
            this.scope === 'all' ? h('span', { className: 'jp-gpusched-user' }, r.user) : null,
            h(
              'span',
              { className: 'jp-gpusched-actions' },
              h(
                'button',
                {
                  className: 'jp-gpusched-log-button',
                  title: 'Show the log',
                  onclick: () => this.openLog(r.id)
                },
                'log'
              ),
              r.output
                ? h(
                    'button',
                    {
                      className: 'jp-gpusched-output-button',
                      title: `Open the executed notebook ${r.output}`,
                      onclick: () => this.openNotebook(r.output!)
                    },
                    notebookIcon.element({ tag: 'span', height: '14px', width: '14px' })
                  )
                : null,
              r.cancellable
                ? h(
                    'button',
                    {
                      className: 'jp-gpusched-cancel',
                      title: 'Cancel this job',
                      onclick: () => void this.cancel(r.id, r.name)
                    },
                    '✕'
                  )
                : null
            )
          ),
          h(
            'div',
            { className: 'jp-gpusched-job-meta' },
            r.position
              ? h(
                  'span',
                  { className: 'jp-gpusched-position', title: 'position in the queue' },
                  r.position
                )
              : null,
            h('span', { className: 'jp-gpusched-where', title: 'node: GPUs' }, r.node),
            h('span', { className: 'jp-gpusched-size', title: 'GPUs requested' }, r.gpus),
            r.runtime
              ? h('span', { className: 'jp-gpusched-runtime', title: 'runtime' }, r.runtime)
              : null
          ),
          r.reason && r.state === 'queued'
            ? h('div', { className: 'jp-gpusched-reason' }, r.reason)
            : null
        )
      )
    );
    return [head, list];
  }

  private renderSchedules(rows: IDefinitionRow[] | null): Node[] {
    if (rows === null) {
      return [];
    }
    const head = h('div', { className: 'jp-gpusched-section-head' }, h('h3', {}, 'Schedules'));
    if (rows.length === 0) {
      return [
        head,
        h(
          'p',
          { className: 'jp-gpusched-hint' },
          'No schedules. To run a notebook on a schedule, choose “repeat (cron)” in ',
          '“Submit to GPU queue…”.'
        )
      ];
    }
    const list = h(
      'div',
      { className: 'jp-gpusched-definitions' },
      rows.map(r =>
        h(
          'div',
          {
            className: 'jp-gpusched-definition-row',
            'data-definition-id': String(r.id),
            'data-paused': String(r.paused),
            title: r.notebook
          },
          h(
            'div',
            { className: 'jp-gpusched-job-line' },
            h('span', { className: 'jp-gpusched-job' }, `${r.name}`),
            h(
              'span',
              { className: 'jp-gpusched-actions' },
              h(
                'button',
                {
                  className: 'jp-gpusched-pause',
                  title: r.paused
                    ? 'Resume: run again on schedule'
                    : 'Pause: skip runs until resumed',
                  onclick: () => void this.setPaused(r.id, !r.paused)
                },
                r.paused ? 'resume' : 'pause'
              ),
              h(
                'button',
                {
                  className: 'jp-gpusched-delete',
                  title: 'Delete this schedule (jobs it made stay)',
                  onclick: () => void this.deleteDefinition(r.id, r.name)
                },
                '✕'
              )
            )
          ),
          h(
            'div',
            { className: 'jp-gpusched-job-meta' },
            h('code', { className: 'jp-gpusched-cron', title: 'cron schedule' }, r.schedule),
            h(
              'span',
              { className: 'jp-gpusched-tz', title: 'time zone of the schedule' },
              r.timezone
            ),
            h('span', { className: `jp-gpusched-next ${r.paused ? 'jp-mod-paused' : ''}` }, r.next),
            h('span', { className: 'jp-gpusched-size', title: 'GPUs per run' }, r.gpus),
            h('span', { className: 'jp-gpusched-runs' }, r.runs)
          )
        )
      )
    );
    return [head, list];
  }

  private async setPaused(id: number, paused: boolean): Promise<void> {
    try {
      await this.model.client.setPaused(id, paused);
    } catch (err) {
      void showErrorMessage(
        `Could not ${paused ? 'pause' : 'resume'} schedule #${id}`,
        (err as Error).message
      );
    }
    await this.model.refreshDefinitions();
  }

  private async deleteDefinition(id: number, name: string): Promise<void> {
    const answer = await showDialog({
      title: `Delete schedule ${name}?`,
      body: 'It will not run again. Jobs it already made, and their notebooks, stay.',
      buttons: [Dialog.cancelButton({ label: 'Keep' }), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await this.model.client.deleteDefinition(id);
    } catch (err) {
      void showErrorMessage(`Could not delete schedule #${id}`, (err as Error).message);
    }
    await this.model.refreshDefinitions();
  }

  private renderLeases(leases: ReturnType<typeof queueRow>[]): Node[] {
    const head = h('div', { className: 'jp-gpusched-section-head' }, h('h3', {}, 'My leases'));
    if (leases.length === 0) {
      return [
        head,
        h(
          'p',
          { className: 'jp-gpusched-hint' },
          'No active leases. Run a cell with ',
          h('code', {}, '%%gpu --gpus 1'),
          ' to get one.'
        )
      ];
    }
    return [
      head,
      h(
        'ul',
        { className: 'jp-gpusched-lease-list' },
        leases.map(l =>
          h(
            'li',
            { 'data-job-id': String(l.id), 'data-state': l.state },
            h('span', { className: `jp-gpusched-state jp-mod-${l.state}` }, l.state),
            ` #${l.id} ${l.node} · ${l.gpus} · ${l.runtime}`,
            h(
              'button',
              { className: 'jp-gpusched-release', onclick: () => void this.release(l.id) },
              'release'
            )
          )
        )
      )
    ];
  }

  private async cancel(id: number, name: string): Promise<void> {
    const answer = await showDialog({
      title: `Cancel job #${id}?`,
      body: `${name} will be removed from the queue, or stopped if it runs.`,
      buttons: [Dialog.cancelButton({ label: 'Keep' }), Dialog.warnButton({ label: 'Cancel job' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await this.model.client.cancel(id);
      await this.model.refreshJob(id);
    } catch (err) {
      void showErrorMessage(`Could not cancel job #${id}`, (err as Error).message);
    }
  }

  private async release(id: number): Promise<void> {
    try {
      await this.model.client.release(id);
      await this.model.refreshJob(id);
    } catch (err) {
      void showErrorMessage(`Could not release lease #${id}`, (err as Error).message);
    }
  }
}
