import { describe, expect, it } from 'vitest';
import {
  buildNotebookRequest,
  ISubmitInput,
  parametersFromNotebook,
  parseParameters,
  SubmitInputError,
  tonightIso
} from '../src/request';

const NOW = Date.parse('2026-11-23T10:04:05.678Z');
const DAY = { name: 'day', until: '2026-11-23T20:00:00+00:00', next_window: 'night' };
const base: ISubmitInput = {
  path: 'exp/train.ipynb',
  gpus: 2,
  gpuMemGb: 16,
  parameters: {},
  when: { kind: 'now' }
};

describe('buildNotebookRequest', () => {
  it('posts the notebook path relative to the server root, to run now', () => {
    expect(buildNotebookRequest(base, 'Europe/Berlin')).toEqual({
      notebook: 'exp/train.ipynb',
      parameters: {},
      gpus: 2,
      gpu_mem_gb: 16,
      at: 'now'
    });
  });

  it('passes parameters as they were parsed', () => {
    const body = buildNotebookRequest({ ...base, parameters: { lr: 0.1, tag: 'a' } }, null);
    expect(body.parameters).toEqual({ lr: 0.1, tag: 'a' });
  });

  it('asks for whole GPUs when no memory is given', () => {
    expect(buildNotebookRequest({ ...base, gpuMemGb: null }, null)).not.toHaveProperty(
      'gpu_mem_gb'
    );
  });

  it('sends the name, the runtime limit and the GPU model only when given', () => {
    const body = buildNotebookRequest(
      { ...base, name: 'sweep', maxRuntimeS: 7200, gpuModel: 'A100' },
      null
    );
    expect([body.name, body.max_runtime_s, body.gpu_models]).toEqual(['sweep', 7200, ['A100']]);
    const bare = buildNotebookRequest(
      { ...base, name: '', maxRuntimeS: null, gpuModel: null },
      null
    );
    expect(Object.keys(bare).sort()).toEqual([
      'at',
      'gpu_mem_gb',
      'gpus',
      'notebook',
      'parameters'
    ]);
  });

  it('leaves "tonight" to the server, with no time zone', () => {
    const body = buildNotebookRequest({ ...base, when: { kind: 'tonight' } }, 'Europe/Berlin');
    expect(body.at).toBe('tonight');
    expect(body).not.toHaveProperty('timezone');
  });

  it('sends a cron as `at`, tidied, read in the browser time zone', () => {
    const body = buildNotebookRequest(
      { ...base, when: { kind: 'cron', expr: ' 0  22 * * 1-5 ' } },
      'Europe/Berlin'
    );
    expect([body.at, body.timezone]).toEqual(['0 22 * * 1-5', 'Europe/Berlin']);
    const macro = buildNotebookRequest({ ...base, when: { kind: 'cron', expr: '@daily' } }, null);
    expect(macro.at).toBe('@daily');
    expect(macro).not.toHaveProperty('timezone');
  });

  it.each([
    [{ path: 'train.py' }, /not a notebook/],
    [{ gpus: 1.5 }, /whole number/],
    [{ gpus: -1 }, /whole number/],
    [{ gpus: 65 }, /from 1 to 64/],
    [{ gpus: 0 }, /from 1 to 64/],
    [{ maxRuntimeS: 0 }, /max runtime must be more than 0/],
    [{ gpuMemGb: 0 }, /more than 0 GB/],
    [{ when: { kind: 'cron', expr: '' } }, /five fields/],
    [{ when: { kind: 'cron', expr: '0 22 * *' } }, /five fields/]
  ] as [Partial<ISubmitInput>, RegExp][])('refuses %j', (over, message) => {
    expect(() => buildNotebookRequest({ ...base, ...over }, null)).toThrow(message);
    expect(() => buildNotebookRequest({ ...base, ...over }, null)).toThrow(SubmitInputError);
  });
});

describe('helpers', () => {
  it('reads tonight from the window in force', () => {
    expect(tonightIso(DAY, NOW)).toBe(DAY.until);
    expect(tonightIso(DAY, Date.parse('2026-11-23T21:00:00Z'))).toBeNull();
    expect(tonightIso({ name: 'night', until: '2026-11-24T08:00:00+00:00' }, NOW)).toBeNull();
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

  it("pre-fills parameters from the notebook's parameters cell", () => {
    const cell = (source: string | string[], tags: string[] = []) => ({
      cell_type: 'code',
      metadata: { tags },
      source
    });
    const nb = {
      cells: [
        cell('lr = 9'),
        cell(
          [
            'lr = 0.1  # learning rate\n',
            "name = 'resnet'\n",
            'epochs: int = 3\n',
            'fast = True\n',
            'import os\n',
            'tags = ["a"]'
          ],
          ['parameters']
        )
      ]
    };
    const text = parametersFromNotebook(nb);
    expect(text).toBe('lr=0.1\nname=resnet\nepochs=3\nfast=true\ntags=["a"]');
    expect(parseParameters(text)).toEqual({
      lr: 0.1,
      name: 'resnet',
      epochs: 3,
      fast: true,
      tags: ['a']
    });
    expect(parametersFromNotebook({ cells: [cell('lr = 1')] })).toBe('');
    expect(parametersFromNotebook(null)).toBe('');
  });
});
