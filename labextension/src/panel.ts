/**
 * The sidebar panel, in the order a newcomer asks: what is free (GPUs free, the largest job
 * that fits now), the cluster map (hover a GPU: its job's GPUs; click: the job's page), my
 * jobs (mine / all, live / finished, clear finished) with why and when each waits, my leases
 * by notebook, my schedules in words; the policy window in force and its rules last. Plain DOM; each section is redrawn only when what it shows changed, so
 * hover details stay put while events stream in. `wide` lays it out for the main area.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';
import { cancelJob } from './actions';
import { GpuschedApiError } from './api';
import { GpuschedModel } from './controller';
import { h } from './dom';
import { fragmentationText } from './format';
import { IListActions, leaseList, QueueFilter, queueList, scheduleList } from './lists';
import { renderMap } from './map';
import {
  clearFinished,
  definitionRow,
  filterJobs,
  IDefinitionRow,
  myLeases,
  queueJobs,
  queueRow,
  windowLine
} from './model';
import { ICluster } from './types';

/** Rows of the queue shown at most (the newest finished ones drop off first). */
const MAX_ROWS = 50;
/** Where the ids of cleared finished jobs are kept in the browser. */
const CLEARED_KEY = 'jupyter-gpusched:cleared-jobs';

/** What the panel opens elsewhere in JupyterLab. */
export interface IPanelOpeners {
  openLog(jobId: number): void;
  openNotebook(path: string): void;
  openJob(jobId: number): void;
  openDashboard(): void;
  /** The "Submit script…" dialog (for the .py file selected in the file browser, if any). */
  submitScript(): void;
}

export class GpuschedPanel extends Widget {
  private scope: 'mine' | 'all' = 'mine';
  private filter: QueueFilter = 'all';
  private cleared: Set<number>;
  private keys = new Map<string, string>();
  private sections: Record<
    'free' | 'map' | 'queue' | 'leases' | 'schedules' | 'policy',
    HTMLElement
  >;
  private ticker: ReturnType<typeof setInterval>;
  private actions: IListActions;

  constructor(
    private readonly model: GpuschedModel,
    private readonly open: IPanelOpeners,
    readonly wide = false
  ) {
    super();
    this.id = wide ? 'gpusched-dashboard-panel' : 'gpusched-panel';
    this.addClass('jp-gpusched-panel');
    if (wide) {
      this.addClass('jp-mod-wide');
    }
    // The sidebar shows only the icon: its tooltip (and a screen reader) names it.
    this.title.caption = wide ? 'GPU cluster' : 'GPU scheduler';
    this.cleared = readCleared();
    this.sections = {
      free: h('div', { className: 'jp-gpusched-status' }),
      map: h('div', { className: 'jp-gpusched-map' }),
      queue: h('div', { className: 'jp-gpusched-queue' }),
      leases: h('div', { className: 'jp-gpusched-leases' }),
      schedules: h('div', { className: 'jp-gpusched-schedules' }),
      policy: h('div', { className: 'jp-gpusched-policy' })
    };
    const title = h(
      'div',
      { className: 'jp-gpusched-title-row' },
      h('h2', { className: 'jp-gpusched-title' }, 'GPU cluster'),
      wide
        ? null
        : h(
            'button',
            {
              className: 'jp-gpusched-open-dashboard',
              title: 'Open as a wide dashboard with GPU history charts',
              onclick: () => this.open.openDashboard()
            },
            '⤢ dashboard'
          )
    );
    this.node.append(title, ...Object.values(this.sections));
    this.actions = {
      openJob: id => this.open.openJob(id),
      openLog: id => this.open.openLog(id),
      openNotebook: path => this.open.openNotebook(path),
      cancel: (id, name) => void cancelJob(model, id, name),
      release: (id, notebook) => void this.release(id, notebook),
      setPaused: (id, paused) => void this.setPaused(id, paused),
      deleteDefinition: (id, name) => void this.deleteDefinition(id, name)
    };
    model.changed.connect(() => this.render(), this);
    // Runtimes and expected starts tick while the panel is open.
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
      this.update1('free', `${m.status}:${m.error?.message}`, () => this.renderProblem());
      for (const k of ['map', 'queue', 'leases', 'schedules', 'policy'] as const) {
        this.update1(k, 'empty', () => []);
      }
      return;
    }
    const cluster = m.state.cluster!;
    const me = m.me();
    const jobs = [...m.state.jobs.values()];
    const shown = filterJobs(queueJobs(jobs, this.scope, me), this.filter, this.cleared);
    const rows = shown.slice(0, MAX_ROWS).map(j => queueRow(j, now, me, m.arrays));
    const leases = myLeases(jobs, me).map(j => queueRow(j, now, me));
    this.update1(
      'free',
      JSON.stringify([cluster.metrics, cluster.queue, m.stream, m.streamRefused]),
      () => this.renderFree(cluster)
    );
    this.update1('map', JSON.stringify(cluster.nodes), () =>
      renderMap(cluster, id => this.open.openJob(id))
    );
    this.update1('queue', JSON.stringify([this.scope, this.filter, rows]), () =>
      this.renderQueue(rows)
    );
    const schedules = m.definitions?.map(d => definitionRow(d, now)) ?? null;
    this.update1('schedules', JSON.stringify(schedules), () => this.renderSchedules(schedules));
    this.update1('leases', JSON.stringify(leases), () => this.renderLeases(leases));
    this.update1('policy', JSON.stringify([windowLine(cluster.window, now), cluster.window]), () =>
      this.renderPolicy(cluster, now)
    );
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

