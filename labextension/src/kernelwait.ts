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
