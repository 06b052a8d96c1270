import { describe, expect, it } from 'vitest';
import { GPU_STATE_COLOURS, GPU_STATES } from '../src/colors';
import {
  definitionRow,
  gpuCell,
  jobName,
  memFillPct,
  myLeases,
  nodeRows,
  queueJobs,
  queueRow,
  runtimeS,
  windowLine
} from '../src/model';
import type { IArrayView, IJob } from '../src/types';
import { cluster, gpu, job, node } from './fixtures';

const NOW = Date.parse('2026-11-23T10:00:00Z');

describe('colours', () => {
  it('match the documented palette the notebook widget mirrors', () => {
    expect(GPU_STATE_COLOURS).toEqual({
      free: '#e0e0e0',
      interactive: '#2e7d32',
      batch: '#1565c0',
      foreign: '#ef6c00',
      down: '#c62828'
    });
    expect(GPU_STATES).toEqual(['free', 'interactive', 'batch', 'foreign', 'down']);
  });
});

describe('gpuCell', () => {
  it.each([
    ['free', '#e0e0e0'],
    ['interactive', '#2e7d32'],
    ['batch', '#1565c0'],
    ['foreign', '#ef6c00'],
    ['down', '#c62828']
  ])('draws a %s GPU in %s', (state, colour) => {
    const cell = gpuCell({ name: 'a100-0', up: true }, gpu(3, { state }));
    expect(cell.state).toBe(state);
    expect(cell.colour).toBe(colour);
    expect(cell.key).toBe('a100-0/3');
  });

  it('draws every GPU of a down node as down', () => {
    const cell = gpuCell({ name: 'v100-0', up: false }, gpu(0, { state: 'batch' }));
    expect(cell.state).toBe('down');
    expect(cell.colour).toBe('#c62828');
  });

  it('treats an unknown state as foreign use rather than free', () => {
    expect(gpuCell({ name: 'n', up: true }, gpu(0, { state: 'weird' })).state).toBe('foreign');
  });

  it('says who holds the GPU and how much memory is used on hover', () => {
    const g = gpu(2, {
      state: 'batch',
      mem_used_gb: 20,
      util_pct: 87,
      jobs: [{ id: 7, user: 'bob', kind: 'script', share: 0.5 }]
    });
    const title = gpuCell({ name: 'a100-1', up: true }, g).title.split('\n');
    expect(title).toEqual([
      'a100-1 GPU 2 · A100 · batch',
      'memory 20G / 80G · util 87%',
      'job #7 · bob · script (50% share)',
      "click: open job #7's page"
    ]);
    expect(gpuCell({ name: 'a100-1', up: true }, g).jobs).toEqual([7]);
  });
});

describe('memFillPct', () => {
  it.each([
    [0, 80, 0],
    [20, 80, 25],
    [79.9, 80, 100],
    [90, 80, 100],
    [5, 0, 0],
    [-1, 80, 0]
  ])('%s of %s GB fills %s%%', (used, total, pct) => {
    expect(memFillPct({ mem_used_gb: used, mem_total_gb: total })).toBe(pct);
  });
});

describe('nodeRows', () => {
  it('keeps the server order and counts free GPUs per node', () => {
    const rows = nodeRows(
      cluster([
        node('a100-0', [gpu(0), gpu(1, { state: 'batch' })]),
        node('t4-0', [gpu(0, { model: 'T4' })], { up: false, error: 'connection refused' })
      ])
    );
    expect(rows.map(r => [r.name, r.summary, r.error])).toEqual([
      ['a100-0', '1/2 free · A100', null],
      ['t4-0', 'down', 'connection refused']
    ]);
    expect(rows[1].cells.map(c => c.state)).toEqual(['down']);
  });

  it('shows a suspect node with the GPUs its jobs keep and until when', () => {
    const held = { id: 7, user: 'ann', kind: 'script', priority_class: 'batch', share: 1 };
    const rows = nodeRows(
      cluster([
        node('t4-0', [gpu(0, { state: 'batch', jobs: [held] }), gpu(1, { state: 'down' })], {
          up: false,
          health: 'suspect',
          unreachable_since: '2026-11-23T10:00:00Z',
          down_at: '2026-11-23T10:05:00Z'
        })
      ])
    );
    expect(rows[0].summary).toBe('unreachable since 10:00 · jobs kept until 10:05');
    expect(rows[0].cells.map(c => c.state)).toEqual(['batch', 'down']);
  });
});