  /** What is free now, first: GPUs free, the queue's size, the largest job that fits. */
  private renderFree(cluster: ICluster): Node[] {
    const mt = cluster.metrics ?? {};
    const live = this.model.stream === 'open';
    return [
      h(
        'div',
        { className: 'jp-gpusched-figures' },
        h('span', {
          className: `jp-gpusched-live ${live ? 'jp-mod-live' : ''}`,
          title: live
            ? 'live: following scheduler events'
            : `events: ${this.model.stream}, reconnecting`
        }),
        h('b', {}, `${mt.gpus_free ?? '?'}/${mt.gpus_total ?? '?'} GPUs free`),
        ` · ${cluster.queue?.queued ?? 0} waiting, ${cluster.queue?.running ?? 0} running`
      ),
      ...refusedLine(this.model.streamRefused),
      h(
        'div',
        {
          className: 'jp-gpusched-fragmentation',
          title:
            'Stranded GPUs are free shares of partly used GPUs: jobs asking for whole GPUs ' +
            'cannot use them. The last figure is the share of free capacity that fits none ' +
            'of the job sizes seen lately.'
        },
        fragmentationText(mt)
      )
    ];
  }

  /** The policy window in force and its rules: below what a user acts on. */
  private renderPolicy(cluster: ICluster, now: number): Node[] {
    const w = cluster.window;
    return [
      h('div', { className: 'jp-gpusched-section-head' }, h('h3', {}, 'Policy now')),
      h(
        'div',
        { className: 'jp-gpusched-window', title: w?.applies ?? '' },
        h('span', {}, windowLine(w, now)),
        w?.applies ? h('span', { className: 'jp-gpusched-applies' }, ` (${w.applies})`) : null
      ),
      h(
        'ul',
        { className: 'jp-gpusched-rules', title: 'the rules of the window in force' },
        (w?.rules ?? []).map(rule => h('li', {}, rule))
      )
    ];
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
    const filter = h(
      'select',
      {
        className: 'jp-gpusched-filter',
        title: 'Which jobs to list',
        onchange: (ev: Event) => {
          this.filter = (ev.target as HTMLSelectElement).value as QueueFilter;
          this.render();
        }
      },
      (['all', 'live', 'finished'] as QueueFilter[]).map(f =>
        h('option', { value: f, selected: this.filter === f }, f)
      )
    );
    const clear = h(
      'button',
      {
        className: 'jp-gpusched-clear',
        title: 'Hide the finished jobs listed now (in this browser)',
        onclick: () => {
          this.cleared = clearFinished(this.model.state.jobs.values(), this.cleared);
          writeCleared(this.cleared);
          this.render();
        }
      },
      'clear finished'
    );
    const head = h(
      'div',
      { className: 'jp-gpusched-section-head' },
      h('h3', {}, this.scope === 'mine' ? 'My jobs' : 'All jobs'),
      tab('mine', 'Mine'),
      tab('all', 'All'),
      filter,
      clear,
      h(
        'button',
        {
          className: 'jp-gpusched-submit-script',
          title: 'Run a Python script as a batch job (or right-click a .py file)',
          onclick: () => this.open.submitScript()
        },
        'Submit script…'
      )
    );
    if (rows.length === 0) {
      return [
        head,
        h(
          'p',
          { className: 'jp-gpusched-hint' },
          this.scope === 'mine' ? 'You have no jobs here. ' : 'No jobs here. ',
          'Right-click a notebook or a .py file in the file browser and choose “Submit…”, ',
          'press “Submit script…” above, or run ',
          h('code', {}, '%gpu submit train.py --gpus 1'),
          ' in a notebook.'
        )
      ];
    }
    return [head, queueList(rows, this.scope === 'all', this.actions)];
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
    return [head, scheduleList(rows, this.actions)];
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
    return [head, leaseList(leases, this.actions)];
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

  private async release(id: number, notebook: string | null): Promise<void> {
    const answer = await showDialog({
      title: `Release lease ${id}?`,
      body:
        `Its GPUs go back to the queue and its remote kernel stops: the variables that ` +
        `${notebook ?? 'the notebook'}'s %%gpu cells set there are lost, and the next ` +
        '%%gpu cell starts a new lease.',
      buttons: [Dialog.cancelButton({ label: 'Keep' }), Dialog.warnButton({ label: 'Release' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await this.model.client.release(id);
      await this.model.refreshJob(id);
    } catch (err) {
      void showErrorMessage(`Could not release lease ${id}`, (err as Error).message);
    }
  }
}

function readCleared(): Set<number> {
  try {
    const ids = JSON.parse(window.localStorage.getItem(CLEARED_KEY) ?? '[]');
    return new Set(Array.isArray(ids) ? ids.filter(n => typeof n === 'number') : []);
  } catch {
    return new Set();
  }
}

function writeCleared(ids: Set<number>): void {
  try {
    window.localStorage.setItem(CLEARED_KEY, JSON.stringify([...ids]));
  } catch {
    // storage full or off: clearing lasts until the page reloads
  }
}

/** The line saying why live updates are refused (over the user's streams), if they are. */
function refusedLine(why: string | null): Node[] {
  if (why === null) {
    return [];
  }
  return [
    h('div', { className: 'jp-gpusched-error jp-gpusched-refused' }, `Live updates refused: ${why}`)
  ];
}
