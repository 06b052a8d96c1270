/** The "Submit to GPU queue" dialog body: GPUs, memory, parameters, when. */
import { Widget } from '@lumino/widgets';
import { h } from './dom';
import { parseParameters, When } from './request';

/** Raw choices of the dialog, parsed into request input by the caller. */
export interface ISubmitChoice {
  gpus: number;
  gpuMemGb: number | null;
  parameters: Record<string, unknown>;
  when: When;
}

export class SubmitForm extends Widget {
  private gpus = h('input', {
    type: 'number',
    min: '0',
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

  /**
   * @param path the notebook, relative to the server root
   * @param tonight local time "tonight" starts, or null when the night window is on
   * @param timezone the zone a cron schedule is read in (the browser's), for the label
   */
  constructor(path: string, tonight: string | null, timezone: string | null) {
    super();
    this.addClass('jp-gpusched-submit');
    const radio = (value: string, label: string, checked = false) =>
      h('label', {}, h('input', { type: 'radio', name: 'when', value, checked }), ` ${label}`);
    // Typing a schedule means "repeat": pick that choice for the user.
    this.cron.addEventListener('input', () => {
      const repeat = this.node.querySelector('input[name=when][value=cron]') as HTMLInputElement;
      repeat.checked = this.cron.value.trim() !== '';
    });
    this.node.append(
      h('p', {}, h('code', {}, path)),
      h('label', {}, 'GPUs ', this.gpus),
      h('label', {}, 'GPU memory per GPU (GB) ', this.mem),
      h(
        'label',
        { className: 'jp-gpusched-block' },
        'Parameters (name=value per line)',
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
    return {
      gpus: Number(this.gpus.value),
      gpuMemGb: mem === '' ? null : Number(mem),
      parameters: parseParameters(this.params.value),
      when:
        when === 'cron'
          ? { kind: 'cron', expr: this.cron.value.trim() }
          : { kind: when as 'now' | 'tonight' }
    };
  }
}
