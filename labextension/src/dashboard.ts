/**
 * The panel as a wide main-area dashboard: the map, queue and window beside charts of every
 * node's GPUs over time (utilization, memory, power), like jupyterlab-nvdashboard for the
 * whole cluster. The charts read `GET cluster/history` every few seconds while shown.
 */
import type { Message } from '@lumino/messaging';
import { BoxPanel, Widget } from '@lumino/widgets';
import { chartModel, chartSvg } from './charts';
import { GpuschedModel } from './controller';
import { h } from './dom';
import { IPanelOpeners, GpuschedPanel } from './panel';
import { IGpuSeries } from './types';

/** How often the charts are fetched again while the dashboard is shown. */
const REFRESH_MS = 5000;

/** One section per node: its GPUs' utilization, memory and power over the kept samples. */
export class HistoryCharts extends Widget {
  private timer: ReturnType<typeof setInterval>;
  private body = h('div', { className: 'jp-gpusched-history-nodes' });
  private note = h('p', { className: 'jp-gpusched-hint' });

  constructor(private readonly model: GpuschedModel) {
    super();
    this.addClass('jp-gpusched-history');
    this.node.append(
      h('h2', { className: 'jp-gpusched-title' }, 'GPUs over time'),
      this.note,
      this.body
    );
    this.timer = setInterval(() => this.isVisible && void this.refresh(), REFRESH_MS);
    void this.refresh();
  }

  /** Shown again (its tab brought forward): draw the samples taken while it was hidden. */
  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
  }

  dispose(): void {
    clearInterval(this.timer);
    super.dispose();
  }

  /** Fetch every GPU's samples and draw one section per node. */
  async refresh(): Promise<void> {
    let history;
    try {
      history = await this.model.client.history({ points: 240 });
    } catch (err) {
      this.note.textContent = `Cannot load the GPU history: ${(err as Error).message}`;
      return;
    }
    // The newest sample drawn, in the page (and in words): a chart that stopped following
    // the cluster shows it.
    const latest = Math.max(0, ...history.series.flatMap(s => s.at.map(a => Date.parse(a))));
    this.node.dataset.latest = latest ? new Date(latest).toISOString() : '';
    this.note.textContent =
      `A sample per probe of the nodes (every ${history.interval_s} s); the last ` +
      `${history.kept_samples} per GPU are kept in the scheduler's memory.` +
      (latest ? ` Latest sample ${clock(latest)}.` : '');
    const byNode = new Map<string, IGpuSeries[]>();
    for (const s of history.series) {
      byNode.set(s.node, [...(byNode.get(s.node) ?? []), s]);
    }
    const opts = { intervalS: history.interval_s, width: 300, height: 100 };
    this.body.replaceChildren(
      ...[...byNode.entries()].map(([node, series]) =>
        h(
          'section',
          { className: 'jp-gpusched-history-node', 'data-node': node },
          h('h3', {}, `${node} · ${series[0]?.model ?? ''}`),
          h(
            'div',
            { className: 'jp-gpusched-charts' },
            chartSvg(chartModel(series, 'util', opts)),
            chartSvg(chartModel(series, 'memory', opts)),
            chartSvg(chartModel(series, 'power', opts))
          )
        )
      )
    );
  }
}

function clock(ms: number): string {
  return new Date(ms).toLocaleTimeString([], {
    hour: '2-digit',
    minute: '2-digit',
    second: '2-digit'
  });
}

/** The wide dashboard: the panel (map, queue, window) left, the history charts right. */
export class Dashboard extends BoxPanel {
  constructor(model: GpuschedModel, open: IPanelOpeners) {
    super({ direction: 'left-to-right', spacing: 8 });
    this.id = 'gpusched-dashboard';
    this.addClass('jp-gpusched-dashboard');
    this.title.label = 'GPU cluster';
    this.title.closable = true;
    const panel = new GpuschedPanel(model, open, true);
    const charts = new HistoryCharts(model);
    BoxPanel.setStretch(panel, 2);
    BoxPanel.setStretch(charts, 3);
    this.addWidget(panel);
    this.addWidget(charts);
  }

  /**
   * Closing the tab ends the dashboard (its timers stop); opening it again makes a new one.
   * A closed but kept widget would be "open" to the opener yet shown nowhere.
   */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }
}
