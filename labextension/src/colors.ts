/**
 * GPU state colours of the cluster map: the one place they are defined.
 *
 * The notebook widget (`%gpu status`, jupyter_gpusched/widgets.py) mirrors these values so a
 * GPU means the same thing wherever a user looks at it. Keep both in step:
 *
 * | state         | colour    | meaning                                                     |
 * |---------------|-----------|-------------------------------------------------------------|
 * | `free`        | `#e0e0e0` | grey: nothing of ours or anyone else's runs on it           |
 * | `interactive` | `#2e7d32` | green: held by an interactive lease (`%%gpu` cells)         |
 * | `batch`       | `#1565c0` | blue: held by a batch job (script or notebook)              |
 * | `foreign`     | `#ef6c00` | orange: busy with processes the scheduler did not start     |
 * | `down`        | `#c62828` | red: its node is unreachable or failed its probe            |
 *
 * Memory used is a bar beside each cell's colour ({@link MEM_BAR_COLOUR}), never a shade over
 * it: a full GPU keeps exactly the legend's colour.
 */

/** The GPU states the API reports, in legend order. */
export const GPU_STATES = ['free', 'interactive', 'batch', 'foreign', 'down'] as const;

/** One GPU's state as `GET cluster` reports it. */
export type GpuState = (typeof GPU_STATES)[number];

/** Fill colour of a GPU cell by state. */
export const GPU_STATE_COLOURS: Readonly<Record<GpuState, string>> = {
  free: '#e0e0e0',
  interactive: '#2e7d32',
  batch: '#1565c0',
  foreign: '#ef6c00',
  down: '#c62828'
};

/** Legend words for each state. */
export const GPU_STATE_LABELS: Readonly<Record<GpuState, string>> = {
  free: 'free',
  interactive: 'interactive',
  batch: 'batch',
  foreign: 'foreign use',
  down: 'down'
};

/** The bar beside a GPU cell marking the used share of its memory (bottom-up). */
export const MEM_BAR_COLOUR = '#616161';

/** Text colour that stays readable on each state colour. */
export const GPU_STATE_TEXT: Readonly<Record<GpuState, string>> = {
  free: '#424242',
  interactive: '#ffffff',
  batch: '#ffffff',
  foreign: '#ffffff',
  down: '#ffffff'
};

/** True when `value` is one of the known GPU states. */
export function isGpuState(value: unknown): value is GpuState {
  return typeof value === 'string' && (GPU_STATES as readonly string[]).includes(value);
}
