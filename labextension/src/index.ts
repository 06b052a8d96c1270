/**
 * jupyter-gpusched for JupyterLab: the GPU cluster sidebar, job logs, "Submit to GPU queue"
 * from the file browser and the notebook toolbar, notifications about my jobs, and the
 * queue position of GPU kernels waiting for their lease.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  ICommandPalette,
  MainAreaWidget,
  Notification,
  showErrorMessage,
  ToolbarButton
} from '@jupyterlab/apputils';
import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { LabIcon } from '@jupyterlab/ui-components';
import { DisposableDelegate } from '@lumino/disposable';
import { GpuschedClient } from './api';
import { GpuschedModel } from './controller';
import { Dashboard } from './dashboard';
import { JobPage } from './jobpage';
import { KernelWaitNotifier } from './kernelnotify';
import { GpuschedPanel } from './panel';
import { LogView } from './logview';
import { ISubmitContext, submitNotebook, submitScript } from './submitting';

export * from './colors';

const COMMANDS = {
  open: 'gpusched:open-panel',
  dashboard: 'gpusched:open-dashboard',
  job: 'gpusched:open-job',
  submit: 'gpusched:submit-notebook',
  submitScript: 'gpusched:submit-script',
  log: 'gpusched:open-log'
};

/** A GPU board: the panel's tab icon. */
export const gpuIcon = new LabIcon({
  name: 'jupyter-gpusched:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16"><g class="jp-icon3" fill="#616161">' +
    '<path d="M2 6h18a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2H6v2H4v-2H2zm4 3a3 3 0 1 0 0 6 3 3 0 0 0 0-6zm8 0' +
    'a3 3 0 1 0 0 6 3 3 0 0 0 0-6zm-8 2a1 1 0 1 1 0 2 1 1 0 0 1 0-2zm8 0a1 1 0 1 1 0 2 1 1 0 0 1 0-2z"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpusched:plugin',
  description: 'GPU cluster panel, job logs, batch notebook submission and job notifications.',
  autoStart: true,
  optional: [ILayoutRestorer, IDefaultFileBrowser, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    browser: IDefaultFileBrowser | null,
    palette: ICommandPalette | null
  ) => {
    const client = new GpuschedClient(app.serviceManager.serverSettings);
    const model = new GpuschedModel(client);
    const logs = new Map<number, MainAreaWidget<LogView>>();
    /** The notebooks open in the editor, for the submit dialog (unsaved edits, parameters). */
    const openNotebooks = new Set<DocumentRegistry.IContext<DocumentRegistry.IModel>>();

    const openLog = (jobId: number) => {
      let widget = logs.get(jobId);
      if (!widget || widget.isDisposed) {
        widget = new MainAreaWidget({ content: new LogView(client, jobId) });
        widget.id = `gpusched-log-${jobId}`;
        widget.title.label = `GPU job #${jobId}`;
        widget.title.icon = gpuIcon;
        logs.set(jobId, widget);
        app.shell.add(widget, 'main', { mode: 'split-bottom' });
      }
      app.shell.activateById(widget.id);
    };

    /** Open a notebook the server wrote (path relative to the server root). */
    const openNotebook = (path: string) => {
      void app.commands.execute('docmanager:open', { path }).catch(err => {
        void showErrorMessage(`Could not open ${path}`, (err as Error).message);
      });
    };

    const pages = new Map<number, JobPage>();
    /** A job's page in the main area (one per job; opening it again brings it forward). */
    const openJob = (jobId: number) => {
      let page = pages.get(jobId);
      if (!page || page.isDisposed) {
        page = new JobPage(model, jobId, openNotebook);
        page.title.icon = gpuIcon;
        pages.set(jobId, page);
        app.shell.add(page, 'main');
      }
      app.shell.activateById(page.id);
    };

    const submitScriptFromPanel = () => void app.commands.execute(COMMANDS.submitScript);
    const openers = {
      openLog,
      openNotebook,
      openJob,
      openDashboard: () => openDashboard(),
      submitScript: submitScriptFromPanel
    };

    let dashboard: Dashboard | null = null;
    /** The panel as a wide main-area dashboard with the GPU history charts. */
    const openDashboard = () => {
      if (!dashboard || dashboard.isDisposed) {
        dashboard = new Dashboard(model, openers);
        dashboard.title.icon = gpuIcon;
        app.shell.add(dashboard, 'main');
      }
      app.shell.activateById(dashboard.id);
    };

    const panel = new GpuschedPanel(model, openers);
    panel.title.icon = gpuIcon;
    // The sidebar shows icons only: the tooltip (and screen readers) name it.
    panel.title.caption = 'GPU scheduler';
    app.shell.add(panel, 'left', { rank: 900 });
    restorer?.add(panel, 'gpusched-panel');
    void model.start();
    // GPU kernels waiting for their lease: where they stand, and Cancel
    new KernelWaitNotifier(model, client);

    model.notice.connect((_, notice) => {
      const actions = [
        { label: 'Show job', callback: () => openJob(notice.jobId) },
        { label: 'Show log', callback: () => openLog(notice.jobId) }
      ];
      const output = notice.output;
      if (output) {
        actions.unshift({ label: 'Open notebook', callback: () => openNotebook(output) });
      }
      const autoClose = notice.level === 'success' ? 10000 : false;
      Notification[notice.level](notice.message, { actions, autoClose });
    });

    app.commands.addCommand(COMMANDS.open, {
      label: 'Show GPU Cluster',
      caption: 'Open the GPU cluster panel',
      icon: gpuIcon,
      execute: () => app.shell.activateById(panel.id)
    });

    app.commands.addCommand(COMMANDS.dashboard, {
      label: 'Show GPU Cluster Dashboard',
      caption: 'Open the GPU cluster as a wide dashboard with GPU history charts',
      icon: gpuIcon,
      execute: openDashboard
    });

    app.commands.addCommand(COMMANDS.job, {
      label: args => (args.jobId ? `Show GPU Job #${args.jobId}` : 'Show GPU Job'),
      execute: args => openJob(Number(args.jobId))
    });

    app.commands.addCommand(COMMANDS.log, {
      label: args => (args.jobId ? `Show Log of GPU Job #${args.jobId}` : 'Show GPU Job Log'),
      execute: args => openLog(Number(args.jobId))
    });

    /** The file of `type` selected in the file browser (the context menu acts on it). */
    const selected = (type: 'notebook' | 'python'): string | null => {
      const first = browser?.selectedItems().next();
      if (!first || first.done) {
        return null;
      }
      const item = first.value;
      const isType = type === 'notebook' ? item.type === 'notebook' : item.path.endsWith('.py');
      return isType ? item.path : null;
    };
    const submitting: ISubmitContext = {
      app,
      model,
      openLog,
      openNotebooks,
      showSchedules: () => app.shell.activateById(panel.id)
    };

    app.commands.addCommand(COMMANDS.submit, {
      label: 'Submit to GPU Queue…',
      caption: 'Run this notebook as a batch job on the GPU cluster',
      icon: gpuIcon,
      isEnabled: args => Boolean(args.path) || selected('notebook') !== null,
      execute: async args => {
        const path = (args.path as string | undefined) ?? selected('notebook');
        if (path) {
          await submitNotebook(submitting, path);
        }
      }
    });

    app.commands.addCommand(COMMANDS.submitScript, {
      label: 'Submit Script to GPU Queue…',
      caption: 'Run a Python script as a batch job on the GPU cluster',
      icon: gpuIcon,
      execute: async args =>
        submitScript(submitting, (args.path as string | undefined) ?? selected('python') ?? '')
    });

    app.contextMenu.addItem({
      command: COMMANDS.submit,
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 20
    });
    app.contextMenu.addItem({
      command: COMMANDS.submitScript,
      selector: '.jp-DirListing-item[data-file-type="python"]',
      rank: 20
    });

    app.docRegistry.addWidgetExtension('Notebook', new NotebookButton(app, openNotebooks));

    if (palette) {
      palette.addItem({ command: COMMANDS.open, category: 'GPU Scheduler' });
      palette.addItem({ command: COMMANDS.dashboard, category: 'GPU Scheduler' });
      palette.addItem({ command: COMMANDS.submitScript, category: 'GPU Scheduler' });
    }
  }
};

/** The notebook toolbar button that submits the open notebook. */
class NotebookButton implements DocumentRegistry.IWidgetExtension<
  DocumentWidget,
  DocumentRegistry.IModel
> {
  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly open: Set<DocumentRegistry.IContext<DocumentRegistry.IModel>>
  ) {}

  createNew(
    widget: DocumentWidget,
    context: DocumentRegistry.IContext<DocumentRegistry.IModel>
  ): DisposableDelegate {
    this.open.add(context);
    context.disposed.connect(() => this.open.delete(context));
    const button = new ToolbarButton({
      className: 'jp-gpusched-submit-button',
      icon: gpuIcon,
      tooltip: 'Submit this notebook to the GPU queue',
      onClick: () => void this.app.commands.execute(COMMANDS.submit, { path: context.path })
    });
    widget.toolbar.insertItem(10, 'gpusched-submit', button);
    return new DisposableDelegate(() => button.dispose());
  }
}

export default plugin;
