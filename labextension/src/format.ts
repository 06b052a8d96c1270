/**
 * How the panel writes every figure: one formatter per figure, the mirror of the Python side
 * (jupyter_gpusched/core/units.py and core/figures.py, used by the widget and the CLI).
 *
 * Both are checked against one table of figures (test/figures.json): "0.5 GPU", "16G",
 * "2nd in line", "in 12m (14:05)" read the same wherever a user looks. Pure: the time and the
 * zone (the browser's) are passed in or local.
 */

/** An expected start this close counts as "any moment" (seconds). */
export const SOON_S = 60;
const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const DURATION_UNITS: [string, number][] = [
  ['d', 86400],
  ['h', 3600],
  ['m', 60]
];

/** The shortest decimal that reads back as `value` (as Python's repr, without ".0"). */
function plain(value: number): string {
  return String(value);
}

/** `1h30m`, `2d4h`, `1.5s`, `0s` (units.format_duration_s); `parts` keeps the leading ones. */
export function formatDuration(seconds: number, parts?: number): string {
  const whole = Math.floor(seconds);
  let rest = whole;
  const out: string[] = [];
  for (const [unit, size] of DURATION_UNITS) {
    const count = Math.floor(rest / size);
    rest -= count * size;
    if (count) {
      out.push(`${count}${unit}`);
    }
  }
  const last = seconds - (whole - rest);
  if (last) {
    out.push(`${plain(last)}s`);
  }
  return (parts === undefined ? out : out.slice(0, parts)).join('') || '0s';
}

/**
 * Read `90s`, `15m`, `2h`, `1d`, `1h30m` (spaces allowed) or a number of seconds, as
 * units.parse_duration_s does; null for text that is no duration.
 */
export function parseDuration(text: string): number | null {
  const stripped = text.trim();
  if (/^\d+(\.\d+)?$/.test(stripped)) {
    return Number(stripped);
  }
  const part = /(\d+(?:\.\d+)?)\s*([smhd])/gi;
  const size: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400 };
  let total = 0;
  let found = false;
  for (const [, value, unit] of stripped.matchAll(part)) {
    total += Number(value) * size[unit.toLowerCase()];
    found = true;
  }
  return found && stripped.replace(part, '').trim() === '' ? total : null;
}

/** `16G`, `1.5T`, `512M`: the largest unit the size reaches (units.format_size_gb). */
export function formatSize(gb: number): string {
  if (gb >= 1024) {
    return `${plain(gb / 1024)}T`;
  }
  if (gb >= 1 || gb === 0) {
    return `${plain(gb)}G`;
  }
  if (gb * 1024 >= 1) {
    return `${plain(gb * 1024)}M`;
  }
  return `${plain(gb * 1024 * 1024)}K`;
}

/** `1 GPU`, `2 GPUs`, `0.5 GPU` (a share of one), `2 GPUs × 16G` (memory of each). */
export function gpusLabel(gpus: number, share?: number | null, memGb?: number | null): string {
  if (gpus === 0) {
    return 'no GPU';
  }
  if (share !== null && share !== undefined && share < 1) {
    const each = `${plain(share)} GPU`;
    return gpus === 1 ? each : `${gpus} × ${each}`;
  }
  let text = `${gpus} GPU${gpus === 1 ? '' : 's'}`;
  if (memGb) {
    text += ` × ${formatSize(memGb)}`;
  }
  return text;
}

/** A share 0-1 as a whole percentage: `59%`. */
export function percent(share: number): string {
  return `${Math.floor(share * 100 + 0.5)}%`;
}

/** A GPU count that may be fractional: `3 GPUs`, `1 GPU`, `1.5 GPUs`. */
export function gpuCount(gpus: number): string {
  const value = Math.floor(gpus * 100 + 0.5) / 100;
  return `${plain(value)} GPU${value === 1 ? '' : 's'}`;
}

/** A queue position that cannot be mistaken for a job id: `1st in line`. */
export function positionLabel(position: number): string {
  const teen = position % 100 >= 10 && position % 100 <= 20;
  const suffix = teen
    ? 'th'
    : (({ 1: 'st', 2: 'nd', 3: 'rd' } as Record<number, string>)[position % 10] ?? 'th');
  return `${position}${suffix} in line`;
}

function pad(n: number): string {
  return String(n).padStart(2, '0');
}

/** A wall clock's reading: local, or in `timeZone` (an IANA name) when given. */
interface IWall {
  year: number;
  month: number; // 0-11
  day: number;
  weekday: number; // 0 = Sunday
  hour: number;
  minute: number;
}

function wall(ms: number, timeZone?: string): IWall {
  const d = new Date(ms);
  if (!timeZone) {
    return {
      year: d.getFullYear(),
      month: d.getMonth(),
      day: d.getDate(),
      weekday: d.getDay(),
      hour: d.getHours(),
      minute: d.getMinutes()
    };
  }
  const parts: Record<string, string> = {};
  const format = new Intl.DateTimeFormat('en-US', {
    timeZone,
    year: 'numeric',
    month: 'numeric',
    day: 'numeric',
    weekday: 'short',
    hour: 'numeric',
    minute: 'numeric',
    hourCycle: 'h23'
  });
  for (const part of format.formatToParts(d)) {
    parts[part.type] = part.value;
  }
  return {
    year: Number(parts.year),
    month: Number(parts.month) - 1,
    day: Number(parts.day),
    weekday: DAYS.indexOf(parts.weekday),
    hour: Number(parts.hour) % 24,
    minute: Number(parts.minute)
  };
}

