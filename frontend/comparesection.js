// The "Compare runs" section's controller: which tensor of the selected layer
// is compared, against which run, and the charts of both runs' series. The
// DOM is layout.js's; the charts are compare.js's.

import * as compare from './compare.js';
import {markWhenDrawn} from './drawn.js';
import * as layout from './layout.js';
import * as model from './model.js';
import {LatestRequest} from './requests.js';

export class CompareSection {
  /**
   * @param ui the layout's `compareTensorSelect`, `compareRunSelect` and `compareCharts`
   * @param {function(string, string, string): Promise} series the tab's cached /series of (run, layer, tensor)
   * @param {function(Error): void} fail shows a failed fetch
   */
  constructor(ui, series, fail) {
    this.ui = ui;
    this.series = series;
    this.fail = fail;
    this.run = null;
    this.runs = [];
    this.layer = null; // the /runs entry of the selected layer
    this.step = null;
    this.compareRun = undefined; // undefined: not chosen yet; null: "(none)" chosen
    this.compareTensor = null;
    this.comparison = null; // [{run, series}] of the compared tensor
    this.requests = new LatestRequest();
    ui.compareTensorSelect.addEventListener('change', () => {
      this.compareTensor = ui.compareTensorSelect.value;
      this.setOptions(); // the runs offered are those that logged this tensor
      this.load();
    });
    ui.compareRunSelect.addEventListener('change', () => {
      this.compareRun = ui.compareRunSelect.value || null;
      this.load();
    });
  }

  /** A new selected layer (of `run`, among the tab's `runs`): its options, nothing fetched. */
  setLayer(run, runs, layer) {
    this.run = run;
    this.runs = runs;
    this.layer = layer;
    this.comparison = null;
    this.setOptions();
  }

  /**
   * The tensors of the run comparison (the layer's own, then its weights'),
   * and the runs that logged the chosen one at this layer.
   */
  setOptions() {
    const {ui, layer} = this;
    const tensors = model.comparableTensors(layer.tensors);
    if (!tensors.some(({value}) => value === this.compareTensor)) {
      // The layer's own tensors are compared unless a weight's is asked for.
      const own = model.layerTensors(layer.tensors);
      const first = own.find(({role}) => role === 'input_gradient') ?? own[0] ?? layer.tensors[0];
      this.compareTensor = first?.tensor ?? null;
    }
    layout.setOptions(ui.compareTensorSelect, tensors, this.compareTensor);
    const others = this.runs.filter(({run, layers}) => run !== this.run && layers.some((entry) =>
      entry.layer === layer.layer && entry.tensors.some(({tensor}) => tensor === this.compareTensor)));
    const offered = others.some(({run}) => run === this.compareRun);
    if (this.compareRun === undefined || (this.compareRun !== null && !offered)) {
      this.compareRun = others[0]?.run ?? undefined;
    }
    layout.setOptions(ui.compareRunSelect,
      [{value: '', label: '(none)'}, ...others.map(({run}) => ({value: run}))], this.compareRun ?? '');
  }

  /** What the section compares: the run, layer and tensor, and the run compared with. */
  state() {
    return {run: this.run, layer: this.layer?.layer ?? null, tensor: this.compareTensor, against: this.compareRun ?? null};
  }

  /** Fetches (through the tab's cache) the compared series and draws them at `step`. */
  async load(step = this.step) {
    this.step = step;
    const {run, compareRun, compareTensor} = this;
    const layer = this.layer?.layer;
    if (!layer || !compareTensor) return;
    const runs = compareRun ? [run, compareRun] : [run];
    const ticket = this.requests.start(this.state());
    try {
      const series = await Promise.all(runs.map((name) => this.series(name, layer, compareTensor)));
      if (!this.requests.isCurrent(ticket, this.state())) return;
      this.comparison = runs.map((name, i) => ({run: name, series: series[i]}));
      this.drawn = {run, layer, tensor: compareTensor, against: compareRun ?? null};
    } catch (error) {
      if (this.requests.isCurrent(ticket, this.state())) this.fail(error);
      return;
    }
    this.render();
  }

  render() {
    if (!this.comparison) return;
    markWhenDrawn([this.ui.compareCharts], {...this.drawn, step: this.step},
      compare.renderRunComparison(this.ui.compareCharts, this.comparison, this.step));
  }
}
