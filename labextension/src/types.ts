/**
 * Shapes of the gpusched REST + websocket API: names for the types generated from
 * jupyter_gpusched/server/openapi.yaml (itself generated from the server's pydantic models)
 * into ./openapi.ts by `jlpm build:types`, which every build runs first.
 */
import type { components } from './openapi';

type Schemas = components['schemas'];

/** Life of a job. */
export type JobState = Schemas['JobState'];

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

export type JobKind = Schemas['JobKind'];
/** What a user asked for, with its owner (JobSpec). */
export type IJobSpec = Schemas['JobSpec'];
/** Where a job runs. */
export type IPlacement = Schemas['Placement'];
/** A job as the API shows it. */
export type IJob = Schemas['Job'];
/** An `array: N` kept as one record until its tasks start. */
export type IArrayView = Schemas['ArrayView'];
/** One job holding (part of) a GPU. */
export type IGpuJob = Schemas['GpuJob'];
/** One GPU of the cluster map. */
export type IGpu = Schemas['Gpu'];
/** One node of the cluster map. */
export type INode = Schemas['Node'];
/** The policy window in force. */
export type IWindow = Schemas['Window'];
/** Fragmentation and capacity figures. */
export type IMetrics = Schemas['Metrics'];
/** Body of `GET cluster`. */
export type ICluster = Schemas['Cluster'];
/** One websocket message from `events`. */
export type IEvent = Schemas['Event'];
/** JSON error body of the API. */
export type IApiError = Schemas['Error'];
/** Body of `POST jobs` (one job). */
export type IJobPost = Schemas['JobPost'];
/** Body of `POST notebooks`. */
export type INotebookSubmission = Schemas['NotebookSubmission'];
/** A recurring notebook job. */
export type IDefinition = Schemas['Definition'];
/** Answer of `POST notebooks`: the queued job, or the stored definition (cron). */
export type INotebookSubmitted = Schemas['NotebookSubmitted'];
/** Body of `GET jobs/{id}/events`: a job's timeline. */
export type IJobEvents = Schemas['JobEvents'];
/** One GPU's samples over time, as columns. */
export type IGpuSeries = Schemas['GpuSeries'];
/** Body of `GET cluster/history`. */
export type IGpuHistory = Schemas['GpuHistory'];
