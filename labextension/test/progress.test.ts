import { describe, expect, it } from 'vitest';
import { progressText, splitLog } from '../src/progress';

const mark = (detail: object): string => `##gpusched-progress ${JSON.stringify(detail)}\n`;

describe('log progress lines', () => {
  it('take progress lines out of the log text and keep the last one', () => {
    const chunk = `loading\n${mark({ cell: 1, of: 3, source: 'x = 1' })}epoch 1\n${mark({
      cell: 2,
      of: 3,
      source: 'fit()'
    })}`;
    const out = splitLog('', chunk);
    expect(out.text).toBe('loading\nepoch 1\n');
    expect(out.progress).toEqual({ cell: 2, of: 3, source: 'fit()' });
    expect(out.rest).toBe('');
  });

  it('hold a line split across chunks only while it may be a progress line', () => {
    const first = splitLog('', 'done\n##gpusched-pro');
    expect(first).toEqual({ text: 'done\n', progress: null, rest: '##gpusched-pro' });
    const second = splitLog(first.rest, 'gress {"cell": 4, "of": 4}\ntail');
    expect(second).toEqual({ text: 'tail', progress: { cell: 4, of: 4 }, rest: '' });
  });

  it('leave a garbled progress line in the log as text', () => {
    const out = splitLog('', '##gpusched-progress {not json\n');
    expect(out.text).toBe('##gpusched-progress {not json\n');
    expect(out.progress).toBeNull();
  });

  it('describe the cell being run, or why the run is stopping', () => {
    expect(progressText({ cell: 2, of: 7, source: 'model.fit(x, y)' })).toBe(
      'cell 2 of 7: model.fit(x, y)'
    );
    expect(progressText({ stopping: 'time limit 1h reached' })).toBe(
      'stopping: time limit 1h reached'
    );
  });
});
