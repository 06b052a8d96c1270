import { describe, expect, it } from 'vitest';
import {
  applyEvent,
  initialState,
  noticeFor,
  noticeGate,
  touchesCluster,
  withJobs
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
});
