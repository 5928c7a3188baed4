// The layer view's distribution over steps: per tensor, a heatmap of its
// magnitude bins (rows) over steps (columns) with a colour bar of the shares
// its shades stand for, and under it the tensor's spread over steps. Both step
// axes tick at steps that a column holds (stepaxis.js).

import * as captions from './captions.js';
import * as charts from './charts.js';
import * as flowmodel from './flowmodel.js';
import * as model from './model.js';
import {html, round, svg} from './dom.js';
import {stepTicks} from './stepaxis.js';

const HEATMAP = charts.chartBox({width: 420, height: 200, left: 46, right: 10, top: 8, bottom: 30});
const SPREAD = charts.chartBox({width: 420, height: 120, left: 46, right: 10, top: 14, bottom: 30});
// The colour bar under the heatmap: a strip per sign's colour, shaded as the cells are.
const SCALE = charts.chartBox({width: 420, height: 50, left: 46, right: 10, top: 16, bottom: 16});
const SCALE_STRIP = 6;
// Shares are shaded on a log scale from this decade (10⁻⁵) to 1, and never fainter than the floor.
const LOWEST_DECADE = -5;
const LEAST_OPACITY = 0.12;
// Each sign's strip, in the heatmap's order, named as its rows' labels name it.
const SIGNS = [['positive', '+'], ['zeros', '0'], ['negative', '−']];

/**
 * One heatmap per tensor of the layer, magnitude bins (rows) over steps
 * (columns), and under it the tensor's spread over steps. `onStep(step)`:
 * a click on the spread chose that step.
 */
export function renderHeatmaps(container, layer, tensors, step, onStep) {
  container.replaceChildren(...tensors.map(({info, series}) => html('figure', {
    className: `heatmap-figure role-${info.role}`, attrs: {'data-tensor': info.tensor},
  }, series ? [
    html('figcaption', {text: captions.tensorTitle(info, layer.tensors)}),
    heatmap(series, step),
    shareScale(),
    spreadOverSteps(series, step, onStep),
  ] : [
    html('figcaption', {text: captions.tensorTitle(info, layer.tensors)}),
    html('p', {className: 'empty', text: 'no data'}),
  ])));
}

// The grid of style.css' `.heatmaps`: figures of at least this width, this far apart.
const FIGURE_MIN_WIDTH = 300;
const FIGURE_GAP = 12;

/**
 * The width, in CSS pixels, of the plots over steps in `container`: the
 * columns to ask /series for (rounded up to 100, so that a few pixels do not
 * fetch again). Before any is drawn, that of a figure in a full row of the
 * container's grid; undefined (the server's default) while it is not laid out.
 */
export function overStepsWidth(container) {
  const drawn = container.querySelector('svg.spread');
  let width = drawn?.getBoundingClientRect().width;
  if (!width) {
    const outer = container.getBoundingClientRect().width;
    const perRow = Math.max(1, Math.floor((outer + FIGURE_GAP) / (FIGURE_MIN_WIDTH + FIGURE_GAP)));
    width = (outer - FIGURE_GAP * (perRow - 1)) / perRow;
  }
  const plot = width * (SPREAD.plotWidth / SPREAD.width);
  return plot > 0 ? Math.ceil(plot / 100) * 100 : undefined;
}

/**
 * The standard deviation of a tensor over steps, on a log axis: a band from
 * each column's smallest to its largest value, so that a spike at one step of
 * thousands shows. Hovering names the column's steps and values; a click
 * calls `onStep` with its last step.
 */
