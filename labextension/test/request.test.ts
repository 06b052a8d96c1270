import { describe, expect, it } from 'vitest';
import {
  buildNotebookRequest,
  buildScriptRequest,
  ISubmitInput,
  parametersFromNotebook,
  parseEnv,
  parseParameters,
  splitArgs,
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

describe('buildScriptRequest', () => {
  const script = {
    path: 'exp/train.py',
    args: ['--lr', '0.1'],
    env: { STEPS: '20' },
    gpus: 2,
    gpuMemGb: null
  };

  it('stages the script and runs its copy with its arguments and environment', () => {
    expect(buildScriptRequest(script)).toEqual({
      kind: 'script',
      command: ['python3', 'train.py', '--lr', '0.1'],
      files: ['exp/train.py'],
      name: 'train.py',
      gpus: 2,
      env: { STEPS: '20' }
    });
  });

  it('refuses what is not a Python script, and sizes the request cannot express', () => {
    expect(() => buildScriptRequest({ ...script, path: 'notes.txt' })).toThrow(
      'notes.txt is not a Python script (.py)'
    );
    expect(() => buildScriptRequest({ ...script, gpus: 0 })).toThrow(
      'GPUs must be a whole number from 1 to 64'
    );
  });
});

describe('splitArgs', () => {
  it('splits as a shell does, quotes keeping spaces, nothing expanded', () => {
    expect(splitArgs(`--tag 'two words' --msg "say \\"hi\\"" $HOME a\\ b ''`)).toEqual([
      '--tag',
      'two words',
      '--msg',
      'say "hi"',
      '$HOME',
      'a b',
      ''
    ]);
  });

  it('says which quote is left open', () => {
    expect(() => splitArgs(`--tag 'open`)).toThrow("arguments: close the ' you opened");
  });
});

describe('parseEnv', () => {
  it('reads NAME=VALUE lines, values as written', () => {
    expect(parseEnv('STEPS=20\n# a comment\nMSG=a=b c\n')).toEqual({ STEPS: '20', MSG: 'a=b c' });
  });

  it('says which line is not NAME=VALUE', () => {
    expect(() => parseEnv('STEPS=20\n2X=1')).toThrow('environment line 2: write NAME=VALUE');
  });
});