describe('queue rows', () => {
  it('shows the queue position only while queued', () => {
    expect(queueRow(job(1, { position: 3 }), NOW, 'alice').position).toBe('3rd in line');
    expect(queueRow(job(1, { state: 'running', position: 3 }), NOW, 'alice').position).toBe('');
  });

  it('says what an expected start rests on: a guess reads as one, with its note', () => {
    const note = 'a guess: job 7 set no --max-runtime and has no past runtimes, so 4h is assumed';
    const waiting = job(1, {
      estimated_start: '2026-11-23T13:59:00Z',
      estimate: {
        at: '2026-11-23T13:59:00Z',
        earliest: '2026-11-23T10:00:00Z',
        latest: null,
        basis: 'guess',
        note
      }
    });
    const row = queueRow(waiting, NOW, 'alice');
    expect([row.eta, row.etaNote, row.etaNudge]).toEqual([
      'starts in 3h59m (13:59) by a guess',
      note,
      note
    ]);
    const unknown = job(2, {
      estimated_start: null,
      estimate: { at: null, earliest: null, latest: null, basis: 'unknown', note: 'unknown: …' }
    });
    expect(queueRow(unknown, NOW, 'alice').eta).toBe('starts unknown');
  });

  it('says why a queued job waits and when it is expected to start', () => {
    const waiting = job(1, {
      position: 2,
      reason: 'needs 8 GPUs on one node: the most free on one node is 4 (a100-1)',
      estimated_start: '2026-11-23T10:12:30Z'
    });
    const row = queueRow(waiting, NOW, 'alice');
    expect([row.position, row.eta, row.reason]).toEqual([
      '2nd in line',
      'starts in 12m (10:12)',
      'needs 8 GPUs on one node: the most free on one node is 4 (a100-1)'
    ]);
    expect(queueRow(job(2, { estimated_start: null }), NOW, 'alice').eta).toBe('starts unknown');
    expect(queueRow(job(3, { held: true, reason: 'paused' }), NOW, 'alice')).toMatchObject({
      eta: '',
      reason: 'held · paused'
    });
    expect(queueRow(job(4, { state: 'running' }), NOW, 'alice').eta).toBe('');
  });

  it('counts runtime up to now while running and up to the end once finished', () => {
    const running = job(1, { state: 'running', started_at: '2026-11-23T09:47:57Z' });
    expect(runtimeS(running, NOW)).toBe(723);
    expect(queueRow(running, NOW, 'alice').runtime).toBe('12m3s');
    const done = job(2, {
      state: 'succeeded',
      started_at: '2026-11-23T08:00:00Z',
      finished_at: '2026-11-23T08:00:45Z'
    });
    expect(queueRow(done, NOW, 'alice').runtime).toBe('45s');
    expect(queueRow(job(3), NOW, 'alice').runtime).toBe('');
  });

  it('names node and GPUs once placed', () => {
    const row = queueRow(
      job(1, {
        state: 'running',
        spec: { kind: 'script', command: ['python', 'train.py'], gpus: 2, gpu_mem_gb: 16 },
        placement: { node: 'a100-0', gpu_indices: [0, 1], share_per_gpu: 0.2 }
      }),
      NOW,
      'alice'
    );
    expect([row.node, row.gpus, row.name]).toEqual(['a100-0: 0,1', '2 GPUs × 16G', 'train.py']);
    expect(queueRow(job(3), NOW, 'alice').gpus).toBe('1 GPU');
    const shared = job(4, { spec: { kind: 'lease', gpus: 1, gpu_share: 0.25 } });
    expect(queueRow(shared, NOW, 'alice').gpus).toBe('0.25 GPU');
    expect(queueRow(job(2), NOW, 'alice').node).toBe('—');
  });

  it('lets only the owner cancel, and only live jobs', () => {
    expect(queueRow(job(1), NOW, 'alice').cancellable).toBe(true);
    expect(queueRow(job(1), NOW, 'bob').cancellable).toBe(false);
    expect(queueRow(job(1, { state: 'succeeded' }), NOW, 'alice').cancellable).toBe(false);
    expect(queueRow(job(1), NOW, null).cancellable).toBe(false);
  });

  it('says why a held job waits', () => {
    expect(queueRow(job(1, { held: true, reason: 'quota' }), NOW, 'alice').reason).toBe(
      'held · quota'
    );
  });

  it('orders running, then queued by position, then finished newest first', () => {
    const jobs = [
      job(1, { state: 'succeeded' }),
      job(2, { state: 'queued', position: 2 }),
      job(3, { state: 'running' }),
      job(4, { state: 'queued', position: 1 }),
      job(5, { state: 'failed' }),
      job(6, { state: 'running', spec: { kind: 'lease', gpus: 1 } }),
      job(7, { state: 'queued', position: 3, user: 'bob' })
    ];
    expect(queueJobs(jobs, 'mine', 'alice').map(j => j.id)).toEqual([3, 4, 2, 5, 1]);
    expect(queueJobs(jobs, 'all', 'alice').map(j => j.id)).toEqual([3, 4, 2, 7, 5, 1]);
    expect(myLeases(jobs, 'alice').map(j => j.id)).toEqual([6]);
    // Until the server has named me, nothing is "mine".
    expect(queueJobs(jobs, 'mine', null)).toEqual([]);
    expect(myLeases(jobs, null)).toEqual([]);
  });

  it('names a script job that runs a notebook after the notebook', () => {
    const spec = {
      kind: 'script' as const,
      gpus: 1,
      command: ['jupyter', 'nbconvert', '--execute', '--output', 'x-1.ipynb', '/r/nb/train.ipynb']
    };
    expect(jobName({ spec })).toBe('train.ipynb');
  });
});