function spreadOverSteps(series, step, onStep) {
  const box = SPREAD;
  const {first, last, low, high} = model.fieldOverSteps(series, 'std');
  const count = first.length;
  const chart = charts.chartFrame(box, {className: 'spread',
    label: `standard deviation over ${series.steps.length} steps, in ${count} columns`});
  chart.dataset.columns = count;
  const range = flowmodel.logRange([low, high]);
  if (!range) {
    charts.emptyMessage(chart, box, 'no finite non-zero spread');
    return chart;
  }
  const yOf = charts.logScale(range, {bottom: box.baseline, height: box.plotHeight, zeroY: box.baseline});
  charts.logAxis(chart, box, {range, yOf, zeroY: box.baseline, zeros: false, maxTicks: 4});
  const xOf = (k) => box.left + (k / count) * box.plotWidth;
  const positive = (value) => value > 0 && Number.isFinite(value);
  charts.drawBand(chart, {
    count, xOf, className: 'band',
    // A column whose smallest spread is 0 reaches down to the axis.
    lowY: (k) => (positive(low[k]) ? yOf(low[k]) : positive(high[k]) ? box.baseline : NaN),
    highY: (k) => (positive(high[k]) ? yOf(high[k]) : NaN),
  });
  chart.append(svg('rect', {className: 'frame', attrs: {x: box.left, y: box.top, width: box.plotWidth, height: box.plotHeight}}));
  const column = model.latestIndexAtOrBefore(first, step);
  charts.stepAxis(chart, box, {
    first: first[0], last: last[count - 1],
    currentX: column >= 0 ? xOf(column + 0.5) : null, currentStep: step,
    ticks: axisTicks(box, {first_step: first, last_step: last}),
  });
  const tip = svg('text', {className: 'band-tip', attrs: {x: box.plotRight, y: box.top - 4, 'text-anchor': 'end'}});
  chart.append(tip);
  const columnAt = (event) => {
    const rect = chart.getBoundingClientRect();
    const x = ((event.clientX - rect.left) * box.width) / rect.width;
    return Math.min(count - 1, Math.max(0, Math.floor(((x - box.left) / box.plotWidth) * count)));
  };
  chart.addEventListener('mousemove', (event) => {
    const k = columnAt(event);
    const steps = first[k] === last[k] ? `step ${first[k]}` : `steps ${first[k]}–${last[k]}`;
    const values = low[k] === high[k] ? model.formatNumber(high[k])
      : `${model.formatNumber(low[k])} to ${model.formatNumber(high[k])}`;
    tip.textContent = `${steps}: std ${values}`;
  });
  chart.addEventListener('mouseleave', () => {
    tip.textContent = '';
  });
  if (onStep) chart.addEventListener('click', (event) => onStep(last[columnAt(event)]));
  return chart;
}

function heatmap(series, step) {
  const box = HEATMAP;
  const {left, top} = box;
  const range = model.padToDecades(model.seriesRange(series), series.log.edges);
  const grid = model.distributionOverSteps(series, range);
  const bins = model.magnitudeBins(series.log.edges);
  const cellWidth = box.plotWidth / grid.steps.length;
  const cellHeight = box.plotHeight / grid.rows.length;
  const chart = charts.chartFrame(box, {className: 'heatmap',
    label: `share of elements per magnitude bin over ${grid.steps.length} steps`});

  grid.rows.forEach(({sign}, r) => {
    grid.cells[r].forEach((fraction, c) => {
      if (!(fraction > 0)) return;
      chart.append(svg('rect', {
        className: `cell ${sign === 0 ? 'zeros' : sign < 0 ? 'negative' : 'positive'}`,
        attrs: {x: round(left + c * cellWidth), y: round(top + r * cellHeight),
          width: round(cellWidth + 0.3), height: round(cellHeight + 0.3), 'fill-opacity': shade(fraction).toFixed(2)},
      }));
    });
  });
  const rowLabels = grid.rows.map(({sign, bin}, r) => ({
    position: top + (r + 0.5) * cellHeight,
    text: sign === 0 ? '0' : heatmapRowLabel(bins, sign, bin),
    pinned: sign === 0,
  })).filter((label) => label.text);
  for (const {position, text} of model.spacedLabels(rowLabels, 12)) {
    chart.append(svg('text', {className: 'tick', text, attrs: {x: left - 4, y: round(position + 3), 'text-anchor': 'end'}}));
  }

  chart.append(svg('rect', {className: 'frame', attrs: {x: left, y: top, width: box.plotWidth, height: box.plotHeight}}));
  const column = model.latestIndexAtOrBefore(grid.steps, step);
  charts.stepAxis(chart, box, {
    first: grid.steps[0], last: grid.lastStep,
    currentX: column >= 0 ? left + (column + 0.5) * cellWidth : null, currentStep: grid.steps[column],
    ticks: axisTicks(box, {first_step: grid.steps, last_step: grid.lastSteps}),
  });
  return chart;
}

