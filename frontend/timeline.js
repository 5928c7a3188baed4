// The depth x time view, drawn as a paper's heatmap: one row per layer (model
// order, each named at its left), one column per column of /timeline (about
// one per pixel), coloured by the chosen field on a colour bar with its scale,
// flags as marks in their colours, each flag's onset (/onset) where it began,
// and a step axis with round ticks (charts.stepAxis). The pointer's crosshair,
// its reading and the drag that zooms are timelinepointer.js'.

import {FLAG_TITLES} from './captions.js';
import * as charts from './charts.js';
import {html, svg} from './dom.js';
import * as layout from './timelinelayout.js';
import * as timelinemodel from './timelinemodel.js';
import {followPointer} from './timelinepointer.js';

const AXIS_HEIGHT = 36;
// The colour bar: its width and height, and how many steps of colour it is drawn in.
const BAR = {width: 320, height: 30, left: 12, right: 12, bar: 12, shades: 64};
const NO_VALUE = 'rgb(200, 200, 200)';

/**
 * Draws `matrix` (timelinemodel.timelineMatrix or differenceMatrix) into `container`.
 *
 * @param {HTMLElement} container emptied and filled; it must be in the document (its width is read)
 * @param {object} matrix the rows, columns and colour range
 * @param {object} options `title`: the colour bar's (timelinelayout.colourTitle);
 *   `onSelect(layer, step)`: a click on a cell; `onZoom({start, end})`: a drag across steps
 * @returns {{canvas: HTMLCanvasElement, markOnsets: function(Array): number}} the canvas, and
 *   what marks /onset's onsets on it once they are in (those of its flags in its steps; it
 *   returns how many it marked)
 */
export function renderTimeline(container, matrix, {title, onSelect, onZoom}) {
  const rows = layout.rowLayout(matrix.rows.length);
  const columns = matrix.columns.first_step.length;
  const names = html('ol', {className: 'timeline-names', attrs: {'aria-label': 'Layers, in model order'}},
    matrix.rows.map((row, i) => html('li', {className: i % rows.labelEvery ? 'timeline-name quiet' : 'timeline-name',
      text: row.layer, attrs: {title: row.layer}})));
  const canvas = html('canvas', {className: 'timeline-canvas', attrs: {
    height: String(rows.height), 'data-rows': String(matrix.rows.length), 'data-columns': String(columns),
    role: 'img', 'aria-label': `${timelinemodel.FIELD_TITLES[matrix.field] ?? matrix.field} of ${matrix.rows.length} layers `
      + `over ${columns} columns of steps`,
  }});
  const marks = html('div', {className: 'timeline-marks'});
  const plot = html('div', {className: 'timeline-plot'}, [canvas, marks]);
  const scroller = html('div', {className: 'timeline-rows'}, [names, plot]);
  for (const element of [names, plot]) element.style.setProperty('--row-height', `${rows.rowHeight}px`);
  scroller.style.maxHeight = `${rows.viewport}px`;
  scroller.style.gridTemplateColumns = `${layout.NAMES_WIDTH}px minmax(0, 1fr)`;
  const axis = html('div', {className: 'timeline-axis-holder'});
  const legend = html('div', {className: 'timeline-legend'});
  const view = html('div', {className: 'timeline-view'}, [legend, scroller, axis]);
  container.replaceChildren(view);

  const width = Math.max(1, Math.floor(plot.clientWidth));
  canvas.width = width;
  canvas.style.height = `${rows.height}px`;
  const swatches = flagLegend(legend, matrix, title);
  draw(canvas, matrix, rows, flagColours(swatches));
  stepAxis(axis, matrix.columns, width);
  // The onsets marked so far, which the crosshair's reading names.
  const marked = [];
  followPointer({view, canvas, plot, names, matrix, onsets: marked, onSelect, onZoom});
  return {canvas, markOnsets: (onsets) => markOnsets(marks, matrix, rows, onsets, marked)};
}

