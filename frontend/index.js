// Entry of the GradViz tab. TensorBoard loads data/plugin_entry.html in an
// iframe, imports this module and calls render().

import {AcrossLayersSection} from './acrosslayers.js';
import {CompareSection} from './comparesection.js';
import {markDrawn, markWhenDrawn} from './drawn.js';
import {connectToHost, followHost} from './host.js';
import * as layout from './layout.js';
import * as model from './model.js';
import {OnsetTable} from './onset.js';
import {RoutingMapView} from './routemap.js';
import * as precisionview from './precision.js';
import {AnswerCache, LatestRequest} from './requests.js';
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
    this.cache = new AnswerCache();
    // Each view that fetches draws only its latest request's answer, and only for the state it still shows.
    this.requests = {aside: new LatestRequest(), precision: new LatestRequest()};
    // Answers that arrive after the selection moved on are dropped.
    this.generation = 0;
    this.stepTimer = null;
    // What TensorBoard's URL asks for (a shared link): used until the first view is shown.
    this.wanted = urlstate.readHostState(window);
    // The section shown. Only it fetches and draws; the others catch up when shown.
    this.view = this.wanted.view;
    this.timeShown = null; // {run, runs} the "Over time" section last showed
  }

  async start() {
    const {ui} = this;
    ui.sections.onChoose = (view) => this.showView(view);
    ui.sections.show(this.view);
    this.runComparison = new CompareSection(ui, (run, layer, tensor) => this.series(run, layer, tensor),
      (error) => this.fail(error));
    ui.runSelect.addEventListener('change', () => this.selectRun(ui.runSelect.value));
    ui.layerSelect.addEventListener('change', () => this.selectLayer(ui.layerSelect.value));
    ui.stepSlider.addEventListener('input', () => this.selectStep(this.steps[Number(ui.stepSlider.value)]));
    ui.logToggle.addEventListener('change', () => this.view === 'layer' && this.renderLayer());
    ui.reloadButton.addEventListener('click', () => this.reload());
    this.acrossLayers = new AcrossLayersSection(ui, {
      snapshot: (run, step) => this.snapshot(run, step),
      openLayerAt: (layer, step) => this.openLayerAt(layer, step),
      fail: (error) => this.fail(error),
      isShown: () => this.view === 'layers',
    });
    this.routeMap = new RoutingMapView(ui.routeMap, (run, layer, step) =>
      this.cached(['routing_map', run, layer, step], () => fetchRoutingMap(run, layer, step)));
    // Over time: where each flag began, then layers over time; a click there opens a layer at a step.
    const openLayerAt = (layer, step) => this.openLayerAt(layer, step);
    this.onset = new OnsetTable((key, fetch) => this.cached(key, fetch), openLayerAt);
    this.timeline = new TimelineSection((key, fetch) => this.cached(key, fetch), openLayerAt);
    ui.sections.panel('timeline').append(this.onset.element, this.timeline.element);
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
    this.timeShown = null;
    this.routeMap?.forget();
    return this.loadRuns();
  }

  /** Fetches once per key while the bounded cache keeps it; a failed fetch is forgotten so that it is retried. */
  cached(key, fetch) {
    return this.cache.get(key, fetch);
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
    this.run = run;
    this.ui.runSelect.value = run;
    this.acrossLayers.setRun(run, this.runs);
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

  /**
   * Shows "The layer" section at `layer` and the latest logged step at or
   * before `step`. The keyboard goes to the layer control: what was clicked is hidden now.
   */
  openLayerAt(layer, step) {
    this.view = 'layer';
    this.ui.sections.show('layer');
    this.ui.sections.tabList.scrollIntoView({block: 'start'});
    this.ui.layerSelect.focus({preventScroll: true});
    return this.selectLayer(layer, step);
  }

  /** Selects a layer of the run; at `step` when given, else the step the slider had (or the last). */
  async selectLayer(name, step = null) {
    const generation = ++this.generation;
    const layer = this.runs.find((entry) => entry.run === this.run)?.layers.find((entry) => entry.layer === name);
    if (!layer) return;
    this.ui.layerSelect.value = name;
    const withSeries = async (info) => info && {info, series: await this.series(this.run, name, info.tensor)};
    let tensors;
    let weights;
    try {
      [tensors, weights] = await Promise.all([
        Promise.all(model.layerTensors(layer.tensors).map(withSeries)),
        this.loadWeights(layer),
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
    const weightSeries = weights.flatMap(({values, gradient}) => [values, gradient]).filter(Boolean);
    this.steps = model.unionSteps([...tensors, ...weightSeries].map(({series}) => series.steps));
    this.timeline.noteLayerSteps(name, this.steps);
    this.ui.fullRecords.textContent = model.fullRecordsLine(this.steps);
    const asked = step ?? this.wanted.step;
    if (asked !== null) {
      this.step = asked;
      this.followLatest = false;
    }
    const index = this.followLatest
      ? this.steps.length - 1
      : Math.max(0, model.latestIndexAtOrBefore(this.steps, this.step));
    this.ui.stepSlider.max = String(Math.max(0, this.steps.length - 1));
    this.ui.stepSlider.disabled = this.steps.length < 2;
    this.runComparison.setLayer(this.run, this.runs, layer);
    this.selectStep(this.steps[index]);
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
    this.wanted = {run: null, layer: null, step: null, view: this.view};
    this.writeUrl();
    this.refreshView();
  }

  /** Shows a section (the user chose it): the URL says so, and the section draws what it lacks. */
  showView(view) {
    this.view = view;
    this.ui.sections.show(view);
    this.writeUrl();
    this.refreshView();
  }

  writeUrl() {
    urlstate.writeHostState(window, {run: this.run, layer: this.layer?.layer, step: this.step, view: this.view});
  }

  /**
   * Fetches (through the cache) and draws the shown section at the current
   * run, layer and step; the hidden ones wait until they are shown.
   */
  refreshView() {
    const {run, step} = this;
    clearTimeout(this.stepTimer);
    if (run === null || step === null || !this.layer) return;
    if (this.view === 'layer') {
      this.renderLayer();
    } else if (this.view === 'layers') {
      this.acrossLayers.select(this.layer.layer, step);
      this.stepTimer = setTimeout(() => this.acrossLayers.load(), STEP_VIEWS_DELAY_MS);
    } else if (this.view === 'timeline') {
      if (this.timeShown?.run === run && this.timeShown.runs === this.runs) return;
      this.timeShown = {run, runs: this.runs};
      this.timeline.show(run, this.runs);
      this.onset.show(run);
    } else if (this.view === 'compare') {
      this.runComparison.load(step);
    }
  }

  renderLayer() {
    if (!this.layer) return;
    const {ui, step} = this;
    views.renderLayerTitle(ui.layerTitle, this.layer, step);
    const panels = views.renderPanels(ui.panels, this.layer, this.tensors, {step, logarithmic: ui.logToggle.checked});
    const weights = weightsview.renderWeights(ui.weights, this.layer, this.weights, {step, logarithmic: ui.logToggle.checked});
    this.renderAside();
    views.renderHeatmaps(ui.heatmaps, this.layer, this.tensors, step,
      (chosen) => this.selectStep(this.steps[Math.max(0, model.latestIndexAtOrBefore(this.steps, chosen))]));
    this.routeMap.update(this.run, this.layer, step);
    this.renderPrecision();
    markWhenDrawn([ui.layerTitle, ui.panels, ui.weights, ui.heatmaps],
      {run: this.run, layer: this.layer.layer, step, logarithmic: ui.logToggle.checked}, Promise.all([panels, weights]));
  }

  /**
   * The routing card (a pooling layer's /routing at the slider's step alone)
   * and the explanation, beside the panels.
   */
  /** The state the layer view shows: its run, layer and step. */
  layerState() {
    return {run: this.run, layer: this.layer?.layer ?? null, step: this.step};
  }

  async renderAside() {
    const {run, step, layer} = this;
    const ticket = this.requests.aside.start(this.layerState());
    let routing = null;
    if (layer.pooling && step !== null) {
      try {
        routing = await this.cached(['routing', run, layer.layer, step],
          () => model.fetchRouting(run, layer.layer, undefined, {step}));
      } catch {
        routing = null; // no routing record at or before this step: no card
      }
    }
    if (!this.requests.aside.isCurrent(ticket, this.layerState())) return;
    views.renderAside(this.ui.aside, layer, routing && model.routingAt(routing, step));
    markDrawn(this.ui.aside, {run, layer: layer.layer, step});
  }

  /** The precision panel of the selected layer, from the run's /step at the slider's step. */
  async renderPrecision() {
    const {run, step, layer} = this;
    const ticket = this.requests.precision.start(this.layerState());
    let snapshot = null;
    try {
      snapshot = await this.snapshot(run, step);
    } catch {
      snapshot = null; // no step at or before this one: the panel says there is no record
    }
    if (!this.requests.precision.isCurrent(ticket, this.layerState())) return;
    const entry = snapshot?.layers.find((candidate) => candidate.layer === layer.layer);
    precisionview.renderPrecision(this.ui.precision, entry);
    markDrawn(this.ui.precision, {run, layer: layer.layer, step});
  }

  /** A run at the latest step `<= step` (/step), shared by the grid and the gradient flow. */
  snapshot(run, step) {
    return this.cached(['step', run, step], () => model.fetchStep(run, step));
  }
}
