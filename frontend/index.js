// Entry of the GradViz tab. TensorBoard loads data/plugin_entry.html in an
// iframe, imports this module and calls render().

import * as captions from './captions.js';
import * as compare from './compare.js';
import * as flow from './flow.js';
import * as flowmodel from './flowmodel.js';
import {connectToHost, followHost} from './host.js';
import * as layout from './layout.js';
import * as model from './model.js';
import {RoutingMapView} from './routemap.js';
import * as precisionview from './precision.js';
import {fetchRoutingMap} from './routemapmodel.js';
import {TimelineSection} from './timelinesection.js';
import * as urlstate from './urlstate.js';
import * as views from './views.js';
import * as weightsview from './weightsview.js';

// Dragging the slider fires many input events; /step is fetched once it rests.
const STEP_VIEWS_DELAY_MS = 150;

export async function render() {
  layout.addStylesheets();
  layout.followHostTheme();
  const app = new App(layout.createLayout(document.body), connectToHost(window));
  await app.start();
}

// ------------------------------------------------------------ the tab

class App {
  constructor(ui, host) {
    this.ui = ui;
    this.host = host;
    this.hostRuns = null; // run names from TensorBoard; null: all runs of /runs
    this.runs = [];
    this.run = null;
    this.layer = null; // the /runs entry of the selected layer
    this.steps = [];
    this.step = null;
    // At the last step, a reload that brings new steps moves on to the new last one.
    this.followLatest = true;
    this.tensors = []; // {info, series} of the selected layer's own tensors
    this.weights = []; // per weight of the selected layer (weights=True): weightsview.renderWeights' entries
    this.routing = null;
    this.compareRun = undefined; // undefined: not chosen yet; null: "(none)" chosen
    this.compareTensor = null;
    this.comparison = null; // [{run, series}] of the compared tensor
    this.cache = new Map();
    // Answers that arrive after the selection moved on are dropped.
    this.generation = 0;
    this.stepTimer = null;
    this.flowRun = null; // the run overlaid on the gradient flow; null: none
    this.keptSteps = []; // steps the gradient flow keeps as extra lines
    this.flowView = null; // what the gradient flow last drew, redrawn when its width changes
    // What TensorBoard's URL asks for (a shared link): used until the first view is shown.
    this.wanted = urlstate.readHostState(window);
  }

  async start() {
    const {ui} = this;
    ui.runSelect.addEventListener('change', () => this.selectRun(ui.runSelect.value));
    ui.layerSelect.addEventListener('change', () => this.selectLayer(ui.layerSelect.value));
    ui.stepSlider.addEventListener('input', () => this.selectStep(this.steps[Number(ui.stepSlider.value)]));
    ui.logToggle.addEventListener('change', () => this.renderLayer());
    ui.reloadButton.addEventListener('click', () => this.reload());
    ui.compareTensorSelect.addEventListener('change', () => {
      this.compareTensor = ui.compareTensorSelect.value;
      this.setCompareOptions(); // the runs offered are those that logged this tensor
      this.loadComparison();
    });
    ui.compareRunSelect.addEventListener('change', () => {
      this.compareRun = ui.compareRunSelect.value || null;
      this.loadComparison();
    });
    ui.flowRunSelect.addEventListener('change', () => {
      this.flowRun = ui.flowRunSelect.value || null;
      this.loadFlow();
    });
    ui.keepStepButton.addEventListener('click', () => {
      if (this.step !== null) this.setKeptSteps(flowmodel.keepStep(this.keptSteps, this.step));
    });
    new ResizeObserver(() => this.renderFlow()).observe(ui.flow);
    this.routeMap = new RoutingMapView(ui.routeMap, (run, layer, step) =>
      this.cached(['routing_map', run, layer, step], () => fetchRoutingMap(run, layer, step)));
    // Layers over time, above the layer view: a click opens a layer at a step there.
    this.timeline = new TimelineSection((key, fetch) => this.cached(key, fetch), (layer, step) =>
      this.selectLayer(layer).then(() => {
        this.selectStep(this.steps[Math.max(0, model.latestIndexAtOrBefore(this.steps, step))]);
        ui.layerSection.scrollIntoView({block: 'start'});
      }));
    ui.layerSection.before(this.timeline.element);
    if (this.host) {
      this.hostRuns = await followHost(this.host, {
        onRuns: (runs) => {
          this.hostRuns = runs;
          this.reload(); // new runs mean new data: /runs is stale too
        },
        onReload: () => this.reload(),
      });
    }
    await this.loadRuns();
  }

