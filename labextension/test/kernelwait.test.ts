import { describe, expect, it } from 'vitest';
import { isKernelLease, kernelWaiting, kernelWaitMessage } from '../src/kernelwait';
import { noticeFor } from '../src/reducer';
import { job } from './fixtures';

const NOW = Date.parse('2026-11-23T09:00:00Z');
const kernelSpec = {
  kind: 'lease' as const,
  gpus: 1,
  labels: { 'gpusched.kernel': 'k-1', 'gpusched.notebook': 'train.ipynb' }
};

describe('kernel leases', () => {
  it('are leases labelled with a kernel id, waiting until they run', () => {
    expect(isKernelLease(job(1, { spec: kernelSpec }))).toBe(true);
    expect(isKernelLease(job(2, { spec: { kind: 'lease', gpus: 1 } }))).toBe(false);
    expect(isKernelLease(job(3))).toBe(false);
    const states = ['queued', 'starting', 'running', 'lost', 'cancelled'] as const;
    const waits = states.map(state => kernelWaiting(job(1, { spec: kernelSpec, state })));
    expect(waits).toEqual([true, true, false, true, false]);
  });
});

describe('kernelWaitMessage', () => {
  it('says the position, when the lease should start and why it waits', () => {
    const waiting = job(12, {
      spec: kernelSpec,
      position: 2,
      estimated_start: '2026-11-23T09:12:00Z',
      reason: 'waiting: no room (no node has 1 free GPU)'
    });
    const text = kernelWaitMessage(waiting, NOW);
    expect(text).toMatch(/^GPU kernel for train\.ipynb is waiting \(lease #12\): #2 in the queue/);
    expect(text).toContain('expected to start in 12m (');
    expect(text).toContain('· waiting: no room (no node has 1 free GPU)');
  });

  it('says where a placed lease is starting', () => {
    const starting = job(12, {
      spec: kernelSpec,
      state: 'starting',
      placement: { node: 'a100-0', gpu_indices: [0], gpu_uuids: [], share_per_gpu: 1 }
    });
    expect(kernelWaitMessage(starting, NOW)).toBe(
      'GPU kernel for train.ipynb is waiting (lease #12): starting on a100-0'
    );
  });
});

describe('notices about GPU kernels', () => {
  const gate = { atLoad: new Map(), oldestLoadedId: 0 };
  const ended = (state: 'succeeded' | 'failed', over = {}) => ({
    id: 9,
    kind: 'state',
    job_id: 12,
    to_state: state,
    job: job(12, { spec: kernelSpec, state, ...over })
  });

  it('say nothing when the kernel was shut down, and why when its lease failed', () => {
    expect(noticeFor(ended('succeeded'), 'alice', gate)).toBeNull();
    const failed = noticeFor(ended('failed', { reason: 'node a100-0 lost' }), 'alice', gate);
    expect(failed?.level).toBe('error');
    expect(failed?.message).toContain('node a100-0 lost');
  });
});