describe('executed notebooks and schedules', () => {
  it('offers the executed notebook once the server has fetched it', () => {
    const spec = { kind: 'notebook' as const, notebook: 'exp/train.ipynb', gpus: 1 };
    expect(queueRow(job(1, { state: 'running', spec }), NOW, 'alice').output).toBeNull();
    const done = job(1, {
      state: 'succeeded',
      spec,
      outputs: { notebook: 'exp/train-20261123-100000-job1.ipynb', log: null }
    });
    expect(queueRow(done, NOW, 'alice').output).toBe('exp/train-20261123-100000-job1.ipynb');
  });

  it('never makes a link of a label, whatever the submitter wrote in it', () => {
    const spec = { kind: 'notebook' as const, notebook: 'exp/train.ipynb', gpus: 1 };
    const labelled = job(1, {
      state: 'succeeded',
      user: 'bob',
      spec: { ...spec, labels: { output_notebook: 'javascript:alert(6)' } }
    });
    expect(queueRow(labelled, NOW, 'alice').output).toBeNull();
  });

  it('shows a schedule with its cron, zone, and next run in that zone, and runs', () => {
    const d = {
      id: 4,
      name: null,
      user: 'alice',
      schedule: '0 22 * * 1-5',
      timezone: 'Europe/Berlin',
      catch_up: 'skip' as const,
      paused: false,
      spec: { kind: 'notebook' as const, notebook: 'exp/train.ipynb', gpus: 2, gpu_mem_gb: 16 },
      next_fire_at: '2026-11-23T21:00:00+00:00',
      last_fired_at: null,
      last_job_id: null,
      fire_count: 0,
      schedule_words: 'weekdays at 22:00'
    };
    expect(definitionRow(d, NOW)).toEqual({
      id: 4,
      name: 'train.ipynb',
      notebook: 'exp/train.ipynb',
      schedule: '0 22 * * 1-5',
      timezone: 'Europe/Berlin',
      words: 'weekdays at 22:00',
      next: 'weekdays at 22:00, next 22:00', // in Europe/Berlin, as the zone beside it says
      paused: false,
      gpus: '2 GPUs × 16G',
      runs: 'no runs yet'
    });
    const paused = definitionRow(
      { ...d, name: 'nightly', paused: true, fire_count: 3, last_job_id: 12 },
      NOW
    );
    expect([paused.name, paused.next, paused.runs]).toEqual([
      'nightly',
      'paused',
      '3 runs, last #12'
    ]);
    expect(definitionRow({ ...d, next_fire_at: null }, NOW).next).toBe(
      'weekdays at 22:00, no next run'
    );
    expect(definitionRow({ ...d, schedule_words: null }, NOW).words).toBe("cron '0 22 * * 1-5'");
  });
});

describe('windowLine', () => {
  it('names the window, its end and the next one', () => {
    const w = { name: 'day', until: '2026-11-23T20:00:00+00:00', next_window: 'night' };
    expect(windowLine(w, NOW)).toBe('day window until 20:00, then night');
    expect(windowLine({ name: 'always' }, NOW)).toBe('always window');
    expect(windowLine(null, NOW)).toBe('no policy window');
  });
});

describe('arrays kept as one record', () => {
  const array = {
    id: 7,
    user: 'alice',
    spec: { kind: 'script', command: ['train'], gpus: 1 },
    submitted_at: '2026-11-23T09:00:00+00:00',
    size: 100000,
    pending: 99990,
    pending_range: '10-99999',
    counts: { queued: 1, running: 9 },
    cancelled: 0,
    reason: 'waiting: no node has 1 GPU free',
    estimated_start: null
  } as unknown as IArrayView;
  const arrays = new Map([[7, array]]);
  const task = (state: IJob['state']) =>
    job(17, {
      state,
      spec: { kind: 'script', gpus: 1, labels: { array_id: '7', array_index: '9' } }
    });

  it('shows on its queued task how many tasks wait behind it', () => {
    expect(queueRow(task('queued'), NOW, 'alice', arrays).arrayPending).toBe(
      'array 7_[10-99999] · 99990 pending'
    );
  });

  it('shows nothing on a running task, nor without pending tasks', () => {
    expect(queueRow(task('running'), NOW, 'alice', arrays).arrayPending).toBe('');
    expect(queueRow(task('queued'), NOW, 'alice').arrayPending).toBe('');
  });
});