  reload() {
    this.cache.clear();
    this.routeMap?.forget();
    return this.loadRuns();
  }

  /** Fetches once per key; a failed fetch is forgotten so that it is retried. */
  cached(key, fetch) {
    const id = JSON.stringify(key);
    if (!this.cache.has(id)) {
      this.cache.set(id, fetch().catch((error) => {
        this.cache.delete(id);
        throw error;
      }));
    }
    return this.cache.get(id);
  }

  /** A tensor's /series, downsampled by the server to about one column per pixel of the charts over steps. */
  series(run, layer, tensor) {
    const width = views.overStepsWidth(this.ui.heatmaps);
    return this.cached(['series', run, layer, tensor, width], () => model.fetchSeries(run, layer, tensor, undefined, {width}));
  }

  fail(error) {
    layout.showStatus(this.ui.status, `Could not load data: ${error.message}`, true);
  }

  async loadRuns() {
    const generation = ++this.generation;
    let runs;
    try {
      runs = await this.cached(['runs'], () => model.fetchRuns());
    } catch (error) {
      this.fail(error);
      return;
    }
    if (generation !== this.generation) return;
    this.runs = model.visibleRuns(runs, this.hostRuns);
    layout.setOptions(this.ui.runSelect, this.runs.map(({run}) => ({value: run})), this.run);
    if (this.runs.length === 0) {
      this.run = null;
      layout.showStatus(this.ui.status, runs.length
        ? 'None of the runs selected in TensorBoard has GradViz data.'
        : 'No GradViz data yet. Log some with tb_gradviz.GradVizCallback, then reload.');
      return;
    }
    layout.showStatus(this.ui.status, '');
    const keep = this.runs.some(({run}) => run === this.run);
    const asked = this.runs.some(({run}) => run === this.wanted.run) ? this.wanted.run : null;
    await this.selectRun(keep ? this.run : asked ?? this.runs[0].run);
  }

  async selectRun(run) {
    if (run !== this.run) this.setKeptSteps([], false);
    this.run = run;
    this.ui.runSelect.value = run;
    this.setFlowOptions();
    this.timeline.show(run, this.runs);
    const layers = this.runs.find((entry) => entry.run === run)?.layers ?? [];
    layout.setOptions(this.ui.layerSelect,
      layers.map((layer) => ({value: layer.layer, label: `${layer.layer} (${layer.layer_class ?? '?'})`})),
      this.layer?.layer);
    const keep = layers.find((layer) => layer.layer === this.layer?.layer);
    // A max pool is what people come here to look at.
    const fallback = layers.find((layer) => layer.pooling?.type === 'max') ?? layers[0];
    const asked = layers.find((layer) => layer.layer === this.wanted.layer);
    if (keep ?? asked ?? fallback) await this.selectLayer((keep ?? asked ?? fallback).layer);
  }

  async selectLayer(name) {
    const generation = ++this.generation;
    const layer = this.runs.find((entry) => entry.run === this.run)?.layers.find((entry) => entry.layer === name);
    if (!layer) return;
    this.ui.layerSelect.value = name;
    const withSeries = async (info) => info && {info, series: await this.series(this.run, name, info.tensor)};
    let tensors;
    let weights;
    let routing;
    try {
      [tensors, weights, routing] = await Promise.all([
        Promise.all(model.layerTensors(layer.tensors).map(withSeries)),
        this.loadWeights(layer),
        layer.pooling ? this.cached(['routing', this.run, name], () => model.fetchRouting(this.run, name)) : null,
      ]);
    } catch (error) {
      if (generation === this.generation) this.fail(error);
      return;
    }
    if (generation !== this.generation) return;
    layout.showStatus(this.ui.status, '');
    this.layer = layer;
    this.tensors = tensors;
    this.weights = weights;
    this.routing = routing;
    const weightSeries = weights.flatMap(({values, gradient}) => [values, gradient]).filter(Boolean);
    this.steps = model.unionSteps([...tensors, ...weightSeries].map(({series}) => series.steps));
    this.timeline.noteLayerSteps(name, this.steps);
    if (this.wanted.step !== null) {
      this.step = this.wanted.step;
      this.followLatest = false;
    }
    const index = this.followLatest
      ? this.steps.length - 1
      : Math.max(0, model.latestIndexAtOrBefore(this.steps, this.step));
    this.ui.stepSlider.max = String(Math.max(0, this.steps.length - 1));
    this.ui.stepSlider.disabled = this.steps.length < 2;
    this.comparison = null;
    this.setCompareOptions();
    this.selectStep(this.steps[index]);
    this.loadComparison();
  }

