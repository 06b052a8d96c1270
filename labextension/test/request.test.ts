import { describe, expect, it } from 'vitest';
import {
  buildNotebookJob,
  ISubmitInput,
  parseParameters,
  SubmitInputError,
  timestamp,
  tonightIso
} from '../src/request';

const NOW = Date.parse('2026-11-23T10:04:05.678Z');
const DAY = { name: 'day', until: '2026-11-23T20:00:00+00:00', next_window: 'night' };
const base: ISubmitInput = {
  path: 'exp/train.ipynb',
  serverRoot: '/home/alice/work',
  gpus: 2,
  gpuMemGb: 16,
  parameters: {},
  when: { kind: 'now' }
};

describe('buildNotebookJob', () => {
  it('runs the notebook with nbconvert as a script job, output beside it', () => {
    expect(buildNotebookJob(base, NOW, DAY)).toEqual({
      kind: 'script',
      name: 'train.ipynb',
      gpus: 2,
      gpu_mem_gb: 16,
      workdir: '/home/alice/work/exp',
      command: [
        'jupyter',
        'nbconvert',
        '--to',
        'notebook',
        '--execute',
        '--output',
        'train-20261123-100405.ipynb',
        '/home/alice/work/exp/train.ipynb'
      ]
    });
  });

  it('passes parameters through papermill', () => {
    const spec = buildNotebookJob({ ...base, parameters: { lr: 0.1, tag: 'a' } }, NOW, DAY);
    expect(spec.command).toEqual([
      'papermill',
      '/home/alice/work/exp/train.ipynb',
      '/home/alice/work/exp/train-20261123-100405.ipynb',
      '-y',
      '{"lr":0.1,"tag":"a"}'
    ]);
  });

  it('asks for whole GPUs when no memory is given, and for none with 0 GPUs', () => {
    expect(buildNotebookJob({ ...base, gpuMemGb: null }, NOW, DAY)).not.toHaveProperty(
      'gpu_mem_gb'
    );
    expect(buildNotebookJob({ ...base, gpus: 0 }, NOW, DAY)).not.toHaveProperty('gpu_mem_gb');
  });

  it('keeps a relative path and no workdir when the server root is unknown', () => {
    const spec = buildNotebookJob({ ...base, serverRoot: '' }, NOW, DAY);
    expect(spec.workdir).toBeUndefined();
    expect(spec.command!.slice(-1)).toEqual(['exp/train.ipynb']);
  });

  it('starts "tonight" when the day window ends', () => {
    expect(buildNotebookJob({ ...base, when: { kind: 'tonight' } }, NOW, DAY).not_before).toBe(
      DAY.until
    );
    const night = { name: 'night', until: '2026-11-24T08:00:00+00:00', next_window: 'day' };
    expect(buildNotebookJob({ ...base, when: { kind: 'tonight' } }, NOW, night)).not.toHaveProperty(
      'not_before'
    );
  });

  it('refuses cron until the server runs notebook jobs', () => {
    expect(() =>
      buildNotebookJob({ ...base, when: { kind: 'cron', expr: '0 22 * * *' } }, NOW, DAY)
    ).toThrow(SubmitInputError);
  });

  it.each([
    [{ path: 'train.py' }, /not a notebook/],
    [{ gpus: 1.5 }, /whole number/],
    [{ gpus: -1 }, /whole number/],
    [{ gpuMemGb: 0 }, /more than 0 GB/]
  ])('refuses %j', (over, message) => {
    expect(() => buildNotebookJob({ ...base, ...over }, NOW, DAY)).toThrow(message);
  });
});

describe('helpers', () => {
  it('stamps output names in sortable UTC', () => {
    expect(timestamp(NOW)).toBe('20261123-100405');
  });

  it('reads tonight from the window in force', () => {
    expect(tonightIso(DAY, NOW)).toBe(DAY.until);
    expect(tonightIso(DAY, Date.parse('2026-11-23T21:00:00Z'))).toBeNull();
    expect(tonightIso(null, NOW)).toBeNull();
  });

  it('parses name=value parameters as JSON where it can', () => {
    expect(
      parseParameters('lr=0.1\n# comment\n\nname = resnet\ntags=["a", "b"]\nfast=true')
    ).toEqual({
      lr: 0.1,
      name: 'resnet',
      tags: ['a', 'b'],
      fast: true
    });
    expect(() => parseParameters('lr 0.1')).toThrow(/line 1: write parameters as name=value/);
  });
});
