import { describe, expect, it } from 'vitest';
import { GpuschedClient } from '../src/api';
import { GpuschedModel } from '../src/controller';
import { INotice } from '../src/reducer';
import { IJob } from '../src/types';
import { cluster, gpu, job, node } from './fixtures';

/** A client answering from memory: the model's REST calls without a server. */
function client(jobs: IJob[], mine: IJob[]): GpuschedClient {
  return {
    cluster: async () => cluster([node('a100-0', [gpu(0)])]),
    jobs: async () => jobs,
    whoami: async () => mine[0]?.user ?? null
  } as unknown as GpuschedClient;
}

async function started(jobs: IJob[], mine: IJob[]): Promise<[GpuschedModel, INotice[]]> {
  const model = new GpuschedModel(client(jobs, mine));
  // The websocket is not part of these tests: start() loads, then opens it.
  (model as unknown as { _events: object })._events = { close: () => undefined };
  (model as unknown as { _poll: number })._poll = 0;
  const notices: INotice[] = [];
  model.notice.connect((_, n) => notices.push(n));
  await model.start();
  return [model, notices];
}

describe('GpuschedModel', () => {
  it('learns my name from my newest job and notifies me when it finishes', async () => {
    const running = job(3, { state: 'running', user: 'root' });
    const [model, notices] = await started(
      [running, job(2, { state: 'succeeded', user: 'root' })],
      [running]
    );
    expect(model.status).toBe('ready');
    expect(model.me()).toBe('root');
    // History replayed on connect stays quiet; the live end of job 3 notifies.
    model.apply({
      id: 1,
      kind: 'state',
      job_id: 2,
      to_state: 'succeeded',
      job: job(2, { state: 'succeeded', user: 'root' })
    });
    model.apply({
      id: 2,
      kind: 'state',
      job_id: 3,
      to_state: 'failed',
      job: job(3, { state: 'failed', user: 'root', exit_code: 2 })
    });
    expect(notices).toEqual([
      { jobId: 3, level: 'error', message: 'GPU job #3 (train.py) failed: exit code 2' }
    ]);
    model.dispose();
  });

  it('knows me once I submit, when I had no jobs', async () => {
    const [model, notices] = await started([], []);
    expect(model.me()).toBeNull();
    model.claim(job(1, { user: 'root' }));
    model.apply({
      id: 1,
      kind: 'state',
      job_id: 1,
      to_state: 'succeeded',
      job: job(1, { state: 'succeeded', user: 'root' })
    });
    expect(model.me()).toBe('root');
    expect(notices.map(n => n.level)).toEqual(['success']);
    model.dispose();
  });

  it('says what failed when the API is not there', async () => {
    const failing = {
      cluster: async () => {
        const { GpuschedApiError } = await import('../src/api');
        throw new GpuschedApiError(404, 'NotFound', 'no such route');
      },
      jobs: async () => [],
      whoami: async () => null
    } as unknown as GpuschedClient;
    const model = new GpuschedModel(failing);
    await model.start();
    expect([model.status, model.error?.status]).toEqual(['error', 404]);
    model.dispose();
  });
});
