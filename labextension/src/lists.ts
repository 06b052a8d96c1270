/**
 * The panel's lists as DOM: the queue (with why and when for waiting jobs), my leases (named
 * by their notebook) and my schedules (in words). Actions go through callbacks, so the panel
 * owns confirmation dialogs and refreshes.
 */
import { notebookIcon } from '@jupyterlab/ui-components';
import { h } from './dom';
import { IDefinitionRow, IQueueRow } from './model';

/** What a list row can ask the panel to do. */
export interface IListActions {
  openJob(id: number): void;
  openLog(id: number): void;
  openNotebook(path: string): void;
  cancel(id: number, name: string): void;
  release(id: number, notebook: string | null): void;
  setPaused(id: number, paused: boolean): void;
  deleteDefinition(id: number, name: string): void;
}

/** Which jobs the queue shows: live ones, finished ones, or all. */
export type QueueFilter = 'live' | 'finished' | 'all';

/** The queue's rows (the head with tabs and filters is the panel's). */
export function queueList(rows: IQueueRow[], all: boolean, act: IListActions): HTMLElement {
  return h(
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
          h(
            'a',
            {
              className: 'jp-gpusched-job',
              title: 'Open the job’s page: spec, timeline, GPUs over time, log, outputs',
              onclick: () => act.openJob(r.id)
            },
            `job ${r.id} · ${r.name}`
          ),
          all ? h('span', { className: 'jp-gpusched-user' }, r.user) : null,
          h(
            'span',
            { className: 'jp-gpusched-actions' },
            h(
              'button',
              {
                className: 'jp-gpusched-log-button',
                title: 'Show the log',
                onclick: () => act.openLog(r.id)
              },
              'log'
            ),
            r.output
              ? h(
                  'button',
                  {
                    className: 'jp-gpusched-output-button',
                    title: `Open the executed notebook ${r.output}`,
                    onclick: () => act.openNotebook(r.output!)
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
                    onclick: () => act.cancel(r.id, r.name)
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
                { className: 'jp-gpusched-position', title: 'place in the queue' },
                r.position
              )
            : null,
          r.eta
            ? h(
                'span',
                {
                  className: 'jp-gpusched-eta',
                  title:
                    r.etaNote || 'expected start, from the running jobs’ declared or estimated ends'
                },
                r.eta
              )
            : null,
          r.arrayPending
            ? h(
                'span',
                {
                  className: 'jp-gpusched-array-pending',
                  title: 'tasks of its array waiting behind it; each becomes a job as it can start'
                },
                r.arrayPending
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
          : null,
        r.etaNudge ? h('div', { className: 'jp-gpusched-eta-note' }, r.etaNudge) : null
      )
    )
  );
}

/** My leases, each named by the notebook its `%%gpu` cells come from. */
export function leaseList(leases: IQueueRow[], act: IListActions): HTMLElement {
  return h(
    'ul',
    { className: 'jp-gpusched-lease-list' },
    leases.map(l =>
      h(
        'li',
        { 'data-job-id': String(l.id), 'data-state': l.state },
        h('span', { className: `jp-gpusched-state jp-mod-${l.state}` }, l.state),
        ' ',
        h('a', { className: 'jp-gpusched-job', onclick: () => act.openJob(l.id) }, `lease ${l.id}`),
        l.notebook
          ? h(
              'span',
              { className: 'jp-gpusched-lease-notebook', title: 'the notebook it serves' },
              ` · ${l.notebook}`
            )
          : null,
        ` · ${l.node} · ${l.gpus}${l.runtime ? ` · ${l.runtime}` : ''}`,
        l.state === 'queued' && l.eta
          ? h('span', { className: 'jp-gpusched-eta' }, ` · ${l.eta}`)
          : null,
        h(
          'button',
          { className: 'jp-gpusched-release', onclick: () => act.release(l.id, l.notebook) },
          'release'
        )
      )
    )
  );
}

/** My schedules: in words with the next run, the cron and zone beside. */
export function scheduleList(rows: IDefinitionRow[], act: IListActions): HTMLElement {
  return h(
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
                onclick: () => act.setPaused(r.id, !r.paused)
              },
              r.paused ? 'resume' : 'pause'
            ),
            h(
              'button',
              {
                className: 'jp-gpusched-delete',
                title: 'Delete this schedule (jobs it made stay)',
                onclick: () => act.deleteDefinition(r.id, r.name)
              },
              '✕'
            )
          )
        ),
        h('div', { className: `jp-gpusched-next ${r.paused ? 'jp-mod-paused' : ''}` }, r.next),
        h(
          'div',
          { className: 'jp-gpusched-job-meta' },
          h('code', { className: 'jp-gpusched-cron', title: 'cron schedule' }, r.schedule),
          h(
            'span',
            { className: 'jp-gpusched-tz', title: 'time zone of the schedule' },
            r.timezone
          ),
          h('span', { className: 'jp-gpusched-size', title: 'GPUs per run' }, r.gpus),
          h('span', { className: 'jp-gpusched-runs' }, r.runs)
        )
      )
    )
  );
}
