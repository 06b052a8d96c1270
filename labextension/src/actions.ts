/**
 * Actions on a job that more than one view offers (the panel's rows, the job's page), with
 * the same confirmation and the same report of a refusal wherever they are taken.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { GpuschedModel } from './controller';

/** Ask, then cancel job `id` (`name` says which); true when it was cancelled. */
export async function cancelJob(model: GpuschedModel, id: number, name: string): Promise<boolean> {
  const answer = await showDialog({
    title: `Cancel job ${id}?`,
    body: `${name} will be removed from the queue, or stopped if it runs.`,
    buttons: [Dialog.cancelButton({ label: 'Keep' }), Dialog.warnButton({ label: 'Cancel job' })]
  });
  if (!answer.button.accept) {
    return false;
  }
  try {
    await model.client.cancel(id);
    await model.refreshJob(id);
    return true;
  } catch (err) {
    void showErrorMessage(`Could not cancel job ${id}`, (err as Error).message);
    return false;
  }
}
