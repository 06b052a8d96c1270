import { ICluster, IGpu, IJob, INode } from '../src/types';

export function gpu(index: number, over: Partial<IGpu> = {}): IGpu {
  return {
    index,
    uuid: `GPU-${index}`,
    model: 'A100',
    mem_total_gb: 80,
    mem_used_gb: 0,
    util_pct: 0,
    state: 'free',
    share_used: 0,
    jobs: [],
    ...over
  };
}

export function node(name: string, gpus: IGpu[], over: Partial<INode> = {}): INode {
  return { name, up: true, error: null, cpus: 64, mem_gb: 512, gpus, ...over };
}

export function cluster(nodes: INode[]): ICluster {
  return {
    nodes,
    metrics: { gpus_total: 8, gpus_free: 8 },
    window: { name: 'day', until: '2026-11-23T20:00:00+00:00', next_window: 'night' },
    queue: { queued: 0, running: 0 },
    at: '2026-11-23T10:00:00Z'
  };
}

export function job(id: number, over: Partial<IJob> = {}): IJob {
  return {
    id,
    state: 'queued',
    spec: { kind: 'script', command: ['python', 'train.py'], gpus: 1 },
    placement: null,
    submitted_at: '2026-11-23T09:00:00+00:00',
    started_at: null,
    finished_at: null,
    exit_code: null,
    reason: null,
    held: false,
    attempt: 0,
    position: null,
    user: 'alice',
    ...over
  };
}
