/**
 * The submit dialogs' body, for a notebook ("Submit to GPU queue…") or a Python script
 * ("Submit script…"): name, GPUs, memory, model, limit, then parameters and when (notebook)
 * or arguments and environment (script).
 *
 * It checks as the user types, against the request's own rules and against the cluster's
 * shape (no node with 9 GPUs: the largest has 8), and keeps Submit disabled while a check
 * fails. `state()` / `restore()` carry what was typed into the next dialog when the server
 * refuses the request, so a refusal never loses it.
 */
import { Widget } from '@lumino/widgets';
import { h } from './dom';
import { fitProblem } from './fit';
import { parseDuration } from './format';
import {
  buildNotebookRequest,
  buildScriptRequest,
  parseEnv,
  parseParameters,
  splitArgs,
  SubmitInputError,
  When
} from './request';
import { INode } from './types';

/** Raw choices of the dialog, parsed into request input by the caller. */
export interface ISubmitChoice {
  name: string | null;
  gpus: number;
  gpuMemGb: number | null;
  gpuModel: string | null;
  maxRuntimeS: number | null;
  parameters: Record<string, unknown>;
  when: When;
  /** The script to run (script dialog; the notebook dialog's path is fixed). */
  path: string;
  args: string[];
  env: Record<string, string>;
}

/** What was typed, field by field (by `name`), to carry into a dialog shown again. */
export type FormState = Record<string, string | boolean>;

/** What the dialog starts from: the file and what is known of it and of the cluster. */
export interface ISubmitFormOptions {
  /** a notebook to run as a batch job, or a Python script */
  kind?: 'notebook' | 'script';
  /** the notebook or script, relative to the server root */
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
  /** the cluster's nodes, to check the request fits one (null: not known yet) */
  nodes?: readonly INode[] | null;
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
  private script = h('input', { type: 'text', name: 'script', placeholder: 'train.py' });
  private args = h('input', { type: 'text', name: 'args', placeholder: '--lr 0.1 --epochs 3' });
  private env = h('textarea', { rows: '2', name: 'env', placeholder: 'STEPS=20' });

  /** What to fix before Submit can be pressed; its `jp-mod-error` class disables the button. */
  private problem = h('p', { className: 'jp-gpusched-submit-problem' });
  /** Why the server refused the last Submit (the fields are kept; Submit stays possible). */
  private refused = h('p', { className: 'jp-gpusched-error jp-gpusched-submit-refused' });
  private readonly kind: 'notebook' | 'script';
  private readonly nodes: readonly INode[] | null;

  constructor(options: ISubmitFormOptions) {
    super();
    this.addClass('jp-gpusched-submit');
    const { path, tonight, timezone } = options;
    this.kind = options.kind ?? 'notebook';
    this.nodes = options.nodes ?? null;
    this.refused.hidden = true;
    // Checked as the user types; the line says what to fix and its `jp-mod-error` keeps the
    // dialog's Submit disabled.
    this.node.addEventListener('input', () => this.check());
    this.model.append(
      h('option', { value: '' }, 'any'),
      ...options.models.map(m => h('option', { value: m }, m))
    );
    const sizes = [
      h('label', {}, 'Name ', this.name),
      h('label', {}, 'GPUs ', this.gpus),
      h(
        'label',
        { title: 'GPU memory each GPU must give this job; less than a whole GPU shares it' },
        'GPU memory per GPU (GB) ',
        this.mem
      ),
      h('label', {}, 'GPU model ', this.model),
      h('label', {}, 'Max runtime ', this.runtime)
    ];
    if (this.kind === 'script') {
      this.script.value = path;
      // No name: the job is shown by its script's file name.
      this.name.placeholder = path.split('/').pop() || 'the script';
      this.node.append(
        h(
          'p',
          { className: 'jp-gpusched-hint' },
          'A copy of the script runs with python3 in the job’s own directory on the node.'
        ),
        this.refused,
        this.problem,
        h('label', {}, 'Script ', this.script),
        h('label', {}, 'Arguments ', this.args),
        ...sizes,
        h(
          'label',
          { className: 'jp-gpusched-block' },
          'Environment (NAME=VALUE per line)',
          this.env
        )
      );
      this.check();
      return;
    }
    // No name: the job is shown by its notebook's path.
    this.name.placeholder = path;
    this.params.value = options.parameters;
    const radio = (value: string, label: string, checked = false) =>
      h('label', {}, h('input', { type: 'radio', name: 'when', value, checked }), ` ${label}`);
    // Typing a schedule means "repeat": pick that choice for the user.
    this.cron.addEventListener('input', () => {
      const repeat = this.node.querySelector('input[name=when][value=cron]') as HTMLInputElement;
      repeat.checked = this.cron.value.trim() !== '';
    });
    this.script.value = path;
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
      this.refused,
      this.problem,
      ...sizes,
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

  /** Say why the server refused the request (what was typed stays). */
  showRefusal(message: string): void {
    this.refused.textContent = `The server refused it: ${message}`;
    this.refused.hidden = false;
  }

  /** What was typed, field by field. */
  state(): FormState {
    const out: FormState = {};
    for (const el of this.fields()) {
      const key = el.type === 'radio' ? `${el.name}=${el.value}` : el.name;
      out[key] = el.type === 'radio' ? (el as HTMLInputElement).checked : el.value;
    }
    return out;
  }

  /** Fill the fields from `state()` of an earlier form, and check them again. */
  restore(state: FormState): void {
    for (const el of this.fields()) {
      const key = el.type === 'radio' ? `${el.name}=${el.value}` : el.name;
      const value = state[key];
      if (typeof value === 'boolean') {
        (el as HTMLInputElement).checked = value;
      } else if (typeof value === 'string') {
        el.value = value;
      }
    }
    this.check();
  }

  private fields(): (HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement)[] {
    return [
      ...this.node.querySelectorAll<HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement>(
        'input[name], select[name], textarea[name]'
      )
    ];
  }

  private check(): void {
    let message = '';
    const value = this.getValue();
    if ('error' in value) {
      message = value.error;
    } else {
      try {
        if (this.kind === 'script') {
          buildScriptRequest(value);
        } else {
          buildNotebookRequest(value, null);
        }
        message = fitProblem(value, this.nodes) ?? '';
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

  /** The choices and what was typed, or the advice on a field that cannot be read. */
  getValue(): (ISubmitChoice | { error: string }) & { state: FormState } {
    try {
      return { ...this.read(), state: this.state() };
    } catch (err) {
      return { error: (err as Error).message, state: this.state() };
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
    const script = this.kind === 'script';
    return {
      name: this.name.value.trim() || null,
      gpus: Number(this.gpus.value),
      gpuMemGb: mem === '' ? null : Number(mem),
      gpuModel: this.model.value || null,
      maxRuntimeS,
      parameters: script ? {} : parseParameters(this.params.value),
      when:
        when === 'cron'
          ? { kind: 'cron', expr: this.cron.value.trim() }
          : { kind: when as 'now' | 'tonight' },
      path: this.script.value.trim(),
      args: script ? splitArgs(this.args.value) : [],
      env: script ? parseEnv(this.env.value) : {}
    };
  }
}
