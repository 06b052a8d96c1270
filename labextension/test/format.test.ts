import { readFileSync } from 'fs';
import { join } from 'path';
import { describe, expect, it } from 'vitest';
import {
  clockLabel,
  etaLabel,
  formatDuration,
  formatSize,
  fragmentationText,
  gpuCount,
  gpusLabel,
  memoryLabel,
  parseDuration,
  percent,
  positionLabel,
  runtimeLabel,
  scheduleLine,
  startLabel,
  windowLine
} from '../src/format';

/** The table tests/test_figures.py checks the Python formatters against, too. */
const table = JSON.parse(readFileSync(join(__dirname, 'figures.json'), 'utf-8')) as {
  now: string;
  cases: [string, unknown[], string][];
};
const now = Date.parse(table.now);

const formatters: Record<string, (...args: any[]) => string> = {
  duration: (s: number) => formatDuration(s),
  size: formatSize,
  gpus_label: gpusLabel,
  percent,
  gpu_count: gpuCount,
  position_label: positionLabel,
  runtime_label: runtimeLabel,
  memory_label: memoryLabel,
  clock_label: (at: string) => clockLabel(at, now),
  eta_label: (at: string | null) => etaLabel(at, now),
  start_label: (est: any, at: string | null) => startLabel(est, at, now),
  fragmentation_text: fragmentationText,
  window_line: w => windowLine(w, now),
  schedule_line: (words: string, at: string | null) => scheduleLine(words, at, now)
};

describe('one vocabulary with the Python side', () => {
  it.each(table.cases)('%s(%j) writes %j', (name, args, expected) => {
    expect(formatters[name](...args)).toBe(expected);
  });

  it('covers every formatter of the table', () => {
    expect(new Set(table.cases.map(c => c[0]))).toEqual(new Set(Object.keys(formatters)));
  });
});

describe('parseDuration', () => {
  it('reads what units.parse_duration_s reads, and what formatDuration writes', () => {
    expect(parseDuration('90s')).toBe(90);
    expect(parseDuration(' 1h 30m ')).toBe(5400);
    expect(parseDuration('2H')).toBe(7200);
    expect(parseDuration('1.5d')).toBe(129600);
    expect(parseDuration('600')).toBe(600);
    for (const s of [59, 3600, 5400, 90061, 0.5]) {
      expect(parseDuration(formatDuration(s))).toBe(s);
    }
  });

  it('gives null for what is no duration', () => {
    for (const text of ['', 'soon', '2 hours', '1h and 5m', '-5m']) {
      expect(parseDuration(text)).toBeNull();
    }
  });
});
