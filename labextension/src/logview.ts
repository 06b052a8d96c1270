/** A job's log in the main area, streaming while the job runs. */
import { Widget } from '@lumino/widgets';
import { GpuschedClient } from './api';
import { h } from './dom';
import { jobName } from './model';
import { Progress, progressText, splitLog } from './progress';

const LIVE = ['queued', 'starting', 'running'];

export class LogView extends Widget {
  private pre = h('pre', { className: 'jp-gpusched-log-text' });
  private header = h('div', { className: 'jp-gpusched-log-header' });
  private status = h('div', { className: 'jp-gpusched-log-progress' });
  private held = '';
  private progress: Progress | null = null;
  private abort = new AbortController();
  private bytes = 0;

  constructor(
    private readonly client: GpuschedClient,
    readonly jobId: number
  ) {
    super();
    this.addClass('jp-gpusched-log');
    this.id = `gpusched-log-content-${jobId}`;
    this.title.label = `GPU job #${jobId} log`;
    this.title.closable = true;
    this.node.append(this.header, this.status, this.pre);
    this.status.hidden = true;
    this.header.textContent = `Job #${jobId}: waiting for its log…`;
    void this.follow();
  }

  dispose(): void {
    this.abort.abort();
    super.dispose();
  }

  private append(chunk: string): void {
    const { text, progress, rest } = splitLog(this.held, chunk);
    this.held = rest;
    if (progress) {
      this.progress = progress;
      this.status.textContent = progressText(progress);
      this.status.hidden = false;
    }
    if (!text) {
      return;
    }
    const atBottom = this.node.scrollTop + this.node.clientHeight >= this.node.scrollHeight - 4;
    this.pre.append(text);
    if (atBottom) {
      this.node.scrollTop = this.node.scrollHeight;
    }
  }

  private async describe(): Promise<boolean> {
    const job = await this.client.job(this.jobId);
    const code = job.exit_code !== null ? ` · exit code ${job.exit_code}` : '';
    const reason = job.reason ? ` · ${job.reason}` : '';
    this.header.textContent = `Job #${job.id} ${jobName(job)} · ${job.state}${code}${reason}`;
    this.header.dataset.state = job.state;
    const live = LIVE.includes(job.state);
    if (!live && this.progress) {
      this.status.hidden = true; // the run is over: its last cell is no longer news
    }
    return live;
  }

  /** Follow the log until the job ends; reconnect from the last byte if the stream drops. */
  private async follow(): Promise<void> {
    for (let attempt = 0; !this.isDisposed; attempt++) {
      try {
        const live = await this.describe();
        this.bytes += await this.client.followLog(
          this.jobId,
          this.bytes,
          t => this.append(t),
          this.abort.signal
        );
        if (!live || !(await this.describe())) {
          return;
        }
      } catch (err) {
        if (this.isDisposed) {
          return;
        }
        this.header.textContent = `Job #${this.jobId}: ${(err as Error).message}; retrying…`;
        await new Promise(r => setTimeout(r, Math.min(1000 * 2 ** attempt, 15000)));
      }
    }
  }
}
