/**
 * A GPU kernel's life in notifications: while it waits for its lease, where it stands (queue
 * position, expected start, why it waits) with Cancel; "ready on a100-0 GPU 2" once it runs;
 * and when its GPU is taken back (idle reclaim, preemption, node loss), why, that its state
 * is lost, and an offer to ask again.
 */
import { Notification } from '@jupyterlab/apputils';
import { IDisposable } from '@lumino/disposable';
import { GpuschedClient } from './api';
import { GpuschedModel } from './controller';
import {
  isKernelLease,
  kernelLostMessage,
  kernelReadyMessage,
  kernelTakenBack,
  kernelWaiting,
  kernelWaitMessage
} from './kernelwait';
import { IJob } from './types';

/** Positions and expected starts are not pushed as events: ask this often while one waits. */
const POLL_MS = 2000;

/**
 * Keeps one notification per waiting GPU kernel of mine in step with its lease.
 */
export class KernelWaitNotifier implements IDisposable {
  private _shown = new Map<number, { id: string; message: string }>();
  /** My kernel leases as last seen on this page: only changes seen here are told. */
  private _seen = new Map<number, IJob['state']>();
  private _timer: ReturnType<typeof setInterval> | null = null;
  private _disposed = false;

  /**
   * @param askAgain - starts a fresh kernel for the notebook of a lease whose GPU was taken
   *   back; false when that notebook is not open here.
   */
  constructor(
    private readonly model: GpuschedModel,
    private readonly client: GpuschedClient,
    private readonly askAgain: (job: IJob) => boolean = () => false
  ) {
    model.changed.connect(this.sync, this);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Show, update or dismiss the notifications after the model changed. */
  sync(): void {
    const me = this.model.me();
    const waiting = new Map<number, IJob>();
    for (const job of this.model.state.jobs.values()) {
      if (me === null || job.user !== me || !isKernelLease(job)) {
        continue;
      }
      this.told(job);
      if (kernelWaiting(job)) {
        waiting.set(job.id, job);
      }
    }
    for (const [id, shown] of this._shown) {
      if (!waiting.has(id)) {
        Notification.dismiss(shown.id);
        this._shown.delete(id);
      }
    }
    for (const job of waiting.values()) {
      this.show(job);
    }
    this.poll(waiting.size > 0);
  }

  /** Tell the changes of a kernel's lease seen on this page: it runs, or lost its GPU. */
  private told(job: IJob): void {
    const before = this._seen.get(job.id);
    this._seen.set(job.id, job.state);
    if (before === undefined || before === job.state) {
      return;
    }
    if (job.state === 'running' && kernelWaiting({ spec: job.spec, state: before })) {
      Notification.success(kernelReadyMessage(job), { autoClose: 10000 });
    } else if (before === 'running' && kernelTakenBack(job)) {
      const ended = !['queued', 'preempted', 'lost'].includes(job.state);
      const actions = ended
        ? [
            {
              label: 'Ask again',
              caption: 'Start a fresh GPU kernel for this notebook',
              callback: () => {
                if (!this.askAgain(job)) {
                  Notification.info('Open the notebook and pick its GPU kernel to ask again.');
                }
              }
            }
          ]
        : [];
      Notification.warning(kernelLostMessage(job), { autoClose: false, actions });
    }
  }

  private show(job: IJob): void {
    const message = kernelWaitMessage(job, Date.now());
    const shown = this._shown.get(job.id);
    if (shown?.message === message) {
      return;
    }
    const actions = [
      {
        label: 'Cancel',
        caption: 'Cancel the lease: the kernel does not start',
        callback: () => void this.cancel(job.id)
      }
    ];
    if (shown) {
      Notification.update({ id: shown.id, message, type: 'in-progress', actions });
      shown.message = message;
    } else {
      const id = Notification.emit(message, 'in-progress', { autoClose: false, actions });
      this._shown.set(job.id, { id, message });
    }
  }

  private async cancel(jobId: number): Promise<void> {
    try {
      await this.client.release(jobId);
      await this.model.refreshJob(jobId);
    } catch (err) {
      Notification.error(`Could not cancel lease #${jobId}: ${(err as Error).message}`);
    }
  }

  /** Refresh the waiting leases every POLL_MS while there are any. */
  private poll(on: boolean): void {
    if (on && this._timer === null) {
      this._timer = setInterval(() => {
        for (const id of this._shown.keys()) {
          void this.model.refreshJob(id).catch(() => undefined);
        }
      }, POLL_MS);
    } else if (!on && this._timer !== null) {
      clearInterval(this._timer);
      this._timer = null;
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.poll(false);
    this.model.changed.disconnect(this.sync, this);
    for (const shown of this._shown.values()) {
      Notification.dismiss(shown.id);
    }
    this._shown.clear();
  }
}
