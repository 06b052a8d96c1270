import { describe, expect, it } from 'vitest';
import {
  isKernelLease,
  kernelLostMessage,
  kernelReadyMessage,
  kernelTakenBack,
  kernelWaiting,
  kernelWaitMessage,
  notStartedOnPurpose
} from '../src/kernelwait';
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
    // a lost or preempted kernel lease is told by the kernel's own notification, once
    const lost = { ...ended('failed'), to_state: 'lost' as const };
    expect(noticeFor(lost, 'alice', gate)).toBeNull();
    const failed = noticeFor(ended('failed', { reason: 'node a100-0 lost' }), 'alice', gate);
    expect(failed?.level).toBe('error');
    expect(failed?.message).toContain('node a100-0 lost');
  });
});

describe('a GPU kernel that runs, and loses its GPU', () => {
  const placement = { node: 'a100-0', gpu_indices: [2], gpu_uuids: [], share_per_gpu: 1 };

  it('says where it is ready', () => {
    const running = job(12, { spec: kernelSpec, state: 'running', placement });
    expect(kernelReadyMessage(running)).toBe(
      'GPU kernel for train.ipynb is ready on a100-0 GPU 2 (lease #12)'
    );
  });

  it('tells a lease taken back from one its owner gave back', () => {
    const taken = (state: string, reason: string | null) =>
      kernelTakenBack({ state, reason, user: 'alice' } as Parameters<typeof kernelTakenBack>[0]);
    expect(taken('cancelled', 'lease idle for 30m: reclaimed')).toBe(true);
    expect(taken('cancelled', 'cancelled by admin')).toBe(true);
    expect(taken('queued', 'preempted for interactive work: requeued')).toBe(true);
    expect(taken('lost', 'node a100-0 unreachable')).toBe(true);
    expect(taken('cancelled', 'cancelled by alice')).toBe(false); // shut down by its owner
    expect(taken('succeeded', null)).toBe(false);
    expect(taken('failed', 'exit code 1')).toBe(false); // Jupyter's restarter speaks for it
  });

  it('says why, that its state is gone, and what comes next', () => {
    const reclaimed = job(12, {
      spec: kernelSpec,
      state: 'cancelled',
      reason: 'lease idle for 30m: reclaimed'
    });
    expect(kernelLostMessage(reclaimed)).toBe(
      'GPU kernel for train.ipynb lost its GPU (lease #12): lease idle for 30m: reclaimed. ' +
        'Its variables and imports are gone; ask again for a fresh kernel.'
    );
    const requeued = job(12, { spec: kernelSpec, state: 'queued', reason: 'node lost: requeued' });
    expect(kernelLostMessage(requeued)).toContain(
      'a fresh kernel starts when the lease runs again'
    );
  });

  it('knows the starts that ended on purpose (no error dialog for those)', () => {
    expect(notStartedOnPurpose('GPU kernel not started: lease 5 cancelled (cancelled by a)')).toBe(
      true
    );
    expect(
      notStartedOnPurpose('GPU kernel not started here: kernel 1f-2 took over lease 5 (its ...)')
    ).toBe(true);
    expect(notStartedOnPurpose('GPU kernel not started: lease 5 failed (exit code 1)')).toBe(false);
    expect(notStartedOnPurpose('no GPU kernel: this job can never fit')).toBe(false);
  });
});
