/**
 * Submitting from the lab: "Submit to GPU Queue…" for notebooks and "Submit Script…" for
 * Python scripts. Each shows the submit dialog, sends the request, and announces the job.
 *
 * A refusal by the server (a file gone, a limit reached) never loses what was typed: the
 * dialog comes back with the same fields and the server's reason, until the user submits
 * what the server takes or cancels.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { GpuschedModel } from './controller';
import { clockLabel } from './format';
import {
  browserTimezone,
  buildNotebookRequest,
  buildScriptRequest,
  parametersFromNotebook,
  tonightIso
} from './request';
import { FormState, ISubmitChoice, ISubmitFormOptions, SubmitForm } from './submit';

/** What the submit commands open and tell, elsewhere in JupyterLab. */
export interface ISubmitContext {
  app: JupyterFrontEnd;
  model: GpuschedModel;
  openLog(jobId: number): void;
  showSchedules(): void;
  /** The notebooks open in the editor (unsaved edits are read, then saved before submit). */
  openNotebooks: Set<DocumentRegistry.IContext<DocumentRegistry.IModel>>;
}

/**
 * Show the dialog until the server takes the request or the user cancels. `send` throws with
 * the server's message when it refuses; the next dialog keeps every field and says why.
 */
async function dialogUntilSent(
  title: string,
  options: ISubmitFormOptions,
  send: (choice: ISubmitChoice) => Promise<void>
): Promise<void> {
  let state: FormState | null = null;
  let refusal: string | null = null;
  for (;;) {
    const form = new SubmitForm(options);
    if (state) {
      form.restore(state);
    }
    if (refusal) {
      form.showRefusal(refusal);
    }
    const answer = await showDialog({
      title,
      body: form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit' })],
      focusNodeSelector: 'input[name=gpus]'
    });
    if (!answer.button.accept || answer.value === null) {
      return;
    }
    const { state: typed, ...choice } = answer.value;
    state = typed;
    try {
      if ('error' in choice) {
        throw new Error(choice.error);
      }
      await send(choice as ISubmitChoice);
      return;
    } catch (err) {
      refusal = (err as Error).message;
    }
  }
}

/** The form's options that come from the cluster: GPU models, nodes, tonight's start. */
function clusterOptions(
  model: GpuschedModel
): Pick<ISubmitFormOptions, 'models' | 'nodes' | 'tonight' | 'timezone'> {
  const nodes = model.state.cluster?.nodes ?? [];
  const tonight = tonightIso(model.state.cluster?.window ?? null, Date.now());
  return {
    models: [...new Set(nodes.flatMap(n => n.gpus.map(g => g.model)))].sort(),
    nodes: nodes.length ? nodes : null,
    tonight: tonight ? clockLabel(tonight, Date.now()) : null,
    timezone: browserTimezone()
  };
}

/** "Submit to GPU Queue…": run the notebook at `path` as a batch job (or on a schedule). */
export async function submitNotebook(ctx: ISubmitContext, path: string): Promise<void> {
  const { app, model } = ctx;
  const opts = clusterOptions(model);
  // An open notebook is read as the user sees it, and saved before it is submitted: the run
  // must not silently use the file's older content.
  const open = [...ctx.openNotebooks].find(c => c.path === path && !c.isDisposed);
  let content: unknown = null;
  try {
    content = open
      ? open.model.toJSON()
      : (await app.serviceManager.contents.get(path, { content: true })).content;
  } catch (err) {
    console.warn('gpusched: could not read the parameters cell of', path, err);
  }
  const options: ISubmitFormOptions = {
    ...opts,
    path,
    parameters: parametersFromNotebook(content),
    unsaved: Boolean(open?.model.dirty)
  };
  await dialogUntilSent('Submit notebook to the GPU queue', options, async choice => {
    const body = buildNotebookRequest({ ...choice, path }, opts.timezone);
    if (open && !open.isDisposed && open.model.dirty) {
      await open.save();
    }
    const { job, definition } = await model.client.submitNotebook(body);
    if (job) {
      model.claim(job);
      Notification.info(`Submitted ${path} as GPU job #${job.id}`, {
        autoClose: 5000,
        actions: [{ label: 'Show log', callback: () => ctx.openLog(job.id) }]
      });
      await model.refreshJob(job.id).catch(() => undefined);
    }
    if (definition) {
      Notification.info(
        `Scheduled ${path} (${definition.schedule}, ${definition.timezone}) as schedule #${definition.id}`,
        {
          autoClose: 5000,
          actions: [{ label: 'Show schedules', callback: () => ctx.showSchedules() }]
        }
      );
      await model.refreshDefinitions();
    }
  });
}

/** "Submit Script…": run the Python script at `path` (may be '') as a batch job. */
export async function submitScript(ctx: ISubmitContext, path: string): Promise<void> {
  const { model } = ctx;
  const options: ISubmitFormOptions = {
    ...clusterOptions(model),
    kind: 'script',
    path,
    parameters: '',
    unsaved: false
  };
  await dialogUntilSent('Submit a script to the GPU queue', options, async choice => {
    const job = await model.client.submitJob(buildScriptRequest(choice));
    model.claim(job);
    Notification.info(`Submitted ${choice.path} as GPU job #${job.id}`, {
      autoClose: 5000,
      actions: [{ label: 'Show log', callback: () => ctx.openLog(job.id) }]
    });
    await model.refreshJob(job.id).catch(() => undefined);
  });
}