  /** The weights of a layer (weights=True) with their series and update records; [] for a layer without. */
  async loadWeights(layer) {
    const {run} = this;
    const weights = model.layerWeights(layer);
    if (weights.length === 0) return [];
    const withSeries = async (info) => info && {info, series: await this.series(run, layer.layer, info.tensor)};
    const [updates, ...entries] = await Promise.all([
      weights.some((weight) => weight.updates)
        ? this.cached(['updates', run, layer.layer], () => model.fetchUpdates(run, layer.layer)) : null,
      ...weights.map(async (weight) => ({...weight, values: await withSeries(weight.values),
        gradient: await withSeries(weight.gradient)})),
    ]);
    return entries.map(({updates: hasUpdates, ...weight}) =>
      ({...weight, hasUpdates, updates: model.weightUpdates(updates, weight.weight)}));
  }

  selectStep(step) {
    if (step === undefined) return;
    this.step = step;
    const index = model.latestIndexAtOrBefore(this.steps, step);
    this.followLatest = index === this.steps.length - 1;
    this.ui.stepSlider.value = String(index);
    this.ui.stepSlider.setAttribute('aria-valuetext', `step ${step}`);
    this.ui.stepOutput.textContent = `${step} (${index + 1} of ${this.steps.length})`;
    this.ui.keepStepButton.textContent = `Keep step ${step}`;
    this.renderLayer();
    this.renderComparison();
    this.wanted = {run: null, layer: null, step: null};
    urlstate.writeHostState(window, {run: this.run, layer: this.layer?.layer, step});
    clearTimeout(this.stepTimer);
    // The flow first: both wait for the same /step answer, and the grid takes longer to draw.
    this.stepTimer = setTimeout(() => {
      this.loadFlow();
      this.loadGrid();
    }, STEP_VIEWS_DELAY_MS);
  }

  renderLayer() {
    if (!this.layer) return;
    const {ui, step} = this;
    views.renderLayerTitle(ui.layerTitle, this.layer, step);
    views.renderPanels(ui.panels, this.layer, this.tensors, {step, logarithmic: ui.logToggle.checked});
    weightsview.renderWeights(ui.weights, this.layer, this.weights, {step, logarithmic: ui.logToggle.checked});
    const routing = this.routing && model.routingAt(this.routing, step);
    views.renderAside(ui.aside, this.layer, routing);
    views.renderHeatmaps(ui.heatmaps, this.layer, this.tensors, step,
      (chosen) => this.selectStep(this.steps[Math.max(0, model.latestIndexAtOrBefore(this.steps, chosen))]));
    this.routeMap.update(this.run, this.layer, step);
    this.renderPrecision();
  }

  /** The precision panel of the selected layer, from the run's /step at the slider's step. */
  async renderPrecision() {
    const {run, step, layer} = this;
    let snapshot = null;
    try {
      snapshot = await this.snapshot(run, step);
    } catch {
      snapshot = null; // no step at or before this one: the panel says there is no record
    }
    if (run !== this.run || step !== this.step || layer !== this.layer) return;
    const entry = snapshot?.layers.find((candidate) => candidate.layer === layer.layer);
    precisionview.renderPrecision(this.ui.precision, entry);
  }

  /** A run at the latest step `<= step` (/step), shared by the grid and the gradient flow. */
  snapshot(run, step) {
    return this.cached(['step', run, step], () => model.fetchStep(run, step));
  }

