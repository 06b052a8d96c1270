import { describe, expect, it } from 'vitest';
import {
  applyEvent,
  awaitsOutput,
  initialState,
  noticeFor,
  noticeGate,
  touchesCluster,
  touchesDefinitions,
  unheldJobs,
  withCluster,
  withJob,
  withJobs,
  withOutput
} from '../src/reducer';
import { IEvent } from '../src/types';
import { cluster, gpu, job, node } from './fixtures';

describe('applyEvent', () => {
  it('adds a submitted job and remembers the event id', () => {
    const s = applyEvent(initialState(), { id: 4, kind: 'submitted', job_id: 1, job: job(1) });
    expect([...s.jobs.keys()]).toEqual([1]);
    expect(s.lastEventId).toBe(4);
  });

  it('replaces the job with the one the event carries', () => {
    let s = withJobs(initialState(), [job(1)]);
    s = applyEvent(s, {
      id: 5,
      kind: 'state',
      job_id: 1,
      from_state: 'queued',
      to_state: 'running',
      job: job(1, { state: 'running', started_at: '2026-11-23T09:00:00Z' })
    });
    expect(s.jobs.get(1)!.state).toBe('running');
    expect(s.jobs.get(1)!.started_at).toBe('2026-11-23T09:00:00Z');
  });

  it('moves a known job to the new state when the event carries no job', () => {
    const s = applyEvent(withJobs(initialState(), [job(1, { position: 1 })]), {
      id: 6,
      kind: 'state',
      job_id: 1,
      to_state: 'cancelled'
    });
    expect(s.jobs.get(1)).toMatchObject({ state: 'cancelled', position: null });
  });

  it('ignores events already applied (replay after reconnect) and never mutates', () => {
    const s1 = applyEvent(initialState(), { id: 9, kind: 'submitted', job: job(1) });
    const s2 = applyEvent(s1, { id: 9, kind: 'state', job: job(1, { state: 'failed' }) });
    const s3 = applyEvent(s1, { id: 3, kind: 'state', job: job(1, { state: 'failed' }) });
    expect(s2).toBe(s1);
    expect(s3).toBe(s1);
    expect(s1.jobs.get(1)!.state).toBe('queued');
  });

  it('replaces the map from a cluster message without moving the resume id', () => {
    const c = cluster([node('a100-0', [gpu(0, { state: 'batch' })])]);
    const s0 = { ...initialState(), lastEventId: 12 };
    const s = applyEvent(s0, { kind: 'cluster', cluster: c });
    expect(s.cluster).toBe(c);
    expect(s.lastEventId).toBe(12);
    const fromDetail = applyEvent(s0, { kind: 'cluster', detail: { cluster: c } });
    expect(fromDetail.cluster).toBe(c);
  });

  it('asks for a fresh map after state changes only', () => {
    expect(touchesCluster({ kind: 'state' })).toBe(true);
    expect(touchesCluster({ kind: 'activity' })).toBe(false);
  });

  it('reloads schedules on definition changes and on jobs a definition fired', () => {
    expect(touchesDefinitions({ kind: 'definition', detail: { action: 'paused' } })).toBe(true);
    expect(touchesDefinitions({ kind: 'submitted', detail: { definition_id: 3 } })).toBe(true);
    expect(touchesDefinitions({ kind: 'submitted', detail: { user: 'alice' } })).toBe(false);
    expect(touchesDefinitions({ kind: 'state', to_state: 'running' })).toBe(false);
  });
});

describe('noticeFor', () => {
  const finished = (to: 'succeeded' | 'failed' | 'cancelled', user = 'alice'): IEvent => ({
    id: 20,
    kind: 'state',
    job_id: 5,
    from_state: 'running',
    to_state: to,
    job: job(5, { state: to, user, exit_code: to === 'failed' ? 3 : 0 })
  });
  const gate = noticeGate([job(5, { state: 'running' })], 200);

  it('tells me my job succeeded or failed, with the exit code', () => {
    expect(noticeFor(finished('succeeded'), 'alice', gate)).toEqual({
      jobId: 5,
      level: 'success',
      message: 'GPU job #5 (train.py) succeeded'
    });
    expect(noticeFor(finished('failed'), 'alice', gate)).toMatchObject({
      level: 'error',
      message: 'GPU job #5 (train.py) failed: exit code 3'
    });
  });

  it("stays quiet about other people's jobs and about cancels", () => {
    expect(noticeFor(finished('succeeded', 'bob'), 'alice', gate)).toBeNull();
    expect(noticeFor(finished('cancelled'), 'alice', gate)).toBeNull();
    expect(noticeFor(finished('succeeded'), null, gate)).toBeNull();
  });

  it('stays quiet about history replayed on connect', () => {
    const loadedDone = noticeGate([job(5, { state: 'succeeded' })], 200);
    expect(noticeFor(finished('succeeded'), 'alice', loadedDone)).toBeNull();
    const full = noticeGate([job(50), job(51)], 2);
    expect(noticeFor(finished('succeeded'), 'alice', full)).toBeNull();
  });

  it('tells the end of a live job older than the newest page, not of history beside it', () => {
    // the newest two jobs (60, 61) and job 5, loaded because it still ran
    const loaded = noticeGate([job(61), job(60), job(5, { state: 'running' })], 2);
    expect(noticeFor(finished('succeeded'), 'alice', loaded)).not.toBeNull();
    const other = {
      ...finished('succeeded'),
      job_id: 6,
      job: { ...finished('succeeded').job!, id: 6 }
    };
    expect(noticeFor(other, 'alice', loaded)).toBeNull();
  });
});