// The legend: the colour bar with its title and ticks, the grey of no value, each flag's
// mark and the onset's. Returns the flags' swatches, whose colours the canvas takes.
function flagLegend(legend, matrix, title) {
  const swatches = {};
  const items = matrix.flags.map((flag) => {
    swatches[flag] = html('span', {className: `timeline-swatch flag-${flag}`});
    return html('li', {}, [swatches[flag], html('span', {text: FLAG_TITLES[flag] ?? flag})]);
  });
  legend.append(
    html('figure', {className: 'timeline-colourbar'}, [
      html('figcaption', {text: title}),
      colourBar(matrix),
    ]),
    html('ul', {className: 'timeline-key', attrs: {'aria-label': 'Marks'}}, [
      html('li', {}, [html('span', {className: 'timeline-swatch no-value'}), html('span', {text: 'no value'})]),
      ...items,
      html('li', {}, [html('span', {className: 'timeline-onset-key'}), html('span', {text: 'where a flag began'})]),
    ]),
  );
  return swatches;
}

function flagColours(swatches) {
  const colours = Object.fromEntries(Object.entries(swatches).map(([flag, swatch]) =>
    [flag, getComputedStyle(swatch).backgroundColor]));
  colours.background = getComputedStyle(document.body).backgroundColor;
  return colours;
}

function colourBar(matrix) {
  const {low, high, diverging, field} = matrix;
  const inner = BAR.width - BAR.left - BAR.right;
  const chart = svg('svg', {className: 'timeline-scale', attrs: {
    viewBox: `0 0 ${BAR.width} ${BAR.height}`, width: BAR.width, height: BAR.height, 'aria-hidden': 'true'}});
  const shade = inner / BAR.shades;
  for (let i = 0; i < BAR.shades; i++) {
    const value = low + ((i + 0.5) / BAR.shades) * (high - low);
    const [r, g, b] = timelinemodel.colourOf(value, low, high, diverging);
    chart.append(svg('rect', {attrs: {x: BAR.left + i * shade, y: 0, width: shade + 0.5, height: BAR.bar,
      fill: `rgb(${r}, ${g}, ${b})`}}));
  }
  chart.append(svg('rect', {className: 'frame', attrs: {x: BAR.left, y: 0, width: inner, height: BAR.bar}}));
  for (const {value, label} of layout.colourTicks(field, low, high, diverging)) {
    const x = BAR.left + ((value - low) / (high - low)) * inner;
    chart.append(
      svg('line', {className: 'axis', attrs: {x1: x, x2: x, y1: BAR.bar, y2: BAR.bar + 3}}),
      svg('text', {className: 'tick colour-tick', text: label, attrs: {x, y: BAR.bar + 14, 'text-anchor': 'middle'}}),
    );
  }
  return chart;
}

function draw(canvas, matrix, rows, colours) {
  const context = canvas.getContext('2d');
  const {width, height} = canvas;
  const count = matrix.rows.length;
  const columns = matrix.columns.first_step.length;
  if (count === 0 || columns === 0) return; // nothing to colour (timelinemodel.timelineView says why)
  const image = context.createImageData(width, height);
  // Each pixel takes the cell under it: one pass over the pixels, whatever the number of steps.
  const columnOfX = Array.from({length: width}, (_, x) => Math.min(columns - 1, Math.floor((x / width) * columns)));
  for (let r = 0; r < count; r++) {
    const row = matrix.rows[r];
    const line = columnOfX.map((c) => timelinemodel.colourOf(row.values[c], matrix.low, matrix.high, matrix.diverging)
      ?? [200, 200, 200]);
    for (let y = r * rows.rowHeight; y < (r + 1) * rows.rowHeight; y++) {
      for (let x = 0; x < width; x++) {
        const at = (y * width + x) * 4;
        image.data.set(line[x], at);
        image.data[at + 3] = 255;
      }
    }
  }
  context.putImageData(image, 0, 0);
  drawFlags(context, matrix, rows, colours, width);
}

