/** The "Submit to GPU queue" dialog body: name, GPUs, memory, model, limit, parameters, when. */
import { Widget } from '@lumino/widgets';
import { h } from './dom';
import { parseDuration } from './format';
import { buildNotebookRequest, parseParameters, SubmitInputError, When } from './request';

/** Raw choices of the dialog, parsed into request input by the caller. */
export interface ISubmitChoice {
  name: string | null;
  gpus: number;
  gpuMemGb: number | null;
  gpuModel: string | null;
  maxRuntimeS: number | null;
  parameters: Record<string, unknown>;
  when: When;
}

/** What the dialog starts from: the notebook and what is known of it and of the cluster. */
export interface ISubmitFormOptions {
  /** the notebook, relative to the server root */
  path: string;
  /** local time "tonight" starts, or null when the night window is on */
  tonight: string | null;
  /** the zone a cron schedule is read in (the browser's), for the label */
  timezone: string | null;
  /** `name=value` lines from the notebook's `parameters` cell */
  parameters: string;
  /** the GPU models the cluster has, to choose from */
  models: string[];
  /** the notebook is open with unsaved changes (they are saved before it is submitted) */
  unsaved: boolean;
}

export class SubmitForm extends Widget {
  private name = h('input', { type: 'text', name: 'name', maxLength: 200 });
  private gpus = h('input', {
    type: 'number',
    min: '1',
    max: '64',
    step: '1',
    value: '1',
    name: 'gpus'
  });
  private mem = h('input', {
    type: 'number',
    min: '0',
    step: '1',
    placeholder: 'whole GPUs',
    name: 'gpu_mem_gb'
  });
  private model = h('select', { name: 'gpu_model' });
  private runtime = h('input', {
    type: 'text',
    name: 'max_runtime',
    placeholder: 'no limit (e.g. 2h, 90m)'
  });
  private params = h('textarea', {
    rows: '3',
    name: 'parameters',
    placeholder: 'lr=0.1\nepochs=3'
  });
  private cron = h('input', {
    type: 'text',
    name: 'cron',
    placeholder: '0 22 * * 1-5'
  });

  /** What to fix before Submit can be pressed; its `jp-mod-error` class disables the button. */
  private problem = h('p', { className: 'jp-gpusched-submit-problem' });

  constructor(options: ISubmitFormOptions) {
    super();
    this.addClass('jp-gpusched-submit');
    const { path, tonight, timezone } = options;
    // Checked as the user types; the line says what to fix and its `jp-mod-error` keeps the
    // dialog's Submit disabled.
    this.node.addEventListener('input', () => this.check(path));
    // No name: the job is shown by its notebook's path.
    this.name.placeholder = path;
    this.params.value = options.parameters;
    this.model.append(
      h('option', { value: '' }, 'any'),
      ...options.models.map(m => h('option', { value: m }, m))
    );
    const radio = (value: string, label: string, checked = false) =>
      h('label', {}, h('input', { type: 'radio', name: 'when', value, checked }), ` ${label}`);
    // Typing a schedule means "repeat": pick that choice for the user.
    this.cron.addEventListener('input', () => {
      const repeat = this.node.querySelector('input[name=when][value=cron]') as HTMLInputElement;
      repeat.checked = this.cron.value.trim() !== '';
    });
    this.node.append(
      h('p', {}, h('code', {}, path)),
      ...(options.unsaved
        ? [
            h(
              'p',
              { className: 'jp-gpusched-submit-unsaved' },
              'This notebook has unsaved changes: it is saved before it is submitted.'
            )
          ]
        : []),
      this.problem,
      h('label', {}, 'Name ', this.name),
      h('label', {}, 'GPUs ', this.gpus),
      h('label', {}, 'GPU memory per GPU (GB) ', this.mem),
      h('label', {}, 'GPU model ', this.model),
      h('label', {}, 'Max runtime ', this.runtime),
      h(
        'label',
        { className: 'jp-gpusched-block' },
        options.parameters
          ? 'Parameters (name=value per line, from the parameters cell)'
          : 'Parameters (name=value per line)',
        this.params
      ),
      h(
        'fieldset',
        {},
        h('legend', {}, 'When'),
        radio('now', 'now', true),
        radio(
          'tonight',
          tonight ? `tonight (from ${tonight})` : 'tonight (the night window is on: starts now)'
        ),
        radio('cron', timezone ? `repeat (cron, ${timezone} time)` : 'repeat (cron)'),
        this.cron
      )
    );
  }

  private check(path: string): void {
    let message = '';
    const value = this.getValue();
    if ('error' in value) {
      message = value.error;
    } else {
      try {
        buildNotebookRequest({ path, ...value }, null);
      } catch (err) {
        message = (err as Error).message;
      }
    }
    this.problem.textContent = message;
    const before = this.problem.classList.contains('jp-mod-error');
    if (this.problem.classList.toggle('jp-mod-error', message !== '') === before) {
      return;
    }
    // The dialog checked this same event (it listens on the document, capturing) before this
    // ran: ask it to look again. The event starts at the document, so it does not come back here.
    document.dispatchEvent(new Event('input'));
  }

  /** The choices, or the advice on a field that cannot be read. */
  getValue(): ISubmitChoice | { error: string } {
    try {
      return this.read();
    } catch (err) {
      return { error: (err as Error).message };
    }
  }

  private read(): ISubmitChoice {
    const when =
      (this.node.querySelector('input[name=when]:checked') as HTMLInputElement | null)?.value ??
      'now';
    const mem = this.mem.value.trim();
    const runtime = this.runtime.value.trim();
    const maxRuntimeS = runtime === '' ? null : parseDuration(runtime);
    if (maxRuntimeS === null && runtime !== '') {
      throw new SubmitInputError(
        `max runtime "${runtime}" is not a duration; write it like 90m, 2h or 1h30m`
      );
    }
    return {
      name: this.name.value.trim() || null,
      gpus: Number(this.gpus.value),
      gpuMemGb: mem === '' ? null : Number(mem),
      gpuModel: this.model.value || null,
      maxRuntimeS,
      parameters: parseParameters(this.params.value),
      when:
        when === 'cron'
          ? { kind: 'cron', expr: this.cron.value.trim() }
          : { kind: when as 'now' | 'tonight' }
    };
  }
}