/** The step axis' ticks under a chart `box` of equal columns (`{first_step, last_step}`). */
function axisTicks(box, columns) {
  return stepTicks(columns, box.plotWidth).map(({step, x}) => ({step, x: box.left + x}));
}

/**
 * A cell's opacity for the share `fraction` of the elements it holds: log shading, so that a bin
 * holding 0.1 % is still visible next to one holding 50 %.
 */
function shade(fraction) {
  return Math.min(1, Math.max(LEAST_OPACITY, (Math.log10(fraction) - LOWEST_DECADE) / -LOWEST_DECADE));
}

/**
 * The heatmap's colour bar: the shade of each share from 10⁻⁵ to 100 % in each sign's colour
 * (a strip each: positive, exact zeros, negative), with ticks at the decades.
 */
function shareScale() {
  const box = SCALE;
  const chart = charts.chartFrame(box, {className: 'heatmap-scale', label: 'colour bar: the share of the elements '
    + `in a bin, from ${percent(LOWEST_DECADE)} (faintest) to 100 % (darkest)`});
  chart.append(svg('text', {className: 'scale-title', text: 'share of the elements in a bin',
    attrs: {x: box.left, y: box.top - 5}}));
  const shades = 60;
  const width = box.plotWidth / shades;
  SIGNS.forEach(([sign, name], s) => {
    const y = box.top + s * SCALE_STRIP;
    for (let i = 0; i < shades; i++) {
      const fraction = 10 ** (LOWEST_DECADE * (1 - i / (shades - 1)));
      chart.append(svg('rect', {className: `cell ${sign}`, attrs: {x: round(box.left + i * width), y,
        width: round(width + 0.3), height: SCALE_STRIP, 'fill-opacity': shade(fraction).toFixed(2)}}));
    }
    chart.append(svg('text', {className: 'scale-sign', text: name,
      attrs: {x: box.left - 4, y: y + SCALE_STRIP - 0.5, 'text-anchor': 'end'}}));
  });
  const bottom = box.top + SIGNS.length * SCALE_STRIP;
  chart.append(svg('rect', {className: 'frame', attrs: {x: box.left, y: box.top, width: box.plotWidth,
    height: bottom - box.top}}));
  for (let decade = LOWEST_DECADE; decade <= 0; decade++) {
    const x = round(box.left + ((decade - LOWEST_DECADE) / -LOWEST_DECADE) * box.plotWidth);
    chart.append(
      svg('line', {className: 'axis', attrs: {x1: x, x2: x, y1: bottom, y2: bottom + 3}}),
      svg('text', {className: 'tick scale-tick', text: percent(decade), attrs: {x, y: bottom + 13,
        'text-anchor': decade === LOWEST_DECADE ? 'start' : decade === 0 ? 'end' : 'middle'}}),
    );
  }
  return chart;
}

/** A decade's share as a percentage: -5 -> "0.001 %". */
function percent(decade) {
  return `${+(100 * 10 ** decade).toPrecision(1)} %`;
}

/** The label of a row whose upper magnitude edge is a decade; '' for the others. */
function heatmapRowLabel(bins, sign, bin) {
  const edge = bins[bin].high;
  if (!Number.isFinite(edge) || !model.isDecade(edge)) return '';
  return `${sign < 0 ? '−' : ''}${model.edgeLabel(edge)}`;
}
