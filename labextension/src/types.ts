/**
 * Shapes of the gpusched REST + websocket API (see jupyter_gpusched/openapi.yaml).
 * Only the fields the panel reads are typed; the server may send more.
 */

/** Life of a job, as in jupyter_gpusched/models.py. */
export type JobState =
  'queued' | 'starting' | 'running' | 'succeeded' | 'failed' | 'cancelled' | 'preempted' | 'lost';

/** States in which a job is still alive (waiting or holding GPUs). */
export const LIVE_STATES: readonly JobState[] = [
  'queued',
  'starting',
  'running',
  'preempted',
  'lost'
];

/** States from which a job never moves again. */
export const TERMINAL_STATES: readonly JobState[] = ['succeeded', 'failed', 'cancelled'];

export type JobKind = 'lease' | 'script' | 'notebook';

/** What a user asks for (JobSpec). */
export interface IJobSpec {
  kind: JobKind;
  name?: string | null;
  command?: string[] | null;
  notebook?: string | null;
  parameters?: Record<string, unknown>;
  gpus: number;
  gpu_mem_gb?: number | null;
  gpu_share?: number | null;
  priority?: 'interactive' | 'batch' | null;
  user?: string;
  not_before?: string | null;
  workdir?: string | null;
  labels?: Record<string, string>;
}

/** Where a job runs. */
export interface IPlacement {
  node: string;
  gpu_indices: number[];
  gpu_uuids?: string[];
  share_per_gpu: number;
  gpu_mem_gb?: number | null;
}

/** A job as the API shows it. */
export interface IJob {
  id: number;
  state: JobState;
  spec: IJobSpec;
  placement: IPlacement | null;
  submitted_at: string;
  started_at: string | null;
  finished_at: string | null;
  exit_code: number | null;
  reason: string | null;
  held: boolean;
  attempt: number;
  position: number | null;
  user: string;
  priority_class?: 'interactive' | 'batch';
}

/** One job holding (part of) a GPU. */
export interface IGpuJob {
  id: number;
  user: string;
  kind: JobKind;
  share: number;
  priority_class?: string;
}

/** One GPU of the cluster map. */
export interface IGpu {
  index: number;
  uuid: string;
  model: string;
  mem_total_gb: number;
  mem_used_gb: number;
  util_pct: number | null;
  state: string;
  share_used: number;
  jobs: IGpuJob[];
}

/** One node of the cluster map. */
export interface INode {
  name: string;
  up: boolean;
  error: string | null;
  cpus: number;
  mem_gb: number;
  gpus: IGpu[];
}

/** The policy window in force. */
export interface IWindow {
  name: string;
  since?: string | null;
  until?: string | null;
  /** Name of the window that follows (`next_window`; older servers said `next`). */
  next_window?: string | null;
  next?: string | null;
  applies?: string;
  interactive_reserved_share?: number;
  interactive_max_share?: number;
  batch_max_runtime_s?: number | null;
  preempt_batch?: boolean;
  migrate_batch?: boolean;
}

/** Fragmentation and capacity figures. */
export interface IMetrics {
  gpus_total?: number;
  gpus_free?: number;
  largest_placeable_gpus?: number;
  frag_ratio?: number;
  free_nodes_by_size?: Record<string, number>;
  allocated_share?: number;
}

/** Body of `GET cluster`. */
export interface ICluster {
  nodes: INode[];
  metrics: IMetrics;
  window: IWindow | null;
  queue: { queued: number; running: number };
  at?: string;
}

/** One websocket message from `events`. */
export interface IEvent {
  id?: number | null;
  at?: string;
  kind: string;
  job_id?: number | null;
  from_state?: JobState | null;
  to_state?: JobState | null;
  detail?: Record<string, unknown>;
  job?: IJob | null;
  cluster?: ICluster;
}

/** JSON error body of the API. */
export interface IApiError {
  error: string;
  message: string;
  field?: string;
}

/** Body of `POST notebooks` (NotebookSubmission; only the fields the dialog sets). */
export interface INotebookSubmission {
  /** Path under the server's root directory. */
  notebook: string;
  parameters: Record<string, unknown>;
  /** `now`, `tonight`, a window name, an ISO time, or a cron expression (recurring). */
  at: string;
  /** IANA zone of a cron `at`; the server's policy zone when left out. */
  timezone?: string;
  gpus: number;
  gpu_mem_gb?: number;
  name?: string;
}

/** A recurring notebook job (Definition). */
export interface IDefinition {
  id: number;
  name: string | null;
  user: string;
  schedule: string;
  timezone: string;
  catch_up: 'skip' | 'once';
  paused: boolean;
  spec: IJobSpec;
  next_fire_at?: string | null;
  last_fired_at?: string | null;
  last_job_id?: number | null;
  fire_count: number;
}

/** Answer of `POST notebooks`: the queued job, or the stored definition (cron). */
export interface INotebookSubmitted {
  job: IJob | null;
  definition: IDefinition | null;
}
