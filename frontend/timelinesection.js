// The "over time" section: its controls (what the colour shows, a run to
// subtract, the way back from a zoom) and the depth x time view, fetched at
// one column per pixel of the steps shown: the whole run, or the range a drag
// picked.

import {hintedSection, html, labelled} from './dom.js';
import {markDrawn} from './drawn.js';
import {fetchOnset} from './onset.js';
import {LatestRequest} from './requests.js';
import {renderTimeline} from './timeline.js';
import * as layout from './timelinelayout.js';
import * as timelinemodel from './timelinemodel.js';

// How long the chart's size must hold still before the view asks for another width.
const SETTLE_MS = 150;

const CHOICES = [
  {value: 'rms/output_gradient', label: 'RMS of the output gradient', field: 'rms', role: 'output_gradient'},
  {value: 'rms/input_gradient', label: 'RMS of the input gradient', field: 'rms', role: 'input_gradient'},
  {value: 'rms/activation', label: 'RMS of the activation', field: 'rms', role: 'activation'},
  {value: 'zero_share/activation', label: 'Share of exact zeros in the activation', field: 'zero_share', role: 'activation'},
  {value: 'zero_share/output_gradient', label: 'Share of exact zeros in the output gradient', field: 'zero_share',
    role: 'output_gradient'},
  {value: 'update_ratio/weight', label: 'Update ratio of the weights', field: 'update_ratio', role: 'weight'},
  {value: 'flush_share/output_gradient', field: 'flush_share', role: 'output_gradient',
    label: 'Share of the output gradient that flushes to zero in float16 (or the format the layer computes in)'},
  {value: 'flush_share/input_gradient', field: 'flush_share', role: 'input_gradient',
    label: 'Share of the input gradient that flushes to zero in float16 (or the format the layer computes in)'},
  {value: 'block_zero_share/output_gradient', field: 'block_zero_share', role: 'output_gradient',
    label: 'MXFP8 E4M3: share of the output gradient that becomes zero (blocks of 32)'},
  {value: 'block_zero_share/input_gradient', field: 'block_zero_share', role: 'input_gradient',
    label: 'MXFP8 E4M3: share of the input gradient that becomes zero (blocks of 32)'},
];

export class TimelineSection {
  /**
   * @param {function(Array): Promise} cached the tab's fetch-once cache: (key, fetch) -> promise
   * @param {function(string, number): void} onSelect opens a layer at a step
   */
  constructor(cached, onSelect) {
    this.cached = cached;
    this.onSelect = onSelect;
    this.run = null;
    this.runs = [];
    this.fieldSelect = html('select', {attrs: {name: 'timeline-field'}},
      CHOICES.map(({value, label}) => html('option', {text: label, attrs: {value}})));
    this.againstSelect = html('select', {attrs: {name: 'timeline-against'}});
    this.range = null; // the steps shown, {start, end}, or null: the whole run
    this.wholeRun = html('button', {className: 'timeline-whole', text: 'Whole run',
      attrs: {type: 'button', disabled: '', title: 'Show every logged step again (Escape)'}});
    this.status = html('p', {className: 'timeline-status', attrs: {role: 'status'}});
    this.sampleNote = html('p', {className: 'timeline-sample'});
    this.logged = null; // the run's logged steps: {count, first, last}, from /timeline
    this.layerSteps = null; // {layer, steps} the layer view shows
    this.chart = html('div', {className: 'timeline-container'});
    this.element = hintedSection('timeline-section', 'Layers over time',
      'Rows: every logged layer in model order, input at the top. Columns: the logged steps, oldest on the left, '
      + 'grouped to about one per pixel; each cell shows the largest value of its steps, so a one-step spike '
      + 'stays visible; grey: no value, grey stripes: a NaN or Inf. Outlined marks at the top of a row are the '
      + 'training-health flags, a diamond where each flag began, a warning sign where each warning began. '
      + 'Hover for the values; click to open that layer at that step; drag across steps to zoom into them '
      + '("Whole run" or Escape goes back).', [
      html('div', {className: 'toolbar'}, [
        labelled('Colour', this.fieldSelect),
        labelled('Minus run', this.againstSelect),
        this.wholeRun,
      ]),
      this.status,
      this.chart,
      this.sampleNote,
    ]);
    this.fieldSelect.addEventListener('change', () => this.load());
    this.againstSelect.addEventListener('change', () => this.load());
    this.wholeRun.addEventListener('click', () => this.zoom(null));
    document.addEventListener('keydown', (event) => {
      // Only while the view is on the page and zoomed, and not from a control's own keys.
      if (event.key !== 'Escape' || this.range === null || this.element.offsetParent === null) return;
      if (event.target instanceof HTMLSelectElement) return;
      this.zoom(null);
    });
    this.width = 0;
    this.drawnWidth = null; // the chart's width when last drawn (CSS pixels)
    this.requests = new LatestRequest();
    // A layout that settles resizes the chart several times in a row: act once it holds still.
    // Another width to ask for (`columnsFor`) is a new fetch; the same one is drawn again from
    // the cached answer, so that the step axis and the marks fit the drawing's new width.
    let settling = null;
    new ResizeObserver(() => {
      clearTimeout(settling);
      settling = setTimeout(() => {
        const shown = this.chart.clientWidth;
        const width = timelinemodel.columnsFor(layout.plotWidth(shown));
        if (width > 0 && (width !== this.width || (this.drawnWidth !== null && shown !== this.drawnWidth))) {
          this.load();
        }
      }, SETTLE_MS);
    }).observe(this.chart);
  }