// Each flag of a row in its lane from the top of the row (in the matrix' flags' order), over
// the columns that raise it, at least 3 pixels wide, with a rim of the page's colour so that
// it stands apart from the colours of the values.
function drawFlags(context, matrix, rows, colours, width) {
  const columns = matrix.columns.first_step.length;
  const lane = Math.max(3, Math.round(rows.rowHeight / 4));
  const xOf = (c) => (c * width) / columns;
  matrix.rows.forEach((row, r) => {
    const raised = matrix.flags.filter((flag) => row.flags.some((flags) => flags.includes(flag)));
    raised.forEach((flag, k) => {
      const y = r * rows.rowHeight + k * lane;
      if (y + lane > (r + 1) * rows.rowHeight) return; // no room left in the row: the crosshair names it
      for (let c = 0; c < columns; c++) {
        if (!row.flags[c].includes(flag)) continue;
        let end = c;
        while (end + 1 < columns && row.flags[end + 1].includes(flag)) end++;
        let [x0, x1] = [xOf(c), xOf(end + 1)];
        if (x1 - x0 < 3) [x0, x1] = [(x0 + x1) / 2 - 1.5, (x0 + x1) / 2 + 1.5];
        context.fillStyle = colours.background;
        context.fillRect(Math.floor(x0) - 1, y, Math.ceil(x1 - x0) + 2, lane + 1);
        context.fillStyle = colours[flag] ?? NO_VALUE;
        context.fillRect(Math.floor(x0), y, Math.ceil(x1 - x0), lane);
        c = end;
      }
    });
  });
}

// Each onset of a flag the drawing marks, in its steps: a diamond at its layer's row and its
// step, and a dashed line down the drawing at that step. Positions are shares of the width, so
// a resize keeps them. Adds them to `marked`; returns how many.
function markOnsets(marks, matrix, rows, onsets, marked) {
  marks.replaceChildren();
  marked.length = 0;
  const columns = matrix.columns;
  const first = columns.first_step[0];
  const last = columns.last_step.at(-1);
  const rowOf = new Map(matrix.rows.map((row, i) => [row.layer, i]));
  for (const onset of onsets) {
    const row = rowOf.get(onset.layer);
    if (row === undefined || !matrix.flags.includes(onset.flag) || onset.step < first || onset.step > last) continue;
    const left = `${(100 * layout.stepPosition(columns, onset.step)).toFixed(3)}%`;
    const text = `${FLAG_TITLES[onset.flag] ?? onset.flag} began at step ${onset.step} in ${onset.layer}`
      + (onset.tensor ? ` (${onset.tensor})` : '');
    const line = html('div', {className: `timeline-onset-line flag-${onset.flag}`});
    const mark = html('div', {className: `timeline-onset flag-${onset.flag}`, attrs: {
      title: text, role: 'img', 'aria-label': text, 'data-flag': onset.flag, 'data-step': onset.step,
      'data-layer': onset.layer}});
    line.style.left = left;
    mark.style.left = left;
    mark.style.top = `${(row + 0.5) * rows.rowHeight}px`;
    marks.append(line, mark);
    marked.push(onset);
  }
  return marked.length;
}

function stepAxis(holder, columns, width) {
  const box = charts.chartBox({width: layout.NAMES_WIDTH + width, height: AXIS_HEIGHT,
    left: layout.NAMES_WIDTH, right: 0, top: 0, bottom: AXIS_HEIGHT});
  const first = columns.first_step[0];
  const last = columns.last_step.at(-1);
  const chart = charts.chartFrame(box, {className: 'timeline-axis', label: `steps ${first} to ${last}`});
  chart.style.width = `${box.width}px`;
  const ticks = layout.stepTicks(columns, width).map(({step, x}) => ({step, x: layout.NAMES_WIDTH + x}));
  charts.stepAxis(chart, box, {first, last, ticks});
  holder.replaceChildren(chart);
}
