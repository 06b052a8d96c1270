import { describe, expect, it } from 'vitest';
import { fitProblem } from '../src/fit';
import { gpu, node } from './fixtures';

const eight = (name: string) =>
  node(
    name,
    Array.from({ length: 8 }, (_, i) => gpu(i, { model: 'A100-80GB', mem_total_gb: 80 }))
  );
const t4 = node(
  't4-0',
  [0, 1].map(i => gpu(i, { model: 'T4', mem_total_gb: 16 }))
);
const NODES = [eight('a100-0'), eight('a100-1'), t4];
const any = { gpuMemGb: null, gpuModel: null };

describe('fitProblem', () => {
  it('lets through what the largest node holds', () => {
    expect(fitProblem({ ...any, gpus: 8 }, NODES)).toBeNull();
  });

  it('names the largest node and what to ask for instead', () => {
    expect(fitProblem({ ...any, gpus: 9 }, NODES)).toBe(
      'no node has 9 GPUs; the largest has 8 (a100-0): ask for at most 8, or split the ' +
        'work into several jobs'
    );
  });

  it('counts only GPUs of the chosen model', () => {
    expect(fitProblem({ gpus: 4, gpuMemGb: null, gpuModel: 'T4' }, NODES)).toBe(
      'no node has 4 T4 GPUs; the largest has 2 (t4-0): ask for at most 2, or split the ' +
        'work into several jobs'
    );
  });

  it('refuses more GPU memory than any GPU has', () => {
    expect(fitProblem({ gpus: 1, gpuMemGb: 100, gpuModel: null }, NODES)).toBe(
      'no GPU has 100 GB of memory; the largest have 80 GB: ask for at most that, or leave ' +
        'it empty for whole GPUs'
    );
    expect(fitProblem({ gpus: 1, gpuMemGb: 40, gpuModel: 'T4' }, NODES)).toMatch(
      /^no T4 GPU has 40 GB of memory; the largest have 16 GB/
    );
  });

  it('leaves the decision to the server while the cluster is unknown', () => {
    expect(fitProblem({ ...any, gpus: 99 }, null)).toBeNull();
    expect(fitProblem({ ...any, gpus: 99 }, [])).toBeNull();
  });
});
