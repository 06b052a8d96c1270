/**
 * Small time-series charts in plain SVG (no chart library): GPU utilization, memory and power
 * over time, one line per GPU, as jupyterlab-nvdashboard draws them, for the whole cluster.
 *
 * `chartModel` is pure (tested without a DOM); `chartSvg` draws its result.
 */
import { IGpuSeries } from './types';

/** Line colours per GPU index: distinct, none of them a GPU state colour of the map. */
export const LINE_COLOURS = [
  '#6a1b9a',
  '#00838f',
  '#ad1457',
  '#5d4037',
  '#283593',
  '#9e9d24',
  '#4e342e',
  '#00695c'
];

/** What a chart shows. */
export type Measure = 'util' | 'memory' | 'power';

/** One drawn line. */
export interface IChartLine {
  label: string;
  colour: string;
  /** SVG polyline points per unbroken run of samples (`x,y x,y ...`). */
  runs: string[];
  /** The last value, in words (`87%`, `40G`, `250 W`), for the legend. */
  last: string;
}

/** A chart's geometry and lines. */
export interface IChartModel {
  title: string;
  width: number;
  height: number;
  /** Value at the top of the chart (`100` for %, the largest total for memory). */
  max: number;
  unit: string;
  lines: IChartLine[];
  /** First and last instant (ms) on the time axis. */
  t0: number;
  t1: number;
  /** Axis labels: top value, and local times at the left and right ends. */
  top: string;
  left: string;
  right: string;
}

const PAD = { left: 34, right: 6, top: 6, bottom: 16 };

function value(series: IGpuSeries, measure: Measure, i: number): number | null {
  if (measure === 'util') {
    return series.util_pct[i];
  }
  if (measure === 'memory') {
    return series.mem_used_gb[i];
  }
  return series.power_w[i] ?? null;
}

function words(v: number, measure: Measure): string {
  if (measure === 'util') {
    return `${Math.round(v)}%`;
  }
  if (measure === 'memory') {
    return `${Math.round(v * 10) / 10}G`;
  }
  return `${Math.round(v)} W`;
}

function hm(ms: number): string {
  const d = new Date(ms);
  return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
}

/**
 * The chart of one measure for some GPUs: one line per series, x by time, y by value. A gap
 * longer than three sample intervals (a node down, a job away) breaks the line.
 */
export function chartModel(
  series: IGpuSeries[],
  measure: Measure,
  opts: { width?: number; height?: number; intervalS?: number; title?: string } = {}
): IChartModel {
  const width = opts.width ?? 320;
  const height = opts.height ?? 110;
  const times = series.flatMap(s => s.at.map(a => Date.parse(a)));
  const t0 = times.length ? Math.min(...times) : 0;
  const t1 = times.length ? Math.max(...times) : 1;
  let max = 100;
  let unit = '%';
  if (measure === 'memory') {
    max = Math.max(1, ...series.map(s => s.mem_total_gb));
    unit = 'G';
  } else if (measure === 'power') {
    const seen = series.flatMap(s => s.power_w.filter((p): p is number => p !== null));
    max = Math.max(1, ...seen) * 1.1;
    unit = 'W';
  }
  const w = width - PAD.left - PAD.right;
  const h = height - PAD.top - PAD.bottom;
  const gapMs = 3 * 1000 * (opts.intervalS ?? 30);
  const x = (t: number) => PAD.left + (t1 > t0 ? ((t - t0) / (t1 - t0)) * w : w);
  const y = (v: number) => PAD.top + h - (Math.min(Math.max(v, 0), max) / max) * h;
  const lines = series.map((s, k) => {
    const runs: string[] = [];
    let run: string[] = [];
    let prev = -Infinity;
    let last: number | null = null;
    s.at.forEach((at, i) => {
      const t = Date.parse(at);
      const v = value(s, measure, i);
      if (v === null || t - prev > gapMs) {
        if (run.length) {
          runs.push(run.join(' '));
        }
        run = [];
      }
      if (v !== null) {
        run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
        last = v;
      }
      prev = t;
    });
    if (run.length) {
      runs.push(run.join(' '));
    }
    return {
      label: `${s.node} GPU ${s.index}`,
      colour: LINE_COLOURS[s.index % LINE_COLOURS.length],
      runs,
      last: last === null ? '–' : words(last, measure)
    };
  });
  const titles: Record<Measure, string> = {
    util: 'utilization',
    memory: 'memory used',
    power: 'power'
  };
  return {
    title: opts.title ?? titles[measure],
    width,
    height,
    max,
    unit,
    lines,
    t0,
    t1,
    top: words(max, measure),
    left: times.length ? hm(t0) : '',
    right: times.length ? hm(t1) : ''
  };
}

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag: string, attrs: Record<string, string | number>, text?: string): SVGElement {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    el.textContent = text;
  }
  return el;
}

/** Draw a chart: axes, one polyline per run, the legend with last values beneath. */
export function chartSvg(model: IChartModel): HTMLElement {
  const box = document.createElement('figure');
  box.className = 'jp-gpusched-chart';
  box.dataset.measure = model.title;
  const caption = document.createElement('figcaption');
  caption.textContent = model.title;
  const root = svg('svg', {
    width: model.width,
    height: model.height,
    viewBox: `0 0 ${model.width} ${model.height}`,
    role: 'img',
    'aria-label': model.title
  });
  const bottom = model.height - PAD.bottom;
  root.append(
    svg('line', { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: bottom, class: 'jp-gpusched-axis' }),
    svg('line', {
      x1: PAD.left,
      y1: bottom,
      x2: model.width - PAD.right,
      y2: bottom,
      class: 'jp-gpusched-axis'
    }),
    svg('text', { x: PAD.left - 3, y: PAD.top + 8, 'text-anchor': 'end' }, model.top),
    svg('text', { x: PAD.left - 3, y: bottom, 'text-anchor': 'end' }, '0'),
    svg('text', { x: PAD.left, y: model.height - 3 }, model.left),
    svg(
      'text',
      { x: model.width - PAD.right, y: model.height - 3, 'text-anchor': 'end' },
      model.right
    )
  );
  for (const line of model.lines) {
    for (const points of line.runs) {
      root.append(
        svg('polyline', {
          points,
          fill: 'none',
          stroke: line.colour,
          'stroke-width': 1.5,
          class: 'jp-gpusched-line'
        })
      );
    }
  }
  const legend = document.createElement('div');
  legend.className = 'jp-gpusched-chart-legend';
  for (const line of model.lines) {
    const item = document.createElement('span');
    const swatch = document.createElement('span');
    swatch.className = 'jp-gpusched-swatch';
    swatch.style.background = line.colour;
    item.append(swatch, `${line.label}: ${line.last}`);
    legend.append(item);
  }
  if (!model.lines.length) {
    legend.textContent = 'no samples yet';
  }
  box.append(caption, root, legend);
  return box;
}
