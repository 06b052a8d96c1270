/**
 * The notebook side of a GPU kernel's life. JupyterLab drops a cell run while the notebook's
 * kernel is still starting (`[ ]:` forever), and a GPU kernel may wait minutes for its GPU:
 * such cells are kept (prompt `[*]`) and run, in order, once the kernel answers. A start that
 * ended on purpose (its lease cancelled, or taken over by the notebook opened again) shows no
 * "Error Starting Kernel" dialog, only a neutral note. "Ask again" starts a fresh kernel.
 */
import { Dialog, ISessionContext, Notification } from '@jupyterlab/apputils';
import { Cell, CodeCell } from '@jupyterlab/cells';
import { INotebookTracker, Notebook, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { KERNEL_LABEL, NOTEBOOK_LABEL, notStartedOnPurpose } from './kernelwait';
import { IJob } from './types';

/** The class of a cell kept until its notebook's kernel starts. */
export const QUEUED_CLASS = 'jp-gpusched-queuedCell';
/** How soon after a start ended on purpose JupyterLab's "Select Kernel" dialog is closed. */
const QUIET_MS = 5000;

export class KernelCells {
  private _queues = new Map<NotebookPanel, CodeCell[]>();
  /** Kernel id -> the notebook it served and its kernel's name (kept after it is gone). */
  private _kernels = new Map<string, { panel: NotebookPanel; name: string }>();
  private _quietUntil = 0;

  constructor(private readonly tracker: INotebookTracker) {
    NotebookActions.executionScheduled.connect(this._scheduled, this);
    tracker.widgetAdded.connect((_, panel) => this._watch(panel));
    tracker.forEach(panel => this._watch(panel));
    Dialog.tracker.widgetAdded.connect((_, dialog) => {
      void dialog.ready.then(() => this._quiet(dialog));
    });
  }

  /** Start a fresh kernel for the notebook of `job` (a lease taken back); false if not open. */
  askAgain(job: IJob): boolean {
    const id = job.spec.labels?.[KERNEL_LABEL];
    let known = id ? this._kernels.get(id) : undefined;
    if (!known || known.panel.isDisposed) {
      const notebook = job.spec.labels?.[NOTEBOOK_LABEL];
      const panel = this.tracker.find(p => p.context.path.split('/').pop() === notebook);
      const spec = panel?.context.model.getMetadata('kernelspec') as { name?: string } | undefined;
      if (!panel || !spec?.name) {
        return false;
      }
      known = { panel, name: spec.name };
    }
    void known.panel.sessionContext.changeKernel({ name: known.name });
    return true;
  }

  private _watch(panel: NotebookPanel): void {
    const ctx = panel.sessionContext;
    const changed = () => {
      const kernel = ctx.session?.kernel;
      if (kernel) {
        this._kernels.set(kernel.id, { panel, name: kernel.name });
      }
      this._flush(panel);
    };
    ctx.kernelChanged.connect(changed);
    ctx.statusChanged.connect(changed);
    panel.disposed.connect(() => this._queues.delete(panel));
    changed();
  }

  /** A cell was sent to run: keep it if its notebook's kernel is still starting. */
  private _scheduled(_: unknown, args: { notebook: Notebook; cell: Cell }): void {
    const { notebook, cell } = args;
    const panel = this.tracker.find(p => p.content === notebook);
    if (!panel || !(cell instanceof CodeCell) || !cell.model.sharedModel.getSource().trim()) {
      return;
    }
    const ctx = panel.sessionContext;
    if (ctx.session?.kernel || ctx.hasNoKernel) {
      return; // it runs now, or it has nowhere to run (JupyterLab asks for a kernel)
    }
    const queue = this._queues.get(panel) ?? [];
    if (!queue.includes(cell)) {
      queue.push(cell);
    }
    this._queues.set(panel, queue);
    // CodeCell.execute, called right after, clears the prompt of a cell with no kernel yet
    setTimeout(() => {
      if (!cell.isDisposed && this._queues.get(panel)?.includes(cell)) {
        cell.setPrompt('*');
        cell.addClass(QUEUED_CLASS);
        cell.node.title = 'Runs when the kernel has started (it is waiting for its GPU)';
      }
    }, 0);
  }

  /** Run the kept cells once the kernel answers; forget them if the start failed. */
  private _flush(panel: NotebookPanel): void {
    const queue = this._queues.get(panel);
    if (!queue?.length) {
      return;
    }
    const ctx = panel.sessionContext;
    if (!ctx.session?.kernel) {
      if (ctx.hasNoKernel) {
        this._queues.delete(panel); // its start failed or was cancelled
        queue.forEach(unmark);
      }
      return;
    }
    if (ctx.kernelDisplayStatus !== 'idle') {
      return;
    }
    this._queues.delete(panel);
    void this._run(panel, ctx, queue);
  }

  private async _run(panel: NotebookPanel, ctx: ISessionContext, cells: CodeCell[]) {
    for (let i = 0; i < cells.length; i++) {
      const cell = cells[i];
      if (cell.isDisposed) {
        continue;
      }
      unmark(cell);
      const reply = await CodeCell.execute(cell, ctx, {
        deletedCells: panel.content.model?.deletedCells ?? [],
        recordTiming: panel.content.notebookConfig.recordTiming
      });
      if (reply && reply.content.status !== 'ok') {
        cells.slice(i + 1).forEach(c => {
          unmark(c);
          c.setPrompt('');
        }); // as "run all" does: the rest waits for the user after an error
        break;
      }
    }
  }

  /**
   * Close an "Error Starting Kernel" dialog about a start that ended on purpose, and the
   * "Select Kernel" dialog JupyterLab opens right after it: the user chose no kernel.
   */
  private _quiet(dialog: Dialog<unknown>): void {
    const text = dialog.node.textContent ?? '';
    // its title may render after the body ("Select kernel for: …")
    if (/select kernel/i.test(text) && Date.now() < this._quietUntil) {
      this._quietUntil = 0;
      dialog.reject();
      return;
    }
    const message = dialog.node.querySelector('pre')?.textContent ?? '';
    if (!text.includes('Error Starting Kernel') || !notStartedOnPurpose(message)) {
      return;
    }
    this._quietUntil = Date.now() + QUIET_MS;
    dialog.reject();
    Notification.info(`${message}. The notebook has no kernel now; pick one to run its cells.`, {
      autoClose: 10000
    });
  }
}

function unmark(cell: CodeCell): void {
  if (!cell.isDisposed) {
    cell.removeClass(QUEUED_CLASS);
    cell.node.title = '';
  }
}