  /** Shows `run`; `runs` are the tab's runs (the ones offered to subtract). */
  show(run, runs) {
    if (run !== this.run) {
      this.range = null;
      this.wholeRun.disabled = true;
    }
    this.run = run;
    this.runs = runs;
    const others = runs.filter((entry) => entry.run !== run).map(({run: name}) => name);
    const kept = others.includes(this.againstSelect.value) ? this.againstSelect.value : '';
    this.againstSelect.replaceChildren(html('option', {text: '(none)', attrs: {value: ''}}),
      ...others.map((name) => html('option', {text: name, attrs: {value: name}})));
    this.againstSelect.value = kept;
    return this.load();
  }

  /** What the view asks /timeline for: the run, the colour, the run subtracted, the steps and the width. */
  state() {
    return {run: this.run, colour: this.fieldSelect.value, against: this.againstSelect.value || null,
      range: this.drawnRange(), width: this.width};
  }

  /** The steps shown as the view's marker names them: `[start, end]`, or null for the whole run. */
  drawnRange() {
    return this.range ? [this.range.start, this.range.end] : null;
  }

  /** Shows the steps of `range` (`{start, end}`), or the whole run (null). */
  zoom(range) {
    this.range = range;
    this.wholeRun.disabled = range === null;
    return this.load();
  }

  async load() {
    const {run} = this;
    if (run === null) return;
    const choice = CHOICES.find(({value}) => value === this.fieldSelect.value) ?? CHOICES[0];
    const against = this.againstSelect.value || null;
    this.width = timelinemodel.columnsFor(layout.plotWidth(this.chart.clientWidth)) || 1000;
    const {width, range} = this;
    const drawnRange = this.drawnRange();
    // An answer draws only while the view still wants what it asked for: a slower answer
    // to an earlier colour, run or width never draws over a later one.
    const ticket = this.requests.start(this.state());
    const fetchOf = (name) => this.cached(['timeline', name, choice.field, choice.role, width, drawnRange],
      () => timelinemodel.fetchTimeline(name, {field: choice.field, role: choice.role, width, range}));
    // Where each flag began, marked on the drawing once in: the onset table's answer (one
    // fetch), which may take longer than the drawing's; without one the drawing has no marks.
    const onsets = this.cached(['onset', run], () => fetchOnset(run));
    let bodies;
    try {
      bodies = await Promise.all((against ? [run, against] : [run]).map(fetchOf));
    } catch (error) {
      if (this.requests.isCurrent(ticket, this.state())) {
        this.chart.replaceChildren();
        let text = `Could not load the time view: ${error.message}`;
        if (error.status === 404 && range) {
          text = `No logged step from step ${range.start} to ${range.end}${against ? ` in run ${against}` : ''}: `
            + '"Whole run" or Escape goes back.';
        } else if (error.status === 404) {
          text = 'This run has no digest (written by an older tb_gradviz): the time view needs one.';
        }
        this.status.textContent = text;
        markDrawn(this.element, {run, colour: choice.value, against, range: drawnRange, error: error.message});
      }
      return;
    }
    if (!this.requests.isCurrent(ticket, this.state())) return;
    const [body, other] = bodies;
    const {matrix, status} = timelinemodel.timelineView(body, other ?? null);
    this.status.textContent = status;
    const drawn = {run, colour: choice.value, against, range: drawnRange};
    if (matrix) {
      const drawing = renderTimeline(this.chart, matrix, {
        title: layout.colourTitle(choice.field, choice.role, matrix.diverging),
        onSelect: this.onSelect,
        onZoom: (picked) => this.zoom(picked),
      });
      // The marker then also says how many onsets of flags and of warnings are marked.
      onsets.then((answer) => {
        if (this.requests.isCurrent(ticket, this.state())) {
          const marked = drawing.markOnsets(answer.onsets);
          markDrawn(this.element, {...drawn, onsets: marked.flags, warnings: marked.warnings});
        }
      }, () => {});
    } else {
      this.chart.replaceChildren();
    }
    this.drawnWidth = this.chart.clientWidth;
    if (range === null) {
      this.logged = {count: body.steps, first: body.columns.first_step[0], last: body.columns.last_step.at(-1)};
    }
    this.renderSampleNote();
    markDrawn(this.element, drawn);
  }

  /** The steps the layer view has of `layer` (its series'): said to be a sample when fewer than logged. */
  noteLayerSteps(layer, steps) {
    this.layerSteps = {layer, steps};
    this.renderSampleNote();
  }

  renderSampleNote() {
    const {logged, layerSteps} = this;
    const sampled = logged && layerSteps && layerSteps.steps.length > 0 && layerSteps.steps.length < logged.count;
    this.sampleNote.textContent = sampled
      ? `The histograms of ${layerSteps.layer} in "The layer" are a sample: ${layerSteps.steps.length} of the run's `
        + `${logged.count} logged steps, from step ${layerSteps.steps[0]} to ${layerSteps.steps.at(-1)} `
        + `(TensorBoard keeps a sample of each series: --samples_per_plugin). This view reads every step `
        + `(${logged.first} to ${logged.last}).`
      : '';
  }
}