function dayNumber(w: IWall): number {
  return Math.floor(Date.UTC(w.year, w.month, w.day) / 86400000);
}

/**
 * `14:05` today, `Tue 14:05` within a week either side, else `Dec 1 14:05`: local, or in
 * `timeZone` when given (a schedule's next run reads in the schedule's own zone).
 */
export function clockLabel(iso: string, nowMs: number, timeZone?: string): string {
  const at = wall(Date.parse(iso), timeZone);
  const now = wall(nowMs, timeZone);
  const hm = `${pad(at.hour)}:${pad(at.minute)}`;
  const days = dayNumber(at) - dayNumber(now);
  if (days === 0) {
    return hm;
  }
  if (Math.abs(days) < 7) {
    return `${DAYS[at.weekday]} ${hm}`;
  }
  return `${MONTHS[at.month]} ${at.day} ${hm}`;
}

/** When an expected start is: `in 12m (14:05)`, `any moment`, `unknown`. */
export function etaLabel(iso: string | null | undefined, nowMs: number): string {
  if (!iso) {
    return 'unknown';
  }
  const waitS = (Date.parse(iso) - nowMs) / 1000;
  if (waitS <= SOON_S) {
    return 'any moment';
  }
  const minutes = Math.floor(waitS / 60) * 60;
  return `in ${formatDuration(minutes, 2)} (${clockLabel(iso, nowMs)})`;
}

/** The API's `estimate` of a waiting job's start (the fields startLabel reads). */
export interface IStartEstimate {
  at?: string | null;
  earliest?: string | null;
  latest?: string | null;
  basis: string;
}

/**
 * An expected start and how firm it is (figures.start_label): `in 40m (09:40) at the latest`,
 * `in about 15m (09:15; 09:05–09:15 by past runtimes)`, `in 3h59m (12:59) by a guess`.
 */
export function startLabel(
  estimate: IStartEstimate | null | undefined,
  fallback: string | null | undefined,
  nowMs: number
): string {
  if (!estimate) {
    return etaLabel(fallback, nowMs);
  }
  if (!estimate.at || estimate.basis === 'unknown') {
    return 'unknown';
  }
  const eta = etaLabel(estimate.at, nowMs);
  if (!['limits', 'history', 'guess'].includes(estimate.basis) || eta === 'any moment') {
    return eta;
  }
  if (estimate.basis === 'limits') {
    return `${eta} at the latest`;
  }
  if (estimate.basis === 'guess') {
    return `${eta} by a guess`;
  }
  let span = estimate.earliest ? clockLabel(estimate.earliest, nowMs) : '';
  span += estimate.latest ? `–${clockLabel(estimate.latest, nowMs)}` : ' or later';
  return `in about ${eta.slice(3, -1)}; ${span} by past runtimes)`;
}

/** A runtime to the second below an hour, to the minute above: `12m3s`, `3h5m`. */
export function runtimeLabel(seconds: number): string {
  let whole = Math.floor(Math.max(0, seconds));
  if (whole >= 3600) {
    whole = Math.floor(whole / 60) * 60;
  }
  return formatDuration(whole, 2);
}

function tenth(value: number): number {
  return Math.floor(value * 10 + 0.5) / 10;
}

/** `12G / 80G`: memory used of a GPU's total, to a tenth of a GB. */
export function memoryLabel(usedGb: number, totalGb: number): string {
  return `${formatSize(tenth(usedGb))} / ${formatSize(tenth(totalGb))}`;
}

/** The cluster's metrics fields the fragmentation text reads. */
export interface IFragFigures {
  largest_placeable_gpus?: number | null;
  largest_placeable_node?: string | null;
  gpus_stranded?: number | null;
  frag_ratio?: number | null;
}

/** What fits now, what is stranded, and what is good, in words. */
export function fragmentationText(m: IFragFigures): string {
  const largest = m.largest_placeable_gpus ?? 0;
  let fits = `largest job that fits now: ${gpuCount(largest)}`;
  if (largest && m.largest_placeable_node) {
    fits += ` (on ${m.largest_placeable_node})`;
  }
  const parts = [fits, `${gpuCount(m.gpus_stranded ?? 0)} stranded in partly used GPUs`];
  if (typeof m.frag_ratio === 'number') {
    parts.push(
      `${percent(m.frag_ratio)} of the free capacity fits no usual job size (lower is better)`
    );
  }
  return parts.join('; ');
}

/** The window fields the window line reads. */
export interface IWindowFigures {
  name: string;
  until?: string | null;
  next_window?: string | null;
}

/** `day window until 20:00, then night`: the window in force and what follows. */
export function windowLine(window: IWindowFigures, nowMs: number): string {
  let line = `${window.name} window`;
  if (window.until) {
    line += ` until ${clockLabel(window.until, nowMs)}`;
    if (window.next_window) {
      line += `, then ${window.next_window}`;
    }
  }
  return line;
}

/** `weekdays at 22:00, next Tue 22:00`: a recurring job's schedule and its next run. */
export function scheduleLine(
  words: string,
  nextIso: string | null | undefined,
  nowMs: number,
  timeZone?: string
): string {
  return nextIso
    ? `${words}, next ${clockLabel(nextIso, nowMs, timeZone)}`
    : `${words}, no next run`;
}
