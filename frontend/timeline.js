// The depth x time view, drawn as a paper's heatmap: one row per layer (model
// order, each named at its left; past the view's height the rows scroll, and a
// note under them says which are shown, with buttons to the others), one column
// per column of /timeline (about one per pixel), coloured by the chosen field
// on a colour bar with its scale, flags as outlined marks in their colours
// (flags.css), each flag's onset (/onset) where it began and each warning's as
// a warning sign, and a step axis whose ticks are at steps that a column holds
// (stepaxis.js). The pointer's crosshair, its reading and the drag that zooms
// are timelinepointer.js'.

import {FLAG_TITLES} from './captions.js';
import * as charts from './charts.js';
import {html, svg} from './dom.js';
import {WARNING_TITLES} from './onset.js';
import * as layout from './timelinelayout.js';
import * as timelinemodel from './timelinemodel.js';
import {followPointer} from './timelinepointer.js';

const AXIS_HEIGHT = 36;
// The colour bar: its width and height, and how many steps of colour it is drawn in.
const BAR = {width: 320, height: 30, left: 12, right: 12, bar: 12, shades: 64};
const NO_VALUE = [200, 200, 200];
// A value that is not finite (NaN, ±Inf): stripes of these two, `NOT_FINITE_STRIPE` pixels wide
// (timeline.css' swatch draws the same).
const NOT_FINITE = [[60, 60, 60], [200, 200, 200]];
const NOT_FINITE_STRIPE = 2;
// Warning signs that began at one layer and step stand this far apart (CSS pixels).
const WARNING_SPACING = 12;

/**
 * Draws `matrix` (timelinemodel.timelineMatrix or differenceMatrix) into `container`.
 *
 * @param {HTMLElement} container emptied and filled; it must be in the document (its width is read)
 * @param {object} matrix the rows, columns and colour range
 * @param {object} options `title`: the colour bar's (timelinelayout.colourTitle);
 *   `onSelect(layer, step)`: a click on a cell; `onZoom({start, end})`: a drag across steps
 * @returns {{canvas: HTMLCanvasElement, markOnsets: function(Array): {flags: number, warnings: number}}}
 *   the canvas, and what marks /onset's onsets on it once they are in (those of its flags and
 *   warnings in its rows and steps; it returns how many of each it marked)
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
  const view = html('div', {className: 'timeline-view'}, [legend, scroller, axis,
    scrollNote(scroller, rows, matrix.rows.length)]);
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

// Under rows that scroll: which rows are shown, and a button to the rows above and below (a
// scroll bar alone may be hidden, as overlay scroll bars are). Nothing when every row shows.
function scrollNote(scroller, rows, count) {
  if (rows.height <= rows.viewport) return null;
  const text = html('span', {className: 'timeline-rows-shown'});
  const button = (label, direction) => {
    const element = html('button', {className: 'timeline-scroll', text: label, attrs: {type: 'button'}});
    element.addEventListener('click', () => scroller.scrollBy({top: direction * (rows.viewport - rows.rowHeight)}));
    return element;
  };
  const up = button('▲ Rows above', -1);
  const down = button('▼ Rows below', 1);
  const update = () => {
    const {first, last} = layout.rowsShown(rows, count, scroller.scrollTop);
    text.textContent = `Rows ${first}–${last} of ${count} shown: scroll them, or`;
    up.disabled = first <= 1;
    down.disabled = last >= count;
  };
  scroller.addEventListener('scroll', update, {passive: true});
  update();
  return html('p', {className: 'timeline-scroll-note'}, [text, up, down]);
}

// The legend: the colour bar with its title and ticks, the grey of no value and the stripes of a
// value that is not finite, each flag's mark, the onset's and the warning's. Returns the flags'
// swatches, whose colours the canvas takes.
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
      html('li', {}, [html('span', {className: 'timeline-swatch not-finite'}),
        html('span', {text: 'NaN / Inf value'})]),
      ...items,
      html('li', {}, [html('span', {className: 'timeline-onset-key'}), html('span', {text: 'where a flag began'})]),
      html('li', {}, [warningSign('timeline-warning-key'), html('span', {text: 'where a warning began'})]),
    ]),
  );
  return swatches;
}

// The canvas' colours, from the legend's swatches: each flag's, whether it is striped, the
// marks' outline and the page's background (their rim).
function flagColours(swatches) {
  const colours = {flags: {}, striped: new Set()};
  for (const [flag, swatch] of Object.entries(swatches)) {
    const style = getComputedStyle(swatch);
    colours.flags[flag] = style.backgroundColor;
    if (style.backgroundImage !== 'none') colours.striped.add(flag);
    colours.outline ??= style.borderTopColor;
  }
  colours.background = getComputedStyle(document.body).backgroundColor;
  colours.outline ??= 'rgb(0, 0, 0)';
  return colours;
}

/** A warning sign (an SVG triangle on a rim of the page's colour) in an element of `className`. */
function warningSign(className, attrs = {}) {
  const points = '7,1.5 12.5,11.5 1.5,11.5';
  return html('span', {className, attrs}, [svg('svg', {className: 'warning-sign',
    attrs: {viewBox: '0 0 14 13', width: 14, height: 13, 'aria-hidden': 'true'}}, [
    svg('polygon', {className: 'rim', attrs: {points}}),
    svg('polygon', {className: 'sign', attrs: {points}}),
  ])]);
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
      ?? (row.notFinite?.[c] ? null : NO_VALUE));
    for (let y = r * rows.rowHeight; y < (r + 1) * rows.rowHeight; y++) {
      for (let x = 0; x < width; x++) {
        const at = (y * width + x) * 4;
        image.data.set(line[x] ?? NOT_FINITE[Math.floor((x + y) / NOT_FINITE_STRIPE) % 2], at);
        image.data[at + 3] = 255;
      }
    }
  }
  context.putImageData(image, 0, 0);
  drawFlags(context, matrix, rows, colours, width);
}

