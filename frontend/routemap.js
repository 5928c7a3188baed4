// The routing-map view of the layer view: for one probe example and
// one channel of a pooling layer, the pool's input with its windows, winners
// and ties; the input gradient on the same grid; the upstream gradient per
// window; a hover that tells one window's story. Numbers and texts come from
// routemapmodel.js, pixels from routemapdraw.js, its DOM from routemaplayout.js.

import {ROLE_TITLES, producedBy} from './captions.js';
import {formatPercent} from './model.js';
import * as draw from './routemapdraw.js';
import {buildView, markerLegend, scaleLegend} from './routemaplayout.js';
import * as shape from './routemapmodel.js';
import {html} from './dom.js';
import {markDrawn} from './drawn.js';

const GAP = 16; // between the figures, as .routemap-figures sets it
const MAX_CELL = 28;
const MIN_CELL = 2;

/**
 * The view, in `container` (hidden while the layer has no map).
 *
 * @param {function(string, string, ?number): Promise<object>} load the
 *   /routing_map answer of (run, layer, step); step null for the latest.
 */
export class RoutingMapView {
  constructor(container, load) {
    this.container = container;
    this.load = load;
    this.key = null;
    this.tabStep = null;
    this.answer = null;
    this.channel = null; // the channel number chosen, kept across steps where served
    this.hovered = -1;
    this.generation = 0;
    this.ui = buildView(container);
    container.hidden = true;
    const {ui} = this;
    ui.channelSelect.addEventListener('change', () => {
      this.channel = Number(ui.channelSelect.value);
      this.present(this.answer);
    });
    ui.stepSlider.addEventListener('input', () => this.goTo(this.answer?.steps[Number(ui.stepSlider.value)]));
    for (const [figure, kind] of [[ui.input, 'map'], [ui.gradient, 'map'], [ui.upstream, 'windows']]) {
      figure.stack.addEventListener('pointermove', (event) => this.hoverAt(figure, kind, event));
      figure.stack.addEventListener('pointerleave', () => this.setHovered(-1));
    }
    ui.input.stack.addEventListener('keydown', (event) => this.onKey(event));
    ui.input.stack.addEventListener('blur', () => this.setHovered(-1));
    new ResizeObserver(() => this.drawIfResized()).observe(container);
    // Canvas colours are resolved once per theme: follow TensorBoard's and the system's.
    new MutationObserver(() => this.drawMaps())
      .observe(document.documentElement, {attributes: true, attributeFilter: ['class']});
    matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => this.drawMaps());
  }

  /** Follows the layer view: a new run or layer opens its map, a new tab step moves the map's. */
  update(run, layer, step) {
    if (!shape.mayHaveRoutingMap(layer)) {
      this.key = null;
      this.generation++;
      this.container.hidden = true;
      markDrawn(this.container, {run, layer: layer.layer, step: null, channel: null});
      return;
    }
    const key = JSON.stringify([run, layer.layer]);
    const previousStep = this.tabStep;
    this.tabStep = step;
    if (key !== this.key) {
      this.key = key;
      this.run = run;
      this.layer = layer;
      this.answer = null;
      this.hovered = -1;
      this.open();
    } else if (step !== previousStep && this.answer) {
      this.goTo(shape.mapStepFor(this.answer.steps, step));
    }
  }

  /** Forgets what was shown, so that the next update fetches again (after a reload). */
  forget() {
    this.key = null;
  }

  async open() {
    const generation = ++this.generation;
    const {run, layer} = this;
    try {
      // The latest map lists the steps; then the one at the tab's step.
      const latest = await this.load(run, layer.layer, null);
      const step = shape.mapStepFor(latest.steps, this.tabStep);
      const answer = step === latest.step ? latest : await this.load(run, layer.layer, step);
      if (generation === this.generation) this.present(answer);
    } catch (error) {
      if (generation === this.generation) this.fail(error);
    }
  }

  async goTo(step) {
    if (step === undefined || step === this.answer?.step) return;
    const generation = ++this.generation;
    try {
      const answer = await this.load(this.run, this.layer.layer, step);
      if (generation === this.generation) this.present(answer);
    } catch (error) {
      if (generation === this.generation) this.fail(error);
    }
  }

  fail(error) {
    this.routing = null;
    this.ui.figures.hidden = true;
    this.setHovered(-1);
    // No map after all (a run logged with routing_map=False): nothing to show.
    this.container.hidden = error.status === 404;
    this.ui.status.textContent = `Could not load the routing map: ${error.message}`;
    this.ui.status.hidden = false;
    markDrawn(this.container, {run: this.run, layer: this.layer.layer, error: error.message});
  }

  /** Shows an answer: controls, texts and the maps of the chosen channel. */
  present(answer) {
    const {ui} = this;
    this.answer = answer;
    this.container.hidden = false;
    ui.status.hidden = true;
    const channels = answer.channels.map(({channel}) => channel);
    if (!channels.includes(this.channel)) this.channel = channels[0] ?? null;
    ui.channelSelect.replaceChildren(...channels.map((channel) => {
      const option = html('option', {text: String(channel)});
      option.value = String(channel);
      return option;
    }));
    ui.channelSelect.value = String(this.channel);
    ui.channelSelect.disabled = channels.length < 2;
    const index = answer.steps.indexOf(answer.step);
    ui.stepSlider.max = String(answer.steps.length - 1);
    ui.stepSlider.value = String(index);
    ui.stepSlider.disabled = answer.steps.length < 2;
    ui.stepSlider.setAttribute('aria-valuetext', `step ${answer.step}`);
    ui.stepOutput.textContent = `${answer.step} (${index + 1} of ${answer.steps.length})`;
    ui.meta.textContent = shape.describeMap(answer);
    if (channels.length === 0) {
      this.routing = null;
      ui.figures.hidden = true;
      ui.rule.textContent = 'No channel mapped at this step.';
      ui.check.textContent = ui.summary.textContent = '';
      this.setHovered(-1);
      this.markDrawn();
      return;
    }
    ui.figures.hidden = false;
    this.layout = shape.mapLayout(answer);
    this.routing = shape.channelRouting(answer, this.layout, channels.indexOf(this.channel));
    ui.rule.textContent = shape.tieRule(answer);
    ui.check.textContent = shape.checkSentence(answer, this.routing);
    ui.check.classList.toggle('alarm', this.routing.check.differing.length > 0);
    ui.summary.textContent = summaryText(answer, this.routing);
    ui.input.caption.textContent = `Input of the pool · channel ${this.channel}`;
    ui.gradient.caption.textContent = `${ROLE_TITLES.input_gradient}: ${producedBy('input_gradient', this.layer)}`;
    ui.upstream.caption.textContent = `${ROLE_TITLES.output_gradient}, one value per window`;
    this.drawMaps();
    if (this.hovered >= this.layout.rects.length) this.hovered = -1;
    this.showTooltip();
    this.markDrawn();
  }

  markDrawn() {
    markDrawn(this.container, {run: this.run, layer: this.layer.layer, step: this.answer.step, channel: this.channel});
  }

  /** The pixel size of a map cell and of a window cell at the view's width. */
  cellSizes() {
    const {crop, windows} = this.answer;
    const perFigure = Math.max(120, (this.ui.figures.clientWidth - 2 * GAP) / 3 - 2);
    const cell = Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(perFigure / crop.width)));
    const stride = Math.max(...this.layout.axes.map((axis) => axis.stride));
    const windowCell = Math.max(MIN_CELL, Math.min(cell * stride, Math.floor(perFigure / windows.cols)));
    return {cell, windowCell};
  }

  drawIfResized() {
    // Not while a new layer's map is on its way (no answer yet), nor while a hidden section holds it.
    if (!this.routing || !this.answer || this.container.hidden || this.container.clientWidth === 0) return;
    const sizes = this.cellSizes();
    if (sizes.cell !== this.sizes?.cell || sizes.windowCell !== this.sizes?.windowCell) this.drawMaps();
  }

  drawMaps() {
    if (!this.routing || !this.answer || this.container.hidden) return;
    const {ui, answer, layout, routing} = this;
    const inks = draw.resolveInks(this.container);
    this.inks = inks;
    this.sizes = this.cellSizes();
    const {cell, windowCell} = this.sizes;
    const {height, width} = answer.crop;
    const isMax = answer.pooling.type === 'max';
    const input = draw.sizeCanvas(ui.input.base, width * cell, height * cell);
    draw.paintCells(input, {values: routing.input, cols: width, cell, max: routing.max.input, scale: 'linear', inks});
    draw.paintWindows(input, {layout, tied: routing.tied, cell, inks});
    if (isMax) draw.paintWinners(input, {routing, cols: width, cell, inks});
    const gradient = draw.sizeCanvas(ui.gradient.base, width * cell, height * cell);
    draw.paintCells(gradient, {values: routing.gradient, cols: width, cell, max: routing.max.gradient, scale: 'log', inks});
    draw.paintCellOutlines(gradient, {indices: routing.check.differing, cols: width, cell, inks});
    const {rows, cols} = answer.windows;
    const upstream = draw.sizeCanvas(ui.upstream.base, cols * windowCell, rows * windowCell);
    draw.paintCells(upstream,
      {values: routing.upstream, cols, cell: windowCell, max: routing.max.upstream, scale: 'log', inks});
    for (const figure of [ui.input, ui.gradient, ui.upstream]) {
      draw.sizeCanvas(figure.overlay, parseFloat(figure.base.style.width), parseFloat(figure.base.style.height));
    }
    ui.input.legend.replaceChildren(...scaleLegend(routing.max.input, 'linear'), ...(isMax ? markerLegend() : []));
    ui.gradient.legend.replaceChildren(...scaleLegend(routing.max.gradient, 'log'));
    ui.upstream.legend.replaceChildren(...scaleLegend(routing.max.upstream, 'log'));
    ui.input.base.setAttribute('aria-label', `input map of channel ${this.channel}, ${height}×${width}, `
      + `${routing.tiedWindows} tied windows`);
    this.drawHighlight();
  }

  drawHighlight() {
    const {ui, hovered, sizes, inks} = this;
    if (!sizes) return;
    const {width} = this.answer.crop;
    for (const figure of [ui.input, ui.gradient, ui.upstream]) {
      figure.overlay.getContext('2d').clearRect(0, 0, figure.overlay.width, figure.overlay.height);
    }
    if (hovered < 0) return;
    const rect = this.layout.rects[hovered];
    const winner = this.routing.winner[hovered];
    const tiedAt = this.routing.tiedAt[hovered];
    for (const figure of [ui.input, ui.gradient]) {
      draw.paintHighlight(figure.overlay.getContext('2d'), {rect, winner, tiedAt, cols: width, cell: sizes.cell, inks});
    }
    const i = Math.floor(hovered / this.answer.windows.cols);
    const j = hovered % this.answer.windows.cols;
    draw.paintHighlight(ui.upstream.overlay.getContext('2d'), {rect: {top: i, left: j, height: 1, width: 1},
      winner: -1, cols: 1, cell: sizes.windowCell, inks});
  }

  hoverAt(figure, kind, event) {
    if (!this.routing) return;
    const box = figure.stack.getBoundingClientRect();
    const y = event.clientY - box.top;
    const x = event.clientX - box.left;
    const {cell, windowCell} = this.sizes;
    const {rows, cols} = this.answer.windows;
    let k = -1;
    if (kind === 'map') {
      k = shape.windowAt(this.layout, y / cell, x / cell);
    } else if (y >= 0 && x >= 0 && y < rows * windowCell && x < cols * windowCell) {
      k = Math.floor(y / windowCell) * cols + Math.floor(x / windowCell);
    }
    this.setHovered(k, {x: event.clientX, y: event.clientY});
  }

  /** Arrow keys walk the windows of the focused input map; Escape lets go. */
  onKey(event) {
    if (!this.routing) return;
    const {cols} = this.answer.windows;
    const moves = {ArrowLeft: -1, ArrowRight: 1, ArrowUp: -cols, ArrowDown: cols};
    if (event.key === 'Escape') {
      this.setHovered(-1);
      return;
    }
    if (!(event.key in moves)) return;
    event.preventDefault();
    const next = this.hovered < 0 ? 0 : this.hovered + moves[event.key];
    if (next < 0 || next >= this.layout.rects.length) return;
    const rect = this.layout.rects[next];
    const box = this.ui.input.stack.getBoundingClientRect();
    const {cell} = this.sizes;
    this.setHovered(next, {x: box.left + (rect.left + rect.width) * cell, y: box.top + (rect.top + rect.height) * cell});
  }

  setHovered(k, point) {
    if (point) this.pointer = point;
    if (k !== this.hovered) {
      this.hovered = k;
      this.drawHighlight();
      this.showTooltip();
    }
    if (k >= 0) placeTooltip(this.ui.tooltip, this.pointer);
  }

  showTooltip() {
    const {tooltip} = this.ui;
    if (this.hovered < 0 || !this.routing) {
      tooltip.hidden = true;
      return;
    }
    const details = shape.windowDetails(this.answer, this.layout, this.routing, this.hovered);
    tooltip.replaceChildren(
      html('strong', {text: details.title}),
      html('dl', {}, details.rows.flatMap(([name, value]) => [html('dt', {text: name}), html('dd', {text: value})])),
    );
    if (details.grid) {
      tooltip.append(html('table', {className: 'window-values', attrs: {'aria-label': 'the window\'s input values'}},
        details.grid.map((row) => html('tr', {}, row.map(({value, winner, tied}) =>
          html('td', {text: value, className: winner ? 'winner' : tied ? 'tied' : undefined}))))));
    }
    tooltip.hidden = false;
    placeTooltip(tooltip, this.pointer);
  }
}

function summaryText(answer, routing) {
  const windows = routing.upstream.length;
  const parts = [`${formatPercent(routing.gradientZeros / routing.gradient.length)} of the input gradient exactly 0`];
  if (answer.pooling.type === 'max') {
    parts.unshift(`${routing.tiedWindows} of ${windows} windows tied`);
    const shared = [...routing.routedFrom].filter((n) => n > 1).length;
    if (shared > 0) parts.push(`${shared} positions won by more than one window`);
  }
  return `Step ${answer.step}: ${parts.join(' · ')}.`;
}

/** Keeps the tooltip next to the pointer and inside the window. */
function placeTooltip(tooltip, point) {
  if (!point || tooltip.hidden) return;
  const margin = 14;
  const {offsetWidth: width, offsetHeight: height} = tooltip;
  const left = point.x + margin + width > innerWidth ? point.x - margin - width : point.x + margin;
  const top = Math.min(point.y + margin, innerHeight - height - 4);
  tooltip.style.left = `${Math.max(4, left)}px`;
  tooltip.style.top = `${Math.max(4, top)}px`;
}