  async loadGrid() {
    const {run, step} = this;
    if (run === null || step === null) return;
    let snapshot;
    try {
      snapshot = await this.snapshot(run, step);
    } catch (error) {
      this.fail(error);
      return;
    }
    if (run !== this.run || step !== this.step) return;
    // Choosing a layer in the grid brings the keyboard (and the view) back up to its panels.
    const layers = this.runs.find((entry) => entry.run === run)?.layers ?? [];
    compare.renderLayerGrid(this.ui.grid, this.ui.gridTitle, snapshot, {
      currentLayer: this.layer?.layer,
      layerOf: (name) => layers.find((layer) => layer.layer === name),
      onSelect: (name) => this.selectLayer(name).then(() => this.ui.layerSelect.focus()),
    });
  }

  // ---------------------------------------------------------- gradient flow

  setFlowOptions() {
    const others = this.runs.filter(({run}) => run !== this.run).map(({run}) => ({value: run}));
    if (!others.some(({value}) => value === this.flowRun)) this.flowRun = null;
    layout.setOptions(this.ui.flowRunSelect, [{value: '', label: '(none)'}, ...others], this.flowRun ?? '');
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
    const wanted = flowmodel.wantedLines(run, flowRun, step, keptSteps);
    let snapshots;
    try {
      // A run with no step at or before the one asked for (404) has no line there.
      snapshots = await Promise.all(wanted.map(({run: name, requested}) =>
        this.snapshot(name, requested).catch((error) => (error.status === 404 ? null : Promise.reject(error)))));
    } catch (error) {
      this.fail(error);
      return;
    }
    if (run !== this.run || step !== this.step || flowRun !== this.flowRun || keptSteps !== this.keptSteps) return;
    const lines = flowmodel.distinctLines(wanted, snapshots);
    const entryOf = (name) => this.runs.find((entry) => entry.run === name);
    const names = (name) => entryOf(name)?.layers.map(({layer}) => layer) ?? [];
    const shown = (flowRun ? [run, flowRun] : [run]).map(entryOf);
    this.flowView = {
      slots: flowmodel.alignLayers(names(run), flowRun ? names(flowRun) : null),
      lines,
      roles: flowmodel.flowRoles(shown),
      updates: flowmodel.hasUpdates(shown),
      onSelect: (name) => this.selectLayer(name).then(() => {
        this.ui.layerSection.scrollIntoView({block: 'start'});
        this.ui.layerSelect.focus({preventScroll: true});
      }),
    };
    this.ui.flowSummary.textContent = lines.filter(({pin}) => pin === 0)
      .map(({snapshot}) => captions.flagSummary(snapshot)).join(' ');
    this.renderFlow(true);
  }

  /** Draws the gradient flow at the width of its box; without `force`, only when that width changed. */
  renderFlow(force = false) {
    const width = this.ui.flow.clientWidth;
    if (!this.flowView || (!force && Math.abs(width - this.flowView.width) < 1)) return;
    this.flowView.width = width;
    flow.renderFlow(this.ui.flow, {...this.flowView, width: width || 1200, currentLayer: this.layer?.layer});
  }

  /**
   * The tensors of the run comparison (the layer's own, then its weights'),
   * and the runs that logged the chosen one at this layer.
   */
  setCompareOptions() {
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

  async loadComparison() {
    const {run, compareRun, compareTensor} = this;
    const layer = this.layer?.layer;
    if (!layer || !compareTensor) return;
    const runs = compareRun ? [run, compareRun] : [run];
    try {
      const series = await Promise.all(runs.map((name) => this.series(name, layer, compareTensor)));
      const current = run === this.run && layer === this.layer?.layer
        && compareRun === this.compareRun && compareTensor === this.compareTensor;
      if (!current) return;
      this.comparison = runs.map((name, i) => ({run: name, series: series[i]}));
    } catch (error) {
      this.fail(error);
      return;
    }
    this.renderComparison();
  }

  renderComparison() {
    if (!this.comparison) return;
    compare.renderRunComparison(this.ui.compareCharts, this.comparison, this.step);
  }
}
