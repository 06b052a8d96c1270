/**
 * What the notification of a GPU kernel ("Python 3 (1 GPU)") waiting for its lease says:
 * pure functions over the lease (the provisioner labels it with the kernel id and the
 * notebook's name). The notifications themselves are in ./kernelnotify.ts.
 */
import { etaLabel } from './format';
import { IJob } from './types';

/** Labels the provisioner puts on a kernel's lease. */
export const KERNEL_LABEL = 'gpusched.kernel';
export const NOTEBOOK_LABEL = 'gpusched.notebook';

/** Whether the job is the lease of a GPU kernel. */
export function isKernelLease(job: Pick<IJob, 'spec'>): boolean {
  return job.spec.kind === 'lease' && Boolean(job.spec.labels?.[KERNEL_LABEL]);
}

/** Whether a GPU kernel is still waiting for its lease to run. */
export function kernelWaiting(job: Pick<IJob, 'spec' | 'state'>): boolean {
  return isKernelLease(job) && ['queued', 'starting', 'preempted', 'lost'].includes(job.state);
}

/**
 * The notification's text for a waiting kernel lease, e.g.
 * `GPU kernel for train.ipynb is waiting (lease #12): #2 in the queue · expected to start in
 * 12m (14:05) · waiting: no room (...)`.
 */
export function kernelWaitMessage(job: IJob, nowMs: number): string {
  const notebook = job.spec.labels?.[NOTEBOOK_LABEL];
  const what = notebook ? `GPU kernel for ${notebook}` : 'GPU kernel';
  const parts: string[] = [];
  if (job.state === 'queued') {
    if (job.position) {
      parts.push(`#${job.position} in the queue`);
    }
    if (job.estimated_start) {
      parts.push(`expected to start ${etaLabel(job.estimated_start, nowMs)}`);
    }
    if (job.reason) {
      parts.push(job.reason);
    }
  } else if (job.state === 'starting') {
    parts.push(`starting on ${job.placement?.node ?? 'its node'}`);
  } else {
    parts.push(`${job.state}: ${job.reason ?? 'waiting for another node'}`);
  }
  return `${what} is waiting (lease #${job.id}): ${parts.join(' · ') || job.state}`;
}

/** The notebook a kernel's lease serves, for messages: `GPU kernel for train.ipynb`. */
export function kernelWhat(job: Pick<IJob, 'spec'>): string {
  const notebook = job.spec.labels?.[NOTEBOOK_LABEL];
  return notebook ? `GPU kernel for ${notebook}` : 'GPU kernel';
}

/** `a100-0 GPU 2`, or `g0 GPUs 0,1`: where a running lease holds its GPUs. */
export function placedOn(job: Pick<IJob, 'placement'>): string {
  const p = job.placement;
  if (!p) {
    return 'its GPU';
  }
  const gpus = p.gpu_indices ?? [];
  return `${p.node} ${gpus.length === 1 ? 'GPU' : 'GPUs'} ${gpus.join(',')}`;
}

/** `GPU kernel for train.ipynb is ready on a100-0 GPU 2`. */
export function kernelReadyMessage(job: IJob): string {
  return `${kernelWhat(job)} is ready on ${placedOn(job)} (lease #${job.id})`;
}

/**
 * Whether a kernel's lease that ran was taken back (idle reclaim, max runtime, preemption,
 * node loss, an admin), rather than given back by its owner or ended with its kernel.
 */
export function kernelTakenBack(job: Pick<IJob, 'state' | 'reason' | 'user'>): boolean {
  switch (job.state) {
    case 'running':
    case 'starting':
    case 'succeeded':
    case 'failed': // the kernel died by itself: Jupyter's restarter says so
      return false;
    case 'cancelled':
      return job.reason !== `cancelled by ${job.user}`;
    default: // queued again (preempted, lost with its node), lost, preempted
      return true;
  }
}

/**
 * What the notebook is told when its kernel's GPU was taken back: why, that the kernel's state
 * is gone, and what happens next (a requeued lease starts a fresh kernel by itself).
 */
export function kernelLostMessage(job: IJob): string {
  const why = job.reason ?? job.state;
  const again = ['queued', 'preempted', 'lost'].includes(job.state)
    ? 'a fresh kernel starts when the lease runs again'
    : 'ask again for a fresh kernel';
  return (
    `${kernelWhat(job)} lost its GPU (lease #${job.id}): ${why}. ` +
    `Its variables and imports are gone; ${again}.`
  );
}

/**
 * Whether a kernel error is a start that ended on purpose (its lease was cancelled, or the
 * notebook, opened again, took the lease over): no error dialog for those.
 */
export function notStartedOnPurpose(text: string): boolean {
  return /GPU kernel not started( here)?: (lease \d+ cancelled|kernel \S+ took over lease)/.test(
    text
  );
}
