import { afterEach, describe, expect, it, vi } from 'vitest';
import { GpuschedClient } from '../src/api';
import { GpuschedModel, OUTPUT_WAIT_MS } from '../src/controller';
import { INotice } from '../src/reducer';
import { IDefinition, IJob } from '../src/types';
import { cluster, gpu, job, node } from './fixtures';

/** A client answering from memory: the model's REST calls without a server. */
function client(jobs: IJob[], mine: IJob[], definitions: IDefinition[] = []): GpuschedClient {
  return {
    cluster: async () => cluster([node('a100-0', [gpu(0)])]),
    jobs: async () => jobs,
    jobsAndArrays: async () => ({ jobs, arrays: [] }),
    whoami: async () => mine[0]?.user ?? null,
    definitions: async () => definitions
  } as unknown as GpuschedClient;
}

async function started(
  jobs: IJob[],
  mine: IJob[],
  definitions: IDefinition[] = []
): Promise<[GpuschedModel, INotice[]]> {
  const model = new GpuschedModel(client(jobs, mine, definitions));
  // The websocket is not part of these tests: start() loads, then opens it.
  (model as unknown as { _events: object })._events = { close: () => undefined };
  (model as unknown as { _poll: number })._poll = 0;
  const notices: INotice[] = [];
  model.notice.connect((_, n) => notices.push(n));
  await model.start();
  return [model, notices];
}

afterEach(() => {
  vi.useRealTimers();
});

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
      jobsAndArrays: async () => ({ jobs: [], arrays: [] }),
      whoami: async () => null
    } as unknown as GpuschedClient;
    const model = new GpuschedModel(failing);
    await model.start();
    expect([model.status, model.error?.status]).toEqual(['error', 404]);
    model.dispose();
  });

  it("holds a notebook job's notice until its executed notebook is fetched", async () => {
    const spec = { kind: 'notebook' as const, notebook: 'a/nb.ipynb', name: 'nb.ipynb', gpus: 1 };
    const mk = (id: number, notebook: string | null = null) =>
      job(id, {
        state: 'succeeded',
        user: 'root',
        spec,
        outputs: notebook ? { notebook, log: null } : null
      });
    const [model, notices] = await started(
      [
        job(1, { state: 'running', user: 'root', spec }),
        job(2, { state: 'running', user: 'root', spec })
      ],
      [job(1, { user: 'root' })]
    );
    vi.useFakeTimers();
    model.apply({ id: 1, kind: 'state', job_id: 1, to_state: 'succeeded', job: mk(1) });
    model.apply({ id: 2, kind: 'state', job_id: 2, to_state: 'succeeded', job: mk(2) });
    expect(notices).toEqual([]);
    const out = 'a/nb-20261123-090000-job1.ipynb';
    model.apply({
      id: 3,
      kind: 'notebook_output',
      job_id: 1,
      detail: { notebook: out },
      job: mk(1, out)
    });
    expect(notices).toEqual([
      { jobId: 1, level: 'success', message: 'GPU job #1 (nb.ipynb) succeeded', output: out }
    ]);
    // Job 2's notebook never comes: its notice shows without it.
    vi.advanceTimersByTime(OUTPUT_WAIT_MS);
    expect(notices.map(n => [n.jobId, n.output])).toEqual([
      [1, out],
      [2, undefined]
    ]);
    expect(model.state.jobs.get(1)!.outputs).toEqual({ notebook: out, log: null });
    model.dispose();
  });

  it('loads my schedules and reloads them on definition events', async () => {
    const d = { id: 1, schedule: '0 22 * * *', paused: false } as IDefinition;
    const defs: IDefinition[] = [d];
    const [model] = await started([], [], defs);
    await vi.waitFor(() => expect(model.definitions).toEqual([d]));
    defs.push({ ...d, id: 2 });
    model.apply({ id: 5, kind: 'definition', detail: { definition_id: 2, action: 'created' } });
    await vi.waitFor(() => expect(model.definitions?.map(x => x.id)).toEqual([1, 2]));
    model.dispose();
  });
});

describe('GpuschedModel keeps every row current', () => {
  const placed = { node: 'a100-1', gpu_indices: [0, 1], share: 1 } as IJob['placement'];
  const running = job(3, { state: 'running', user: 'root', placement: placed });
  const cancelled = job(3, { state: 'cancelled', user: 'root', placement: placed });

  /** A model loaded with job 3 running, whose `job(3)` answers what `answer` resolves. */
  async function withJob3(answer: () => Promise<IJob>): Promise<GpuschedModel> {
    const model = new GpuschedModel({
      cluster: async () => cluster([node('a100-1', [gpu(0), gpu(1)])]),
      jobs: async () => [running],
      jobsAndArrays: async () => ({ jobs: [running], arrays: [] }),
      whoami: async () => 'root',
      definitions: async () => [],
      job: answer
    } as unknown as GpuschedClient);
    (model as unknown as { _events: object })._events = { close: () => undefined };
    (model as unknown as { _poll: number })._poll = 0;
    await model.start();
    model.apply({ id: 10, kind: 'state', job_id: 3, to_state: 'running', job: running });
    return model;
  }

  it('lets no answer asked for before an event undo what the event said', async () => {
    let answer: (job: IJob) => void = () => undefined;
    const model = await withJob3(() => new Promise<IJob>(resolve => (answer = resolve)));
    const refreshed = model.refreshJob(3); // asked while it runs ...
    model.apply({ id: 11, kind: 'state', job_id: 3, to_state: 'cancelled', job: cancelled });
    answer(running); // ... answered after the cancel's event
    await refreshed;
    expect(model.state.jobs.get(3)!.state).toBe('cancelled');
    model.dispose();
  });

  it('fetches again a job whose row holds GPUs the map says are free', async () => {
    const asked: number[] = [];
    const model = await withJob3(async () => {
      asked.push(3);
      return cancelled;
    });
    // The cancel's event never came; the map that follows it lists no holder of a100-1.
    const c = cluster([node('a100-1', [gpu(0), gpu(1)])]);
    model.apply({ kind: 'cluster', cluster: c });
    await vi.waitFor(() => expect(model.state.jobs.get(3)!.state).toBe('cancelled'));
    expect(asked).toEqual([3]);
    // Once it is over, a later map asks nothing more.
    model.apply({ kind: 'cluster', cluster: { ...c, at: '2026-11-23T10:00:01Z' } });
    expect(asked).toEqual([3]);
    model.dispose();
  });
});