describe('the executed notebook of a notebook job', () => {
  const nbJob = (state: 'succeeded' | 'failed', notebook: string | null = null) =>
    job(7, {
      state,
      user: 'alice',
      spec: { kind: 'notebook', notebook: 'exp/train.ipynb', name: 'train.ipynb', gpus: 1 },
      outputs: notebook ? { notebook, log: null } : null
    });
  const gate = noticeGate([job(7, { state: 'running' })], 200);
  const ended = (j: ReturnType<typeof nbJob>): IEvent => ({
    id: 30,
    kind: 'state',
    job_id: 7,
    to_state: j.state,
    job: j
  });
  const OUT = 'exp/train-20261123-100405-job7.ipynb';

  it('waits for the output when the state change comes before the notebook is fetched', () => {
    const notice = noticeFor(ended(nbJob('succeeded')), 'alice', gate)!;
    expect(notice).not.toHaveProperty('output');
    expect(awaitsOutput(notice, nbJob('succeeded'))).toBe(true);
    const output: IEvent = {
      id: 31,
      kind: 'notebook_output',
      job_id: 7,
      detail: { notebook: OUT, log: 'exp/x.log', state: 'succeeded' },
      job: nbJob('succeeded', OUT)
    };
    expect(withOutput(notice, output)).toEqual({ ...notice, output: OUT });
    expect(withOutput(notice, { ...output, job: null })).toEqual({ ...notice, output: OUT });
    expect(withOutput(notice, { ...output, job_id: 8 })).toBeNull();
    expect(withOutput(notice, { id: 32, kind: 'progress', job_id: 7 })).toBeNull();
  });

  it('names the output at once when the job already carries it', () => {
    const done = nbJob('failed', OUT);
    const notice = noticeFor(ended(done), 'alice', gate)!;
    expect(notice.output).toBe(OUT);
    expect(awaitsOutput(notice, done)).toBe(false);
  });

  it('never waits for script jobs', () => {
    const notice = noticeFor(
      {
        id: 33,
        kind: 'state',
        job_id: 5,
        to_state: 'succeeded',
        job: job(5, { state: 'succeeded' })
      },
      'alice',
      noticeGate([job(5, { state: 'running' })], 200)
    )!;
    expect(awaitsOutput(notice, job(5, { state: 'succeeded' }))).toBe(false);
  });
});

describe('job snapshots from REST and events, in order', () => {
  const running = job(3, { state: 'running', placement: { node: 'a100-1', gpu_indices: [0] } });
  const cancelled = job(3, { state: 'cancelled' });

  it('keeps a finished job finished whatever an older answer says', () => {
    let s = applyEvent(withJobs(initialState(), [running]), {
      id: 7,
      kind: 'state',
      job_id: 3,
      to_state: 'cancelled',
      job: cancelled
    });
    s = withJobs(s, [running], 2);
    expect(s.jobs.get(3)!.state).toBe('cancelled');
    expect(withJob(s, running, 9).jobs.get(3)!.state).toBe('cancelled');
  });

  it('takes an answer newer than the last event about the job', () => {
    let s = applyEvent(withJobs(initialState(), [job(3)]), {
      id: 4,
      kind: 'state',
      job_id: 3,
      to_state: 'running',
      job: running
    });
    expect(withJob(s, job(3, { state: 'queued' }), 3).jobs.get(3)!.state).toBe('running');
    s = withJob(s, cancelled, 3);
    expect(s.jobs.get(3)!.state).toBe('cancelled');
  });

  it('keeps a job told by an event after the request when the answer lacks it', () => {
    const lease = job(8, { state: 'queued' });
    const s = applyEvent(withJobs(initialState(), [running]), {
      id: 5,
      kind: 'submitted',
      job_id: 8,
      to_state: 'queued',
      job: lease
    });
    expect(withJobs(s, [running], 4).jobs.get(8)?.state).toBe('queued');
    expect(withJobs(s, [running], 5).jobs.has(8)).toBe(false); // an answer after it: gone
  });

  it('names the rows that hold GPUs the map lists for no one', () => {
    const held = gpu(0, { state: 'batch', jobs: [{ id: 3 } as never] });
    let s = withCluster(withJobs(initialState(), [running]), cluster([node('a100-1', [held])]));
    expect(unheldJobs(s)).toEqual([]);
    s = withCluster(s, cluster([node('a100-1', [gpu(0)])]));
    expect(unheldJobs(s)).toEqual([3]);
  });
});
