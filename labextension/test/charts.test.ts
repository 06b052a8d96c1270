import { describe, expect, it } from 'vitest';
import { chartModel } from '../src/charts';
import { IGpuSeries } from '../src/types';

function series(index: number, at: string[], util: (number | null)[]): IGpuSeries {
  return {
    node: 'a100-0',
    index,
    model: 'A100',
    mem_total_gb: 80,
    at,
    util_pct: util,
    mem_used_gb: util.map(u => (u === null ? null : u / 2)),
    power_w: util.map(() => null)
  } as unknown as IGpuSeries;
}

const T = (s: number) => new Date(Date.UTC(2026, 10, 23, 10, 0, s)).toISOString();

describe('chartModel', () => {
  it('draws one line per GPU and breaks it where samples are missing', () => {
    const m = chartModel(
      [series(0, [T(0), T(30), T(60), T(300), T(330)], [10, 50, 90, 20, 40])],
      'util',
      { intervalS: 30, width: 340, height: 122 }
    );
    expect(m.lines).toHaveLength(1);
    expect(m.lines[0].label).toBe('a100-0 GPU 0');
    expect(m.lines[0].runs).toHaveLength(2);
    expect(m.lines[0].runs[0].split(' ')).toHaveLength(3);
    expect(m.lines[0].last).toBe('40%');
    expect([m.top, m.left, m.right]).toEqual(['100%', '10:00', '10:05']);
  });

  it('scales memory to the largest GPU and skips missing values', () => {
    const m = chartModel([series(1, [T(0), T(30)], [null, 60])], 'memory', { intervalS: 30 });
    expect(m.max).toBe(80);
    expect(m.lines[0].runs).toHaveLength(1);
    expect(m.lines[0].last).toBe('30G');
  });

  it('says so when there are no samples', () => {
    const m = chartModel([], 'power');
    expect([m.lines, m.left, m.right]).toEqual([[], '', '']);
  });
});