// Each flag of a row in its lane from the top of the row (in the matrix' flags' order), over
// the columns that raise it, at least `MIN_MARK` pixels wide: its colour inside an outline,
// on a rim of the page's colour, so that it stands apart from the colours of the values
// whatever they are; a striped flag's colour is broken by the page's every third pixel.
const MIN_MARK = 5;
function drawFlags(context, matrix, rows, colours, width) {
  const columns = matrix.columns.first_step.length;
  const lane = Math.max(5, Math.round(rows.rowHeight / 2.4));
  const xOf = (c) => (c * width) / columns;
  matrix.rows.forEach((row, r) => {
    const raised = matrix.flags.filter((flag) => row.flags.some((flags) => flags.includes(flag)));
    raised.forEach((flag, k) => {
      const y = r * rows.rowHeight + k * (lane + 1);
      if (y + lane > (r + 1) * rows.rowHeight) return; // no room left in the row: the crosshair names it
      for (let c = 0; c < columns; c++) {
        if (!row.flags[c].includes(flag)) continue;
        let end = c;
        while (end + 1 < columns && row.flags[end + 1].includes(flag)) end++;
        let [x0, x1] = [xOf(c), xOf(end + 1)];
        if (x1 - x0 < MIN_MARK) [x0, x1] = [(x0 + x1) / 2 - MIN_MARK / 2, (x0 + x1) / 2 + MIN_MARK / 2];
        const [left, w] = [Math.round(x0), Math.max(MIN_MARK, Math.round(x1 - x0))];
        context.fillStyle = colours.background;
        context.fillRect(left - 1, y - (y > 0 ? 1 : 0), w + 2, lane + 2);
        context.fillStyle = colours.outline;
        context.fillRect(left, y, w, lane);
        context.fillStyle = colours.flags[flag] ?? `rgb(${NO_VALUE})`;
        context.fillRect(left + 1, y + 1, w - 2, lane - 2);
        if (colours.striped.has(flag)) {
          context.fillStyle = colours.background;
          for (let x = left + 3; x < left + w - 1; x += 3) context.fillRect(x, y + 1, 1, lane - 2);
        }
        c = end;
      }
    });
  });
}

// Each onset the drawing marks, in its rows and steps: a flag's as a diamond at its layer's row
// and its step with a dashed line down the drawing at that step, a warning's (`class`
// "warning") as a warning sign there, side by side when several began at one layer and step.
// Positions are shares of the width, so a resize keeps them. Adds them to `marked`; returns how
// many of each.
function markOnsets(marks, matrix, rows, onsets, marked) {
  marks.replaceChildren();
  marked.length = 0;
  const columns = matrix.columns;
  const first = columns.first_step[0];
  const last = columns.last_step.at(-1);
  const rowOf = new Map(matrix.rows.map((row, i) => [row.layer, i]));
  const counts = {flags: 0, warnings: 0};
  const signs = new Map(); // `${row} ${step}` -> the warning signs there
  for (const onset of onsets) {
    const row = rowOf.get(onset.layer);
    const warning = onset.class === 'warning';
    if (row === undefined || onset.step < first || onset.step > last) continue;
    if (!warning && !matrix.flags.includes(onset.flag)) continue;
    const left = `${(100 * layout.stepPosition(columns, onset.step)).toFixed(3)}%`;
    const name = warning ? `Warning ${WARNING_TITLES[onset.flag] ?? onset.flag}` : FLAG_TITLES[onset.flag] ?? onset.flag;
    const text = `${name} began at step ${onset.step} in ${onset.layer}` + (onset.tensor ? ` (${onset.tensor})` : '');
    const attrs = {title: text, role: 'img', 'aria-label': text, 'data-flag': onset.flag, 'data-step': onset.step,
      'data-layer': onset.layer};
    const mark = warning ? warningSign('timeline-warning', attrs)
      : html('div', {className: `timeline-onset flag-${onset.flag}`, attrs});
    mark.style.left = left;
    mark.style.top = `${(row + 0.5) * rows.rowHeight}px`;
    if (warning) {
      const key = `${row} ${onset.step}`;
      signs.set(key, [...(signs.get(key) ?? []), mark]);
    } else {
      const line = html('div', {className: `timeline-onset-line flag-${onset.flag}`});
      line.style.left = left;
      marks.append(line);
    }
    marks.append(mark);
    marked.push(onset);
    counts[warning ? 'warnings' : 'flags']++;
  }
  for (const marks of signs.values()) {
    marks.forEach((mark, k) => {
      mark.style.marginLeft = `${(k - (marks.length - 1) / 2) * WARNING_SPACING}px`;
    });
  }
  return counts;
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
