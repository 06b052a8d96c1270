/**
 * The cluster map, shared by the sidebar panel and the dashboard: one cell per GPU in its
 * state's colour (exactly the legend's: memory used is a bar beside the colour, not a shade
 * over it), the jobs holding each GPU on hover, their GPUs highlighted together, a click
 * opening the job's page.
 */
import { GPU_STATE_COLOURS, GPU_STATE_LABELS, GPU_STATES, MEM_BAR_COLOUR } from './colors';
import { h } from './dom';
import { nodeRows } from './model';
import { ICluster } from './types';

/** The map of `cluster`; `openJob` is called with the job a clicked GPU belongs to. */
export function renderMap(cluster: ICluster, openJob: (jobId: number) => void): Node[] {
  if (cluster.nodes.length === 0) {
    return [
      h(
        'div',
        { className: 'jp-gpusched-empty' },
        h(
          'p',
          {},
          'The scheduler knows no GPU nodes yet (the first probe can take a few seconds).'
        ),
        h(
          'p',
          {},
          'To add your GPU servers, list them in jupyter_server_config.py and restart Jupyter: ',
          h(
            'code',
            {},
            'c.GpuSchedApp.nodes = [{"name": "gpu1", "host": "gpu1.lab", "username": "me", "key_file": "~/.ssh/id_ed25519"}]'
          ),
          '. With no nodes listed, the embedded simulated cluster runs.'
        )
      )
    ];
  }
  const map = h('div', { className: 'jp-gpusched-map-nodes' });
  for (const row of nodeRows(cluster)) {
    map.append(
      h(
        'div',
        { className: 'jp-gpusched-node', 'data-node': row.name, 'data-up': String(row.up) },
        h('div', { className: 'jp-gpusched-node-name', title: row.error ?? row.summary }, row.name),
        h(
          'div',
          { className: 'jp-gpusched-gpus' },
          row.cells.map(cell =>
            h(
              'div',
              {
                className: `jp-gpusched-gpu ${cell.jobs.length ? 'jp-mod-held' : ''}`,
                'data-gpu': cell.key,
                'data-state': cell.state,
                'data-jobs': cell.jobs.join(','),
                title: cell.title,
                style: `background:${cell.colour}`,
                onclick: () => cell.jobs.length && openJob(cell.jobs[0])
              },
              h('span', { className: `jp-gpusched-gpu-label jp-mod-${cell.state}` }, cell.label),
              h(
                'div',
                { className: 'jp-gpusched-mem' },
                h('div', {
                  className: 'jp-gpusched-mem-used',
                  style: `height:${cell.memFillPct}%;background:${MEM_BAR_COLOUR}`
                })
              )
            )
          )
        ),
        h('div', { className: 'jp-gpusched-node-summary' }, row.summary),
        row.error ? h('div', { className: 'jp-gpusched-node-error' }, row.error) : null
      )
    );
  }
  highlightJobs(map);
  const legend = h(
    'div',
    { className: 'jp-gpusched-legend' },
    GPU_STATES.map(s =>
      h(
        'span',
        { className: 'jp-gpusched-legend-item', 'data-state': s },
        h('span', { className: 'jp-gpusched-swatch', style: `background:${GPU_STATE_COLOURS[s]}` }),
        GPU_STATE_LABELS[s]
      )
    ),
    h(
      'span',
      { className: 'jp-gpusched-legend-item' },
      h('span', { className: 'jp-gpusched-swatch', style: `background:${MEM_BAR_COLOUR}` }),
      'bar: memory used'
    ),
    h('span', { className: 'jp-gpusched-legend-item' }, 'hover: a job’s GPUs · click: its page')
  );
  return [map, legend];
}

/** Hovering a held GPU marks every GPU of the same job(s) (`jp-mod-highlight`). */
function highlightJobs(map: HTMLElement): void {
  const cells = () => [...map.querySelectorAll<HTMLElement>('.jp-gpusched-gpu')];
  const ids = (el: HTMLElement) => (el.dataset.jobs ?? '').split(',').filter(Boolean);
  map.addEventListener('mouseover', ev => {
    const cell = (ev.target as HTMLElement).closest<HTMLElement>('.jp-gpusched-gpu');
    const mine = cell ? ids(cell) : [];
    for (const other of cells()) {
      other.classList.toggle(
        'jp-mod-highlight',
        ids(other).some(id => mine.includes(id))
      );
    }
  });
  map.addEventListener('mouseleave', () => {
    for (const other of cells()) {
      other.classList.remove('jp-mod-highlight');
    }
  });
}
