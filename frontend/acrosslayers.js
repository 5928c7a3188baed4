// The "Across layers" section's controller: the gradient flow (the tab's run
// at the slider's step, the steps kept, a run overlaid) and the grid of every
// layer at that step, both drawn from the runs' /step. The DOM is layout.js's;
// the charts are flow.js's and compare.js's.

import * as captions from './captions.js';
import * as compare from './compare.js';
import {markDrawn} from './drawn.js';
import * as flow from './flow.js';
import * as flowmodel from './flowmodel.js';
import * as layout from './layout.js';
import {LatestRequest} from './requests.js';

export class AcrossLayersSection {
  /**
   * @param ui the layout's `flowRunSelect`, `keepStepButton`, `keptSteps`, `flowSummary`, `flow`,
   *   `gridTitle` and `grid`
   * @param {{snapshot: function(string, number): Promise, openLayerAt: function(string, number): void,
   *   fail: function(Error): void, isShown: function(): boolean}} tab the tab's cached /step of
   *   (run, step), what choosing a layer does, how a failed fetch is shown, and whether this
   *   section is the one shown
   */
  constructor(ui, tab) {
    this.ui = ui;
    this.tab = tab;
    this.run = null;
    this.runs = [];
    this.layer = null; // the name of the tab's selected layer
    this.step = null;
    this.flowRun = null; // the run overlaid on the gradient flow; null: none
    this.keptSteps = []; // steps the gradient flow keeps as extra lines
    this.flowView = null; // what the gradient flow last drew, redrawn when its width changes
    // Each draws only its latest request's answer, and only for the state it still shows.
    this.requests = {grid: new LatestRequest(), flow: new LatestRequest()};
    ui.flowRunSelect.addEventListener('change', () => {
      this.flowRun = ui.flowRunSelect.value || null;
      this.loadFlow();
    });
    ui.keepStepButton.addEventListener('click', () => {
      if (this.step !== null) this.setKeptSteps(flowmodel.keepStep(this.keptSteps, this.step));
    });
    new ResizeObserver(() => this.renderFlow()).observe(ui.flow);
  }

  /**
   * The tab's run among its `runs`: a new run drops the kept steps, and the step, which is the
   * previous run's until `select` gives the new one's; the others can be overlaid.
   */
  setRun(run, runs) {
    if (run !== this.run) {
      this.setKeptSteps([], false);
      this.step = null;
    }
    this.run = run;
    this.runs = runs;
    const others = runs.filter((entry) => entry.run !== run).map((entry) => ({value: entry.run}));
    if (!others.some(({value}) => value === this.flowRun)) this.flowRun = null;
    layout.setOptions(this.ui.flowRunSelect, [{value: '', label: '(none)'}, ...others], this.flowRun ?? '');
  }

  /** The tab's selected layer (its name) and step: what `load` draws. */
  select(layer, step) {
    this.layer = layer;
    this.step = step;
  }

  /** Fetches and draws the flow, then the grid: both wait for the same /step answer, and the grid takes longer to draw. */
  load() {
    this.loadFlow();
    this.loadGrid();
  }

  async loadGrid() {
    const {run, step} = this;
    if (run === null || step === null) return;
    const ticket = this.requests.grid.start({run, step});
    const current = () => this.requests.grid.isCurrent(ticket, {run: this.run, step: this.step});
    let snapshot;
    try {
      snapshot = await this.tab.snapshot(run, step);
    } catch (error) {
      if (current()) this.tab.fail(error);
      return;
    }
    if (!current()) return;
    // Choosing a layer in the grid brings the keyboard (and the view) back up to its panels.
    const layers = this.runs.find((entry) => entry.run === run)?.layers ?? [];
    compare.renderLayerGrid(this.ui.grid, this.ui.gridTitle, snapshot, {
      currentLayer: this.layer,
      layerOf: (name) => layers.find((layer) => layer.layer === name),
      onSelect: (name) => this.tab.openLayerAt(name, this.step),
    });
    markDrawn(this.ui.grid, {run, step, layer: this.layer ?? null});
  }

  setKeptSteps(steps, load = true) {
    this.keptSteps = steps;
    flow.renderKeptSteps(this.ui.keptSteps, steps, (step) => this.setKeptSteps(steps.filter((s) => s !== step)));
    if (load) this.loadFlow();
  }

  /** Fetches /step for every line of the gradient flow: each run at the slider's step and the kept ones. */
  async loadFlow() {
    const {run, step, flowRun, keptSteps} = this;
    if (run === null || step === null) return;
    const state = () => ({run: this.run, step: this.step, against: this.flowRun, kept: this.keptSteps});
    const ticket = this.requests.flow.start(state());
    const wanted = flowmodel.wantedLines(run, flowRun, step, keptSteps);
    let snapshots;
    try {
      // A run with no step at or before the one asked for (404) has no line there.
      snapshots = await Promise.all(wanted.map(({run: name, requested}) =>
        this.tab.snapshot(name, requested).catch((error) => (error.status === 404 ? null : Promise.reject(error)))));
    } catch (error) {
      if (this.requests.flow.isCurrent(ticket, state())) this.tab.fail(error);
      return;
    }
    if (!this.requests.flow.isCurrent(ticket, state())) return;
    const lines = flowmodel.distinctLines(wanted, snapshots);
    const entryOf = (name) => this.runs.find((entry) => entry.run === name);
    const names = (name) => entryOf(name)?.layers.map(({layer}) => layer) ?? [];
    const shown = (flowRun ? [run, flowRun] : [run]).map(entryOf);
    this.flowView = {
      slots: flowmodel.alignLayers(names(run), flowRun ? names(flowRun) : null),
      lines,
      roles: flowmodel.flowRoles(shown),
      updates: flowmodel.hasUpdates(shown),
      onSelect: (name) => this.tab.openLayerAt(name, this.step),
      drawn: {run, step, against: flowRun, kept: keptSteps},
    };
    this.ui.flowSummary.textContent = lines.filter(({pin}) => pin === 0)
      .map(({snapshot}) => captions.flagSummary(snapshot)).join(' ');
    this.renderFlow(true);
  }

  /** Draws the gradient flow at the width of its box; without `force`, only when that width changed. */
  renderFlow(force = false) {
    const width = this.ui.flow.clientWidth;
    if (!this.flowView || !this.tab.isShown() || (!force && Math.abs(width - this.flowView.width) < 1)) return;
    this.flowView.width = width;
    flow.renderFlow(this.ui.flow, {...this.flowView, width: width || 1200, currentLayer: this.layer});
    markDrawn(this.ui.flow, {...this.flowView.drawn, layer: this.layer ?? null});
  }
}
